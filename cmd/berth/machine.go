package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newMachineCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "machine create|ls|delete",
		RunE:  groupRunE,
		Short: "Create, list and delete cloud machines that enroll themselves as nodes",
	}
	var req client.MachineRequest
	var labels []string
	create := &cobra.Command{
		Use:   "create --provider hetzner --type cx22 --location fsn1 [--image ubuntu-24.04] [--labels k=v,...]",
		Short: "Create a cloud server that sets itself up as a node",
		Long: `create records a machine and enqueues its creation as a durable operation
(docs/machines.md): the provider plugin creates the server with a join code
for it in its cloud-init user data, the server runs the setup script and
enrolls, and the machine is bound to its node. A node that does not enroll
in time (15 min by default) gets its server deleted and the machine failed
with the reason. The node gets --labels and berth-machine=<machine id>.
It returns at once; follow the machine with berth machine ls.`,
		Example: `  berth machine create --provider hetzner --type cx22 --location fsn1 --labels role=web`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			m, err := c.CreateMachine(cmd.Context(), req)
			if err != nil {
				return fmt.Errorf("create machine: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, m)
			}
			fmt.Fprintf(a.stdout, "machine %s %s (operation %s); its node must enroll by %s\n", m.ID, m.State, m.Operation, m.JoinBy.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&req.Provider, "provider", "hetzner", "machine provider")
	f.StringVar(&req.Type, "type", "", "server type, e.g. cx22 (required)")
	f.StringVar(&req.Location, "location", "", "location, e.g. fsn1 (required)")
	f.StringVar(&req.Image, "image", "", "image (default ubuntu-24.04)")
	f.StringArrayVar(&labels, "labels", nil, "labels of the node, key=value[,key=value] (repeatable)")
	_ = create.MarkFlagRequired("type")
	_ = create.MarkFlagRequired("location")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List machines: provider, type, location, state, node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ms, err := c.ListMachines(cmd.Context())
			if err != nil {
				return fmt.Errorf("list machines: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ms)
			}
			tw := newTable(a.stdout)
			fmt.Fprintln(tw, "ID\tPROVIDER\tTYPE\tLOCATION\tSTATE\tNODE\tSTATUS\tCREATED")
			for _, m := range ms {
				status := m.Status
				if m.LastError != "" {
					status = m.LastError
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Provider, m.Type, m.Location, m.State, orDash(m.NodeID), orDash(status), m.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a machine's server (retire its node first: berth node retire ID --delete-machine)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			m, err := c.DeleteMachine(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("delete machine %s: %w", args[0], err)
			}
			fmt.Fprintf(a.stdout, "machine %s %s\n", m.ID, m.State)
			return nil
		},
	}
	cmd.AddCommand(create, ls, del)
	return cmd
}

// parseLabels reads repeated --labels values, each key=value[,key=value], into one map; nil when
// none is given. A pair without '=' or with an empty key is refused naming the flag value.
func parseLabels(values []string) (map[string]string, error) {
	var labels map[string]string
	for _, l := range values {
		for _, kv := range strings.Split(l, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--labels %q: want key=value[,key=value]", l)
			}
			if labels == nil {
				labels = map[string]string{}
			}
			labels[k] = v
		}
	}
	return labels, nil
}
