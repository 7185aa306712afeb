package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newNodeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node remove|retire|lost|fence-ack|metrics|upgrade|rotate-key|set-capacity|cordon|uncordon|drain ID",
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
	cmd.AddCommand(remove, newNodeRetireCmd(a), newNodeLostCmd(a), newNodeFenceAckCmd(a), newNodeMetricsCmd(a), newNodeUpgradeCmd(a), newNodeRotateKeyCmd(a),
		newNodeSetCapacityCmd(a), newNodeCordonCmd(a, true), newNodeCordonCmd(a, false), newNodeDrainCmd(a))
	return cmd
}

func newNodeRetireCmd(a *app) *cobra.Command {
	var disposition string
	var deleteMachine bool
	cmd := &cobra.Command{
		Use:   "retire NODE_ID [--disposition withdrawn|lost]",
		Short: "Retire a node from placement; its replicas move to other nodes",
		Long: `retire takes the node out of placement for good: nothing new is placed on
it, and the replicas it holds are placed elsewhere (docs/reconciliation.md
section 5). How its slots are let go depends on --disposition:

  withdrawn  (default) the node is still there: its slots are stopped and
             removed against the node's own receipts, as any stop is, and the
             node is retired once nothing is owed ("retiring", waiting on
             slot-settlement-pending, until then). A node that never answers
             keeps this waiting.
  lost       the node is gone: its slots are released at once, without
             receipts. Refused with node_still_reporting while the node still
             reports; make sure it is powered off or cut off first, or its
             workloads would run twice.

The answer shows the retirement's state (retiring or retired), what it waits
on, and how many slots it covers. Also refused with node_not_found and
node_already_retired. With --delete-machine, the server of the machine bound
to the node is deleted once the retirement is recorded (docs/machines.md).`,
		Example: `  berth node retire nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --delete-machine
  berth node retire nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --disposition lost`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch disposition {
			case "withdrawn", "lost":
			default:
				return fmt.Errorf("--disposition %q: want withdrawn or lost", disposition)
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.RetireNode(cmd.Context(), args[0], disposition)
			if err != nil {
				return fmt.Errorf("retire node %s (%s): %w", args[0], disposition, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			wait := ""
			if out.Wait != "" {
				wait = ", waiting on " + out.Wait
			}
			fmt.Fprintf(a.stdout, "node %s %s (%s)%s, %d slot(s)\n", args[0], out.State, orDash(out.Disposition), wait, out.Slots)
			if deleteMachine {
				ms, err := c.ListMachines(cmd.Context())
				if err != nil {
					return fmt.Errorf("find the machine of node %s: %w", args[0], err)
				}
				for _, m := range ms {
					if m.NodeID == args[0] && m.State != "deleted" {
						if _, err := c.DeleteMachine(cmd.Context(), m.ID); err != nil {
							return fmt.Errorf("delete machine %s of node %s: %w", m.ID, args[0], err)
						}
						fmt.Fprintf(a.stdout, "machine %s deleting\n", m.ID)
						return nil
					}
				}
				return fmt.Errorf("--delete-machine: no machine is bound to node %s", args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&disposition, "disposition", "withdrawn", "withdrawn (stop and remove its slots first) or lost (release them at once)")
	cmd.Flags().BoolVar(&deleteMachine, "delete-machine", false, "also delete the server of the machine bound to the node")
	return cmd
}

func newNodeLostCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "lost ID",
		Short: "Declare a node lost: its stateful services may start elsewhere",
		Long: `lost declares that the node is gone and runs nothing any more (docs/api.md
"Leases"): every lease it holds is freed under a higher fencing token, so its
stateful services start on another node at once, and any write the node still
makes with its old token is refused. Declare a node lost only after making
sure it is powered off or cut off: a lost node that still runs would run a
stateful service twice. Needs the human-only scope node:remove.`,
		Example: `  berth node lost nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			out, err := c.NodeLost(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("declare node %s lost: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Node %s declared lost; %d lease(s) superseded.\n", args[0], len(out.Leases))
			for _, l := range out.Leases {
				fmt.Fprintf(a.stdout, "  %s (%s) now at token %d, free\n", l.LeaseID, l.ResourceID, l.FencingToken)
			}
			return nil
		},
	}
}

func newNodeFenceAckCmd(a *app) *cobra.Command {
	var leases []string
	cmd := &cobra.Command{
		Use:   "fence-ack ID --lease LEASE_ID...",
		Short: "Acknowledge a node's failed self-fences after checking them by hand",
		Long: `fence-ack clears a node's failed fences (docs/node-protocol.md section 8.5).
A failed fence means the node could not confirm that a stateful workload
stopped, so its lease is granted to no node. Check out of band that the
workloads are stopped (for example by power-cycling the machine), then list
exactly the outstanding leases ('berth get leases' and
'berth node fence-ack ID' without --lease show them). Their leases get a
higher fencing token and may be granted again; the node is told at once, or
at its next session. Needs the human-only scope node:fence_ack.`,
		Example: `  berth node fence-ack nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --lease lse_01JC9Z8K2M4P6R8T0V2X4Z6B8D`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if len(leases) == 0 {
				st, err := c.NodeFence(cmd.Context(), args[0])
				if err != nil {
					return fmt.Errorf("read fence state of node %s: %w", args[0], err)
				}
				if a.output == outputJSON {
					return printJSON(a.stdout, st)
				}
				if len(st.FenceFailure) == 0 {
					fmt.Fprintf(a.stdout, "Node %s has no failed fence to acknowledge.\n", args[0])
					return nil
				}
				fmt.Fprintf(a.stdout, "Failed fences of node %s (acknowledge all of them with --lease):\n", args[0])
				for _, f := range st.FenceFailure {
					fmt.Fprintf(a.stdout, "  %s token %d, workloads %v, %s\n", f.LeaseID, f.FencingToken, f.WorkloadIDs, orDash(f.Detail))
				}
				return nil
			}
			out, err := c.FenceAck(cmd.Context(), args[0], leases)
			if err != nil {
				return fmt.Errorf("acknowledge failed fences of node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "Acknowledged %d failed fence(s) of node %s; the leases may be granted again.\n", len(out.Leases), args[0])
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&leases, "lease", nil, "a lease id whose failed fence you verified (repeat, or comma-separated)")
	return cmd
}
