package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// drainPoll is how often berth node drain asks for the drain's progress while it waits.
const drainPoll = 2 * time.Second

func newNodeSetCapacityCmd(a *app) *cobra.Command {
	var req client.NodeCapacityRequest
	var extended []string
	cmd := &cobra.Command{
		Use:   "set-capacity ID [--cpu-m N] [--memory-mib N] [--disk-mib N] [--extended NAME=N]... | --clear",
		Short: "Override what a node offers to placement",
		Long: `set-capacity replaces what the node's agent reports it can give to
workloads (its allocatable CPU in millicores, memory and disk for volumes in
MiB, and extended resources such as gpu) with the operator's numbers. Each
flag given replaces that field; a field not given (or 0) keeps what the agent
reports. --extended NAME=N replaces that extended resource, 0 included (hide a
reported gpu with --extended gpu=0). The override replaces an earlier one as a
whole; --clear removes it. berth describe node shows the reported, the override
and the merged figures; berth get nodes shows the merged ones. Needs scope admin.`,
		Example: `  berth node set-capacity nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --cpu-m 6000 --memory-mib 28672
  berth node set-capacity nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --extended gpu=2
  berth node set-capacity nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --clear`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, e := range extended {
				name, val, ok := strings.Cut(e, "=")
				n, err := strconv.ParseInt(val, 10, 64)
				if !ok || name == "" || err != nil || n < 0 {
					return fmt.Errorf("--extended %q: want NAME=N with N a whole number from 0, e.g. gpu=2", e)
				}
				if req.Extended == nil {
					req.Extended = map[string]int64{}
				}
				req.Extended[name] = n
			}
			if req.CPUMilli < 0 || req.MemoryMiB < 0 || req.DiskMiB < 0 {
				return errors.New("--cpu-m, --memory-mib and --disk-mib must not be negative")
			}
			if !req.Clear && req.CPUMilli == 0 && req.MemoryMiB == 0 && req.DiskMiB == 0 && len(req.Extended) == 0 {
				return errors.New("say what to override (--cpu-m, --memory-mib, --disk-mib, --extended) or --clear")
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			n, err := c.SetNodeCapacity(cmd.Context(), args[0], req)
			if err != nil {
				return fmt.Errorf("set capacity of node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, n)
			}
			fmt.Fprintf(a.stdout, "node %s offers %s\n", n.ID, resourcesText(n.Schedulable))
			return nil
		},
	}
	f := cmd.Flags()
	f.Int64Var(&req.CPUMilli, "cpu-m", 0, "CPU in thousandths of a CPU (1000 = one CPU); 0 keeps what the node reports")
	f.Int64Var(&req.MemoryMiB, "memory-mib", 0, "memory in MiB; 0 keeps what the node reports")
	f.Int64Var(&req.DiskMiB, "disk-mib", 0, "disk for volumes in MiB; 0 keeps what the node reports")
	f.StringArrayVar(&extended, "extended", nil, "an extended resource NAME=N (repeatable); N=0 hides a reported one")
	f.BoolVar(&req.Clear, "clear", false, "remove the override: the node offers what its agent reports")
	return cmd
}

func newNodeCordonCmd(a *app, on bool) *cobra.Command {
	use, short, long := "cordon ID", "Stop new placements on a node",
		`cordon stops new placements on the node: no new replica, job or lease lands
on it, and what runs there keeps running. berth node uncordon returns it.
Idempotent. Needs scope admin.`
	if !on {
		use, short, long = "uncordon ID", "Return a cordoned or draining node to placement",
			`uncordon returns the node to placement: new replicas may land on it again,
and a drain in progress ends (replicas already moved stay where they are).
Idempotent. Needs scope admin.`
	}
	return &cobra.Command{
		Use: use, Short: short, Long: long,
		Example: "  berth node " + strings.Fields(use)[0] + " nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			var n *client.Node
			if on {
				n, err = c.CordonNode(cmd.Context(), args[0])
			} else {
				n, err = c.UncordonNode(cmd.Context(), args[0])
			}
			if err != nil {
				return fmt.Errorf("%s node %s: %w", strings.Fields(use)[0], args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, n)
			}
			if on {
				fmt.Fprintf(a.stdout, "node %s cordoned: nothing new is placed on it\n", n.ID)
			} else {
				fmt.Fprintf(a.stdout, "node %s uncordoned: it takes new placements again\n", n.ID)
			}
			return nil
		},
	}
}

func newNodeDrainCmd(a *app) *cobra.Command {
	var deadline time.Duration
	var detach bool
	cmd := &cobra.Command{
		Use:   "drain ID [--deadline 10m] [--detach]",
		Short: "Move a node's replicas and leases to other nodes before maintenance",
		Long: `drain cordons the node and marks it draining: the rollout moves each of its
scheduled replicas to another node within the service's rollout bounds, and the
lease of each stateful service it holds is handed over in order (the node stops
the workload and gives the lease back, then it is granted elsewhere). Replicas
of every-node and pinned services stay: they belong to the node.

Without --detach the command waits, printing what remains, until nothing is
left (drained) or --deadline passes (it then exits non-zero and the drain goes
on). The deadline is recorded on the node; berth get nodes shows a drain past
it as late. berth node uncordon ends the drain. Needs scope admin.`,
		Example: `  berth node drain nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP
  berth node drain nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --deadline 10m
  berth node drain nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --detach -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if deadline < 0 {
				return errors.New("--deadline must not be negative")
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			n, err := c.DrainNode(ctx, args[0], client.NodeDrainRequest{DeadlineS: int64((deadline + time.Second - 1) / time.Second)})
			if err != nil {
				return fmt.Errorf("drain node %s: %w", args[0], err)
			}
			last := ""
			for {
				if detach || n.Drain == nil || n.Drain.State != "draining" {
					break
				}
				if text := drainText(n); text != last && a.output != outputJSON {
					fmt.Fprint(a.stdout, text)
					last = text
				}
				if n.Drain.Late {
					return fmt.Errorf("drain node %s: the deadline passed with %d item(s) left; the drain goes on (berth get nodes)", n.ID, len(n.Drain.Remaining))
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(drainPoll):
				}
				if n, err = c.GetNode(ctx, args[0]); err != nil {
					return fmt.Errorf("read the drain of node %s: %w", args[0], err)
				}
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, n)
			}
			switch {
			case n.Drain == nil:
				fmt.Fprintf(a.stdout, "node %s is no longer draining (uncordoned)\n", n.ID)
			case n.Drain.State == "drained":
				fmt.Fprintf(a.stdout, "node %s drained: nothing left to move\n", n.ID)
			default:
				fmt.Fprint(a.stdout, drainText(n))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&deadline, "deadline", 0, "how long the drain should take (e.g. 10m); 0 sets none")
	cmd.Flags().BoolVar(&detach, "detach", false, "start the drain and return at once")
	return cmd
}

// drainText is a draining node's progress: one line, then one line per item left.
func drainText(n *client.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s draining: %d left\n", n.ID, len(n.Drain.Remaining))
	for _, it := range n.Drain.Remaining {
		switch it.Kind {
		case "lease":
			fmt.Fprintf(&b, "  lease    %s %s\n", it.Service, it.LeaseID)
		default:
			fmt.Fprintf(&b, "  replica  %s/%s %s\n", it.Service, it.Replica, it.WorkloadID)
		}
	}
	return b.String()
}

// resourcesText is r as one line: "cpu 4000m, memory 7680 MiB, disk 51200 MiB, gpu=1"; "-" when
// it states nothing.
func resourcesText(r client.Resources) string {
	var parts []string
	if r.CPUMilli > 0 {
		parts = append(parts, fmt.Sprintf("cpu %dm", r.CPUMilli))
	}
	if r.MemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf("memory %d MiB", r.MemoryMiB))
	}
	if r.DiskMiB > 0 {
		parts = append(parts, fmt.Sprintf("disk %d MiB", r.DiskMiB))
	}
	for _, k := range slices.Sorted(maps.Keys(r.Extended)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Extended[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// nodeStatusText is the STATUS cell of a node: its status, with cordoned, a late drain and a
// retirement said.
func nodeStatusText(n client.Node) string {
	status := n.Status
	switch {
	case n.Drain != nil && n.Drain.State == "drained":
		status = "drained"
	case n.Drain != nil && n.Drain.Late:
		status += " (late)"
	case n.Drain == nil && n.Cordoned:
		status += ",cordoned"
	}
	if n.Retirement != "" && n.Status != "removed" {
		status += " (retiring: " + n.Retirement + ")"
	}
	return status
}

// describeNode prints one node in detail.
func describeNode(w io.Writer, n *client.Node, since func(time.Time) string) {
	seen := "never"
	if n.LastSeenAt != nil {
		seen = since(*n.LastSeenAt) + " ago"
	}
	kv := func(k string, v any) { fmt.Fprintf(w, "%-18s %v\n", k+":", v) }
	kv("ID", n.ID)
	kv("Hostname", n.Hostname)
	kv("Status", nodeStatusText(*n))
	kv("Session", orDash(n.Session))
	kv("Region", orDash(n.Region))
	kv("Address", orDash(n.Address))
	if len(n.Labels) > 0 {
		var ls []string
		for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
			ls = append(ls, k+"="+n.Labels[k])
		}
		kv("Labels", strings.Join(ls, ","))
	}
	kv("Agent", orDash(n.AgentVersion))
	kv("Last seen", seen)
	kv("Workloads", n.Workloads)
	kv("Applied/desired", fmt.Sprintf("%d/%d", n.AppliedRev, n.DesiredRev))
	kv("Allocatable", resourcesText(n.Allocatable))
	if n.CapacityOverride != nil {
		kv("Override", resourcesText(*n.CapacityOverride))
	}
	kv("Schedulable", resourcesText(n.Schedulable))
	kv("Limits", orDash(n.ResourceLimits))
	kv("Cordoned", n.Cordoned)
	if d := n.Drain; d != nil {
		dl := "none"
		if d.Deadline != nil {
			dl = d.Deadline.Local().Format(time.RFC3339)
		}
		kv("Drain", fmt.Sprintf("%s since %s, deadline %s", d.State, d.StartedAt.Local().Format(time.RFC3339), dl))
		if len(d.Remaining) > 0 {
			fmt.Fprint(w, strings.SplitN(drainText(n), "\n", 2)[1])
		}
	}
}

func newDescribeNodeCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "node ID",
		Aliases: []string{"no"},
		Short:   "Show a node: capacity, limits, cordon and drain",
		Long: `node shows one enrolled node: its session, labels, what its agent reports it
can give to workloads (allocatable), the operator's override, the merged
figures placement reads (schedulable), how it enforces workload limits, and
its cordon and drain with what remains to move. With -o json it prints the
node as the API answers it.`,
		Example: `  berth describe node nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			n, err := c.GetNode(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("get node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, n)
			}
			describeNode(a.stdout, n, a.since)
			return nil
		},
	}
}

// cpuText is a CPU amount in millicores as a table cell: "4000m", "-" when unknown.
func cpuText(m int64) string {
	if m <= 0 {
		return "-"
	}
	return strconv.FormatInt(m, 10) + "m"
}

// memText is a memory amount in MiB as a table cell: "7680Mi", "-" when unknown.
func memText(mib int64) string {
	if mib <= 0 {
		return "-"
	}
	return strconv.FormatInt(mib, 10) + "Mi"
}
