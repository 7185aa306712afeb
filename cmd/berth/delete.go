package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newDeleteCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete service NAME",
		RunE:  groupRunE,
		Short: "Delete an object",
	}
	var expected int64
	svc := &cobra.Command{
		Use:     "service NAME",
		Aliases: []string{"svc", "services"},
		Short:   "Delete a service; its workloads are stopped, then it is removed",
		Long: `service deletes one service of the project. The service is marked deleting at
once: its routes are withdrawn and it accepts no writes. Its workloads are then
stopped and removed by the nodes, and the service disappears once every node
acknowledged that (berth get services shows it as deleting until then). With
--expected-revision the delete happens only if the stored revision is still
that one.`,
		Example: `  berth delete service hello
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
			if cur, err := c.GetService(cmd.Context(), s.Project, args[0]); err == nil {
				for _, v := range cur.Volumes {
					kept = append(kept, v.Name)
				}
			}
			if err := c.DeleteService(cmd.Context(), s.Project, args[0], rev); err != nil {
				return fmt.Errorf("delete service %s/%s: %w", s.Project, args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, struct {
					Project     string   `json:"project"`
					Service     string   `json:"service"`
					Deleting    bool     `json:"deleting"`
					VolumesKept []string `json:"volumes_kept"`
				}{s.Project, args[0], true, append([]string{}, kept...)})
			}
			fmt.Fprintf(a.stdout, "service %s/%s deleting: its workloads stop, then it is removed\n", s.Project, args[0])
			if len(kept) > 0 {
				fmt.Fprintf(a.stdout, "its volumes (%s) are kept on the nodes that ran it\n", strings.Join(kept, ", "))
			}
			return nil
		},
	}
	svc.Flags().Int64Var(&expected, "expected-revision", 0, "delete only if the service's revision is this one")
	cmd.AddCommand(svc)
	return cmd
}
