package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newPlacementExplainCmd(a *app) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "explain [PROJECT/]SERVICE",
		Short: "Show, per replica, the nodes considered and why each was taken or refused",
		Long: `explain asks the decider, over the nodes and workloads as they are now, where
each replica of the service stands or would go (docs/placement.md section 6).

For each replica it prints where it stands ("stands on"), where the next
sweep puts it ("goes to"), or why it fits nowhere ("unplaceable: ..."), then
one line per node: the node taken, the feasible nodes it outranked with their
rank (replicas in the spread domain, preferences matched, load after), and the
refused nodes with the reason code (unavailable, cordoned, region,
node_selector, endpoint, anti_affinity, max_per_node, capacity) and text.
Without --all only the first 10 nodes of each replica are printed.
With -o json it prints the whole explanation as JSON.`,
		Example: `  berth placement explain web
  berth placement explain shop/web --all
  berth placement explain shop/web -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			ex, err := c.Placement(cmd.Context(), project, name)
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ex)
			}
			if ex.Note != "" {
				fmt.Fprintf(a.stdout, "%s: %s\n", ex.Service, ex.Note)
			}
			if len(ex.Replicas) == 0 {
				fmt.Fprintf(a.stdout, "%s: no replicas to place\n", ex.Service)
				return nil
			}
			for _, r := range ex.Replicas {
				switch {
				case r.NodeID == "":
					fmt.Fprintf(a.stdout, "replica %s: unplaceable: %s\n", r.Replica, r.Reason)
				case r.Standing && len(r.Considered) > 0 && r.Considered[0].Code == "taken" && r.Considered[0].NodeID != r.NodeID:
					fmt.Fprintf(a.stdout, "replica %s: stands on %s (placed afresh it would go to %s; running replicas are not moved for rank)\n",
						r.Replica, r.NodeID, r.Considered[0].NodeID)
				case r.Standing:
					fmt.Fprintf(a.stdout, "replica %s: stands on %s\n", r.Replica, r.NodeID)
				default:
					fmt.Fprintf(a.stdout, "replica %s: goes to %s\n", r.Replica, r.NodeID)
				}
				tw := newTable(a.stdout)
				fmt.Fprintln(tw, "  NODE\tVERDICT\tWHY")
				for i, v := range r.Considered {
					if i == 10 && !all {
						fmt.Fprintf(tw, "  ...\t\t%d more nodes (--all shows them)\n", len(r.Considered)-i)
						break
					}
					fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.NodeID, v.Code, v.Text)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "print every node of each replica, not only the first 10")
	return cmd
}
