package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

func newLogsCmd(a *app) *cobra.Command {
	var tail int
	var follow, previous bool
	var opt client.LogsOptions
	cmd := &cobra.Command{
		Use:   "logs WORKLOAD_ID | SERVICE[/SLOT] | RUN",
		Short: "Show a workload's, a slot's or a job run's output: shipped segments and its node's live tail",
		Long: `logs reads a workload's output: the log segments its node shipped to berthd,
merged in order with the newest output the node has not shipped yet (docs/logs.md).
A workload whose node is gone (removed or disconnected) is read from its shipped
segments alone, and logs says the live tail is unavailable. Name a workload id
(from "berth get workloads"), a service's slot: SERVICE/SLOT, or SERVICE alone
for slot 0, or a job's run: JOB@INSTANT as "berth job runs" shows it (its whole
output, also after its workload and its node are gone). --since and --until take an RFC 3339 time or a duration ago ("2h");
--grep keeps the lines matching a regular expression (RE2).
A slot is read from whatever attempt it runs now; with --follow, when the slot
moves to a new attempt (a restart after a crash, a rollout), logs follows the
new one and says so on stderr. --previous prints the output the node kept of
the slot's attempt before the current one (its newest 64 KiB, while the node
keeps it). The node must be connected; a node's session carries at most 32
followed streams at once.`,
		Example: `  berth logs hello --tail 50
  berth logs hello --since 2h --grep 'error|panic'
  berth logs wl_01JC9Z8K2M4P6R8T0V2X4Z6B8D --since 2026-12-01T10:00:00Z --until 2026-12-01T11:00:00Z
  berth logs hello/1 -f
  berth logs nightly@2026-12-02T03:00:00Z --grep 'rows copied'
  berth logs hello --previous
  berth logs wl_01JC9Z8K2M4P6R8T0V2X4Z6B8D -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tail < 0 || tail > 10000 {
				return fmt.Errorf("--tail must be from 0 to 10000")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			target := args[0]
			if strings.Contains(target, "@") {
				// A run (JOB@INSTANT, as berth job runs shows it): read its workload's log,
				// shipped segments and all, after the workload is gone.
				if previous {
					return fmt.Errorf("--previous needs SERVICE[/SLOT], not a run")
				}
				r, err := c.GetJobRun(ctx, s.Project, target)
				if err != nil {
					return fmt.Errorf("run %s: %w", target, err)
				}
				if r.WorkloadID == "" {
					if r.Final() {
						return fmt.Errorf("run %s never ran (%s): it has no output", target, r.State)
					}
					return fmt.Errorf("run %s is not placed on a node yet; try again when it runs", target)
				}
				target = r.WorkloadID
			} else if !strings.HasPrefix(target, "wl_") {
				service, replica, _ := strings.Cut(target, "/")
				if replica == "" {
					replica = "0"
				}
				if previous {
					sv, err := slotOf(ctx, c, s.Project, service, replica)
					if err != nil {
						return err
					}
					if sv.PreviousWorkloadID == "" {
						return fmt.Errorf("slot %s/%s has run only one attempt: there is no previous one", service, replica)
					}
					out, err := c.NodeLogs(ctx, sv.NodeID, sv.PreviousWorkloadID, tail)
					if err != nil {
						return fmt.Errorf("logs of the previous attempt of %s/%s (%s): %w", service, replica, sv.PreviousWorkloadID, err)
					}
					return a.printLogs(out)
				}
				if follow {
					return a.followSlot(ctx, c, s.Project, service, replica, tail, opt)
				}
				sv, err := slotOf(ctx, c, s.Project, service, replica)
				if err != nil {
					return err
				}
				target = sv.WorkloadID
			} else if previous {
				return fmt.Errorf("--previous needs SERVICE[/SLOT], not a workload id")
			}
			if follow {
				err := c.FollowWorkloadLogsWith(ctx, target, tail, opt, func(l node.LogLine) error {
					return printLogLine(a.stdout, a.output, l)
				})
				if errors.Is(err, client.ErrLiveTailUnavailable) {
					fmt.Fprintf(a.stderr, "(%s)\n", strings.TrimPrefix(err.Error(), "berth: "))
					return nil
				}
				if err != nil {
					return fmt.Errorf("follow logs of %s: %w", target, err)
				}
				return nil
			}
			out, err := c.WorkloadLogsWith(ctx, target, tail, opt)
			if err != nil {
				return fmt.Errorf("logs of %s: %w", target, err)
			}
			return a.printLogs(out)
		},
	}
	cmd.Flags().IntVar(&tail, "tail", 0, "newest lines to show (0: as many as fit one answer; 100 when following)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until interrupted")
	cmd.Flags().BoolVarP(&previous, "previous", "p", false, "print the output of the slot's previous attempt")
	cmd.Flags().StringVar(&opt.Since, "since", "", "only lines written at or after this time (RFC 3339, or a duration ago such as 2h)")
	cmd.Flags().StringVar(&opt.Until, "until", "", "only lines written at or before this time (RFC 3339, or a duration ago)")
	cmd.Flags().StringVar(&opt.Grep, "grep", "", "only lines matching this regular expression (RE2)")
	return cmd
}

func (a *app) printLogs(out *client.WorkloadLogs) error {
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
}

// slotOf returns replica of project/service as the slots view answers it. A replica runs under
// two slot names while a rollout surges ("0" and its successor "0~"): naming the replica ("0")
// reads the slot that runs its current attempt (the successor while it starts, fails or takes
// over), and the incumbent while no current one has a workload; "0~" names that slot alone.
func slotOf(ctx context.Context, c *client.Client, project, service, replica string) (*client.SlotView, error) {
	items, err := c.ServiceSlots(ctx, project, service)
	if err != nil {
		return nil, fmt.Errorf("list slots of %s/%s: %w", project, service, err)
	}
	var best *client.SlotView
	rank := func(sv *client.SlotView) int {
		switch {
		case sv.WorkloadID == "":
			return 0
		case sv.Current && sv.Disposition == "run":
			return 3
		case sv.Disposition == "run":
			return 2
		default:
			return 1
		}
	}
	found := false
	for i := range items {
		sv := &items[i]
		if sv.Replica != replica && (strings.Contains(replica, "~") || strings.TrimSuffix(sv.Replica, "~") != replica) {
			continue
		}
		found = true
		if best == nil || rank(sv) > rank(best) {
			best = sv
		}
	}
	switch {
	case !found:
		return nil, fmt.Errorf("service %s/%s has no slot %q", project, service, replica)
	case best.WorkloadID == "":
		return nil, fmt.Errorf("slot %s/%s has no workload yet", service, replica)
	}
	return best, nil
}

// followSlot follows the output of a slot across its attempts: it follows the workload the slot
// runs now and, when that stream ends or the workload is gone, reads the slot again (at most
// once a second) and follows its next attempt, until ctx ends.
func (a *app) followSlot(ctx context.Context, c *client.Client, project, service, replica string, tail int, opt client.LogsOptions) error {
	current := ""
	for ctx.Err() == nil {
		sv, err := slotOf(ctx, c, project, service, replica)
		if err != nil {
			return err
		}
		if sv.WorkloadID != current {
			if current != "" {
				fmt.Fprintf(a.stderr, "(slot %s/%s now runs %s)\n", service, replica, sv.WorkloadID)
			}
			current = sv.WorkloadID
			err = c.FollowWorkloadLogsWith(ctx, current, tail, opt, func(l node.LogLine) error {
				return printLogLine(a.stdout, a.output, l)
			})
			if errors.Is(err, client.ErrLiveTailUnavailable) {
				err = nil // the slot's node is away: read the slot again
			}
			var ae *client.APIError
			if err != nil && ctx.Err() == nil && !(errors.As(err, &ae) && (ae.Problem.Code == "not_found" || ae.Problem.Code == "unavailable")) {
				return fmt.Errorf("follow logs of %s: %w", current, err)
			}
			tail = 0 // the next attempt's output from its start (the node's default tail)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
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
