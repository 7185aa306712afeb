package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// exitStatus ends the CLI with code after printing msg (when not empty) on stderr: how a
// command that ran something reports that thing's exit code (berth job run --wait).
type exitStatus struct {
	code int
	msg  string
}

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d: %s", e.code, e.msg) }

func newJobCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job ls|runs|run|logs|cancel|suspend|resume",
		RunE:  groupRunE,
		Short: "List jobs and their runs, run a job now, cancel a run, suspend or resume a schedule",
		Long: `A job is declared like a service, with kind: job in the apply file, and runs
to completion: once per fire time of its schedule, or when asked
(docs/jobs.md). Its runs are named JOB@INSTANT, the fire time in UTC
(nightly@2026-12-02T03:00:00Z), or JOB@INSTANT-manual-XXXXXXXX for a run
started with 'berth job run'.`,
		Example: `  berth job ls
  berth job runs nightly
  berth job run nightly --wait
  berth job logs nightly@2026-12-02T03:00:00Z
  berth job cancel nightly@2026-12-02T03:00:00Z
  berth job suspend nightly`,
	}
	cmd.AddCommand(newJobLsCmd(a), newJobRunsCmd(a), newJobRunCmd(a), newJobLogsCmd(a), newJobCancelCmd(a), newJobSuspendCmd(a, true), newJobSuspendCmd(a, false))
	return cmd
}

func newJobLsCmd(a *app) *cobra.Command {
	var platform bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the project's jobs with their schedule and last run (--platform: berthd's own periodic work)",
		Long: `ls lists the project's jobs with their schedule, concurrency policy and newest run.

With --platform it lists berthd's own periodic work instead (registry garbage
collection, the expiry of idempotency records, backup schedules, log retention):
when each last ran, how it ended, and how many of its passes failed (docs/jobs.md
section 10). A task is listed from its first pass on: idempotency expiry a minute
after berthd starts, registry GC after 3 minutes, log retention after its interval
(10 minutes by default).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if platform {
				return printPlatformJobs(cmd, a, c)
			}
			jobs, err := c.Jobs(cmd.Context(), s.Project)
			if err != nil {
				return fmt.Errorf("list jobs of %s: %w", s.Project, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, jobs)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSCHEDULE\tCONCURRENCY\tSUSPENDED\tLAST RUN\tSTATE")
			for _, j := range jobs {
				sched := j.Schedule
				if sched == "" {
					sched = "(on demand)"
				} else if j.TimeZone != "" {
					sched += " " + j.TimeZone
				}
				last, state := "-", "-"
				if j.LastRun != nil {
					last, state = j.LastRun.Name(), j.LastRun.State
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\n", j.Name, sched, j.Concurrency, j.Suspended, last, state)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&platform, "platform", false, "list berthd's own periodic work (platform jobs) instead of the project's jobs")
	return cmd
}

// printPlatformJobs prints the platform tasks: last pass, its result, and failures of all passes.
func printPlatformJobs(cmd *cobra.Command, a *app, c *client.Client) error {
	tasks, err := c.PlatformJobs(cmd.Context())
	if err != nil {
		return fmt.Errorf("list platform jobs: %w", err)
	}
	if a.output == outputJSON {
		return printJSON(a.stdout, tasks)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tEVERY\tLAST RUN\tTOOK\tRESULT\tFAILED/PASSES\tMESSAGE")
	for _, t := range tasks {
		last, took, result, msg := "-", "-", "-", ""
		if t.Last != nil {
			last = t.Last.StartedAt.Local().Format(time.DateTime)
			took = t.Last.EndedAt.Sub(t.Last.StartedAt).Round(time.Millisecond).String()
			result, msg = t.Last.Result, t.Last.Message
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", t.Name, time.Duration(t.EveryS)*time.Second, last, took, result, t.Failures, t.Passes, msg)
	}
	if len(tasks) == 0 {
		fmt.Fprintln(tw, "(no pass recorded yet: the first passes run minutes after berthd starts)")
	}
	return tw.Flush()
}

func newJobRunsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "runs JOB|SERVICE",
		Short: "List a job's runs (or a service's one-off commands), oldest first, with how each ended",
		Long: `runs lists the runs the job keeps (keep_history, 20 by default): each fire
time recorded, placed or missed, each manual run and each one-off command run
in it, with its state, exit code or signal, duration and node. Of a service it
lists the runs of its one-off commands (berth run; the newest 20 are kept).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			runs, err := c.JobRuns(cmd.Context(), project, name)
			if err != nil {
				return fmt.Errorf("runs of job %s/%s: %w", project, name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, runs)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSTATE\tEXIT\tDURATION\tATTEMPTS\tNODE\tMESSAGE")
			for _, r := range runs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Name(), r.State, exitOf(r), durationOf(r), r.Attempts, dash(r.NodeID), r.Message)
			}
			return tw.Flush()
		},
	}
}

func exitOf(r client.JobRun) string {
	switch {
	case r.Signal != 0:
		return fmt.Sprintf("signal %d", r.Signal)
	case r.ExitCode != nil:
		return fmt.Sprint(*r.ExitCode)
	}
	return "-"
}

func durationOf(r client.JobRun) string {
	if r.DurationS == 0 && r.EndedAt.IsZero() {
		return "-"
	}
	return (time.Duration(r.DurationS * float64(time.Second))).Round(time.Millisecond).String()
}

func newJobRunCmd(a *app) *cobra.Command {
	var (
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run JOB",
		Short: "Run a job now, outside its schedule",
		Long: `run starts a run of the job now and prints its name. A manual run ignores the
job's concurrency policy and starting deadline; it is placed like any run,
on a node the placement decider chooses, and stays pending while none fits.

With --wait it follows the run's output as it is written (stdout to stdout,
stderr to stderr, every line once) until the run ends, and exits with the
run's exit code: 0 when it succeeded, the process's code when it failed,
128+N when signal N killed it, and 1 when it timed out or was cancelled.
When --timeout passes first it exits 1 and the run goes on; Ctrl-C cancels
the run.`,
		Example: `  berth job run nightly
  berth job run migrate --wait --timeout 30m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			run, err := c.RunJob(cmd.Context(), project, name)
			if err != nil {
				return fmt.Errorf("run job %s/%s: %w", project, name, err)
			}
			if !wait {
				if a.output == outputJSON {
					return printJSON(a.stdout, run)
				}
				fmt.Fprintln(a.stdout, run.Name())
				return nil
			}
			fmt.Fprintln(a.stderr, "run "+run.Name()+" started; following its output until it ends")
			return a.attachRun(cmd.Context(), c, project, run.Name(), timeout)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the run until it ends and exit with its exit code")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "with --wait: how long to wait at most")
	return cmd
}

func newJobLogsCmd(a *app) *cobra.Command {
	var (
		follow bool
		tail   int
	)
	cmd := &cobra.Command{
		Use:   "logs RUN",
		Short: "Show a run's output, read from the node that ran it",
		Long: `logs prints the whole output of a run (of a job, or a one-off 'berth run') as
'berth logs' reads a workload's: the segments its node shipped to berthd merged
with the tail the node has not shipped yet, so it stays readable after the
run's workload and its node are gone. With -f it follows a live run until it
ends, prints each line once, and exits with the run's exit code as 'berth job
run --wait' does. RUN is JOB@INSTANT as 'berth job runs' shows it; 'berth logs
RUN' reads it with --since, --until and --grep.`,
		Example: `  berth job logs nightly@2026-12-02T03:00:00Z
  berth job logs web@2026-12-02T10:15:04Z-run-3f9a0c2e -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tail < 0 || tail > 10000 {
				return fmt.Errorf("--tail must be from 0 to 10000")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			if follow {
				return a.attachRun(cmd.Context(), c, s.Project, args[0], 0)
			}
			out, err := c.JobRunLogs(cmd.Context(), s.Project, args[0], tail)
			if err != nil {
				return fmt.Errorf("logs of run %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			p := &runPrinter{a: a}
			for _, l := range out.Lines {
				if err := p.print(l); err != nil {
					return err
				}
			}
			if out.Detail != "" {
				fmt.Fprintf(a.stderr, "(%s)\n", out.Detail)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow a live run until it ends, then exit with its exit code")
	cmd.Flags().IntVar(&tail, "tail", 0, "newest lines to show (0: as many as fit one answer)")
	return cmd
}

func newJobCancelCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel RUN",
		Short: "Stop a live run and record it cancelled",
		Long: `cancel removes a pending or running run's workload from its node, which stops
it (gracefully, then forcibly), and records the run cancelled. A run that
ended already is shown as it is. RUN is JOB@INSTANT as 'berth job runs' shows it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			r, err := c.CancelJobRun(cmd.Context(), s.Project, args[0])
			if err != nil {
				return fmt.Errorf("cancel run %s: %w", args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, r)
			}
			fmt.Fprintf(a.stdout, "run %s %s\n", r.Name(), r.State)
			return nil
		},
	}
}

func newJobSuspendCmd(a *app, suspend bool) *cobra.Command {
	use, short := "resume JOB", "Continue a suspended job's schedule"
	long := `resume lets the job's schedule fire again. Fire times while it was suspended are
not run, except the latest when it is within the starting deadline.`
	if suspend {
		use, short = "suspend JOB", "Hold a job's schedule (runs under way go on)"
		long = `suspend stops the job's schedule from recording new runs until 'berth job
resume'; runs under way go on. Like every change of what runs, it is admitted
by the service.apply policies (cause job.control) and kept in the change log.`
	}
	return &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			if err := c.SuspendJob(cmd.Context(), project, name, suspend); err != nil {
				return fmt.Errorf("%s job %s/%s: %w", strings.Fields(use)[0], project, name, err)
			}
			state := "resumed"
			if suspend {
				state = "suspended"
			}
			fmt.Fprintf(a.stdout, "job %s/%s %s\n", project, name, state)
			return nil
		},
	}
}
