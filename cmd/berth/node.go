package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newNodeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node remove ID",
		RunE:  groupRunE,
		Short: "Manage enrolled nodes",
	}
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a node from the cluster for good",
		Long: `remove marks the node removed (docs/node-protocol.md section 10): its session
ends with a fatal node_removed, its credential stops working, and the core
places its workloads elsewhere. The agent on that machine stops dialling and
leaves its workloads running: nothing on the node is destroyed remotely.
To use the machine again, enroll it anew with a new join token.
Needs the human-only scope node:remove.`,
		Example: `  berth node remove nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if err := c.RemoveNode(cmd.Context(), args[0]); err != nil {
				return fmt.Errorf("remove node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, map[string]any{"node_id": args[0], "status": "removed"})
			}
			fmt.Fprintf(a.stdout, "Node %s removed; its workloads move to other nodes, and the agent stops dialling.\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(remove)
	return cmd
}
