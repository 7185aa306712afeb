package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/node"
)

func newLogsCmd(a *app) *cobra.Command {
	var tail int
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs WORKLOAD_ID",
		Short: "Show a workload's output, read from its node",
		Long: `logs asks the node that runs the workload for its newest output
(docs/node-protocol.md section 5.17). With --follow it keeps the stream open
and prints new lines as they come until you press Ctrl-C. Workload ids are in
"berth get workloads". The node must be connected; a node's session carries
at most 32 followed streams at once.`,
		Example: `  berth logs wl_01JC9Z8K2M4P6R8T0V2X4Z6B8D --tail 50
  berth logs wl_01JC9Z8K2M4P6R8T0V2X4Z6B8D -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tail < 0 || tail > 10000 {
				return fmt.Errorf("--tail must be from 0 to 10000")
			}
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if follow {
				err := c.FollowWorkloadLogs(cmd.Context(), args[0], tail, func(l node.LogLine) error {
					return printLogLine(a.stdout, a.output, l)
				})
				if err != nil {
					return fmt.Errorf("follow logs of %s: %w", args[0], err)
				}
				return nil
			}
			out, err := c.WorkloadLogs(cmd.Context(), args[0], tail)
			if err != nil {
				return fmt.Errorf("logs of %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			for _, l := range out.Lines {
				if err := printLogLine(a.stdout, a.output, l); err != nil {
					return err
				}
			}
			if out.Detail != "" {
				fmt.Fprintf(a.stderr, "(%s)\n", out.Detail)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&tail, "tail", 0, "newest lines to show (0: as many as fit one answer; 100 when following)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until interrupted")
	return cmd
}

// printLogLine prints one line: its time when the node knows it, then the
// text; with -o json one JSON object per line.
func printLogLine(w io.Writer, output string, l node.LogLine) error {
	if output == outputJSON {
		return printJSON(w, l)
	}
	var err error
	if l.Time != nil {
		_, err = fmt.Fprintf(w, "%s %s\n", l.Time.Local().Format(time.RFC3339), l.Line)
	} else {
		_, err = fmt.Fprintln(w, l.Line)
	}
	return err
}

func newNodeMetricsCmd(a *app) *cobra.Command {
	var workloads []string
	cmd := &cobra.Command{
		Use:   "metrics NODE_ID",
		Short: "Show a node's recent CPU and memory use, and its workloads'",
		Long: `metrics asks the node for its metrics ring: samples of the last 10 minutes,
kept in memory on the node (docs/node-protocol.md section 5.17). The table shows
the newest sample of the node and of each workload named with --workload; -o json
prints every sample.`,
		Example: `  berth node metrics nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP --workload wl_01JC9Z8K2M4P6R8T0V2X4Z6B8D`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			m, err := c.NodeMetrics(cmd.Context(), args[0], workloads...)
			if err != nil {
				return fmt.Errorf("metrics of node %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, m)
			}
			t := newTable(a.stdout)
			row(t, "SUBJECT", "TIME", "CPU", "MEMORY")
			if n := len(m.Node); n > 0 {
				s := m.Node[n-1]
				row(t, args[0], s.Time.Local().Format(time.TimeOnly), fmt.Sprintf("%.1f%% of %d CPUs", s.CPUUsage*100, s.CPUCount),
					fmt.Sprintf("%d / %d MiB", s.MemoryUsedBytes>>20, s.MemoryTotalBytes>>20))
			}
			for _, w := range m.Workloads {
				if n := len(w.Samples); n > 0 {
					s := w.Samples[n-1]
					row(t, w.WorkloadID, s.Time.Local().Format(time.TimeOnly), fmt.Sprintf("%.2f CPUs", s.CPUUsage), fmt.Sprintf("%d MiB", s.MemoryRSSBytes>>20))
				} else {
					row(t, w.WorkloadID, "-", "-", "-")
				}
			}
			if len(m.Node) == 0 {
				fmt.Fprintf(a.stderr, "(no samples yet; the node takes one every %.0f s)\n", m.IntervalS)
			}
			return t.Flush()
		},
	}
	cmd.Flags().StringArrayVar(&workloads, "workload", nil, "workload id whose samples to include (repeatable)")
	return cmd
}
