package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newDeleteCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete service NAME",
		RunE:  groupRunE,
		Short: "Delete an object",
	}
	var expected int64
	var purge bool
	svc := &cobra.Command{
		Use:     "service NAME",
		Aliases: []string{"svc", "services", "job"},
		Short:   "Delete a service (or a job: delete job NAME); its workloads are stopped, then it is removed",
		Long: `service deletes one service of the project. The service is marked deleting at
once: its routes are withdrawn and it accepts no writes. "delete job NAME"
refuses a name that is a service (and "delete service" of a job says job). Its workloads are then
stopped and removed by the nodes, and the service disappears once every node
acknowledged that (berth get services shows it as deleting until then). With
--expected-revision the delete happens only if the stored revision is still
that one.

Its volumes are kept on the nodes unless --purge-volumes is given: then each
node that holds a workload of the service removes the service's volume
directories once the workload is gone, before it acknowledges the removal.`,
		Example: `  berth delete service hello
  berth delete job nightly-report
  berth delete service db --purge-volumes
  berth delete service hello --project shop --expected-revision 4`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			var rev *int64
			if cmd.Flags().Changed("expected-revision") {
				rev = &expected
			}
			var kept []string // read before the delete, to say which volumes stay
			noun := "service"
			if cur, err := c.GetService(cmd.Context(), s.Project, args[0]); err == nil {
				for _, v := range cur.Volumes {
					kept = append(kept, v.Name)
				}
				switch {
				case cur.Kind == "job":
					noun = "job"
				case cmd.CalledAs() == "job":
					return fmt.Errorf("%s/%s is a service, not a job: berth delete service %s", s.Project, args[0], args[0])
				}
			}
			var opts []client.DeleteOption
			if purge {
				opts = append(opts, client.WithPurgeVolumes())
			}
			if err := c.DeleteService(cmd.Context(), s.Project, args[0], rev, opts...); err != nil {
				return fmt.Errorf("delete %s %s/%s: %w", noun, s.Project, args[0], err)
			}
			purged := []string{}
			if purge {
				kept, purged = nil, append(purged, kept...)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, struct {
					Project       string   `json:"project"`
					Service       string   `json:"service"`
					Deleting      bool     `json:"deleting"`
					VolumesKept   []string `json:"volumes_kept"`
					VolumesPurged []string `json:"volumes_purged"`
				}{s.Project, args[0], true, append([]string{}, kept...), purged})
			}
			what := "its workloads stop"
			if noun == "job" {
				what = "its running runs stop"
			}
			fmt.Fprintf(a.stdout, "%s %s/%s deleting: %s, then it is removed\n", noun, s.Project, args[0], what)
			switch {
			case len(kept) > 0:
				fmt.Fprintf(a.stdout, "its volumes (%s) are kept on the nodes that ran it; --purge-volumes removes them\n", strings.Join(kept, ", "))
			case len(purged) > 0:
				fmt.Fprintf(a.stdout, "its volumes (%s) are removed from the nodes that hold its workloads\n", strings.Join(purged, ", "))
			}
			return nil
		},
	}
	svc.Flags().Int64Var(&expected, "expected-revision", 0, "delete only if the service's revision is this one")
	svc.Flags().BoolVar(&purge, "purge-volumes", false, "remove the service's volumes from the nodes too (kept otherwise)")
	cmd.AddCommand(svc)
	return cmd
}
