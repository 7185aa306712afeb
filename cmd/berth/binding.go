package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// newGetBindingsCmd is `berth get bindings [SERVICE]`.
func newGetBindingsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "bindings [SERVICE]",
		Aliases: []string{"binding"},
		Short:   "List the databases and buckets services bind",
		Long: `bindings lists the project's service bindings (docs/bindings.md): kind, state
(pending, ready, failed, released, purged), the service that uses it now (USED-BY
"nothing" once its service is deleted or no longer declares it: the binding and
its data stay until 'berth binding delete'), the credential-free endpoint, the
database or bucket, whether it has a user of its own (USERS "unsupported" where
the server cannot make one), and the reason of the last failure. The
credentials themselves are secrets of the service and never shown.`,
		Example: `  berth get bindings
  berth get bindings web -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			svc := ""
			if len(args) == 1 {
				svc = args[0]
			}
			items, err := c.ListServiceBindings(cmd.Context(), s.Project, svc)
			if err != nil {
				return fmt.Errorf("list bindings of %s: %w", s.Project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, items)
			}
			svcs, err := c.ListServices(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list services of %s: %w", s.Project, err)
			}
			declared := map[[2]string]bool{}
			for _, sv := range svcs {
				for _, bs := range sv.Bindings {
					declared[[2]string{sv.Name, bs.Name}] = true
				}
			}
			tw := newTable(a.stdout)
			row(tw, "SERVICE", "NAME", "KIND", "STATE", "USED-BY", "ENDPOINT", "DATABASE", "USERS", "LAST-ERROR")
			for _, b := range items {
				usedBy := "nothing"
				if declared[[2]string{b.Service, b.Name}] {
					usedBy = b.Service
				}
				row(tw, b.Service, b.Name, b.Kind, b.State, usedBy, orDash(b.Endpoint), orDash(b.Database), orDash(b.Users), orDash(oneLine(b.LastError)))
			}
			return tw.Flush()
		},
	}
}

// oneLine keeps a table cell on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// newBindingCmd is `berth binding delete`.
func newBindingCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "binding", RunE: groupRunE, Short: "Release or purge a service's bindings"}
	var purge bool
	del := &cobra.Command{
		Use:   "delete SERVICE NAME",
		Short: "Release a binding the service no longer declares, or drop its data with --purge",
		Long: `delete releases binding NAME of SERVICE once the service no longer declares it:
the database or bucket and its data are kept (berthd refuses while the service
still declares it). With --purge the data is dropped by an operation fenced by
the project's fence sequence; 'berth get operations' shows it.`,
		Example: `  berth binding delete web db
  berth binding delete web db --purge`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			b, err := c.DeleteServiceBinding(cmd.Context(), s.Project, args[0], args[1], purge)
			if err != nil {
				return fmt.Errorf("delete binding %s of %s: %w", args[1], args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, b)
			}
			if purge {
				fmt.Fprintf(a.stdout, "Binding %s of %s: purge queued (operation %s); its data will be dropped.\n", b.Name, b.Service, b.OperationID)
			} else {
				fmt.Fprintf(a.stdout, "Binding %s of %s released; its data is kept (delete it with --purge).\n", b.Name, b.Service)
			}
			return nil
		},
	}
	del.Flags().BoolVar(&purge, "purge", false, "drop the database or bucket and its data")
	cmd.AddCommand(del)
	return cmd
}

// newGetOperationsCmd is `berth get operations`: the project's durable operations, binding work
// among them.
func newGetOperationsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "operations",
		Aliases: []string{"operation", "ops"},
		Short:   "List the project's operations (binding work, runner work)",
		Long: `operations lists the project's durable operations, oldest first: kind (for
bindings binding.apply, binding.release, binding.purge), state (queued, leased,
retry, succeeded, failed), attempts, the fence of the latest claim, the claimer
and the last error. Binding operations are claimed by berthd itself
(core:bindings), never by a runner.`,
		Example: `  berth get operations
  berth get ops -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ops, err := c.ListOperations(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list operations of %s: %w", s.Project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ops)
			}
			tw := newTable(a.stdout)
			row(tw, "ID", "KIND", "STATE", "ATTEMPTS", "FENCE", "TARGET", "LAST-ERROR")
			for _, o := range ops {
				row(tw, o.ID, o.Kind, o.State, o.Attempts, o.Fence, orDash(o.TargetNode), orDash(oneLine(o.LastError)))
			}
			return tw.Flush()
		},
	}
}
