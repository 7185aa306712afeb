package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

func newRunCmd(a *app) *cobra.Command {
	var (
		timeout     time.Duration
		interactive bool
	)
	cmd := &cobra.Command{
		Use:   "run SERVICE -- COMMAND [ARG...]",
		Short: "Run a one-off command in a service's environment and stream its output",
		Long: `run starts COMMAND once with the service's release (bundle or image), env,
secrets and bindings, on a node the placement decider chooses for the service's
resources and constraints (docs/jobs.md section 9). The command is admitted by
the service.apply policies (cause job.command); for a service that takes
secrets it needs secret:use on it. It streams the command's output (stdout to
stdout, stderr to stderr) and exits with the command's exit code: 128+N when
signal N killed it, 1 when it timed out or was cancelled. Interrupting run
cancels the command.

The run is recorded like a job's run and named SERVICE@INSTANT-run-XXXXXXXX:
'berth job logs RUN' reads its output again. -i (stdin) is refused: the runtime
drivers cannot attach stdin to a run.`,
		Example: `  berth run web -- rails db:migrate
  berth run web --timeout 10m -- sh -c 'echo $DATABASE_URL | cut -d@ -f2'`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interactive {
				return errors.New("-i is not supported: the runtime drivers (process, containerd) cannot attach stdin to a run; run the command without -i")
			}
			if cmd.ArgsLenAtDash() != 1 {
				return errors.New("name the service, then -- and the command: berth run SERVICE -- COMMAND [ARG...]")
			}
			if timeout < 0 || timeout%time.Second != 0 {
				return errors.New("--timeout must be whole seconds, 0 for no bound")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			ctx := cmd.Context()
			run, err := c.RunCommand(ctx, project, name, args[1:], int(timeout/time.Second))
			if err != nil {
				return fmt.Errorf("run in %s/%s: %w", project, name, err)
			}
			fmt.Fprintf(a.stderr, "(run %s)\n", run.Name())
			return a.attachRun(ctx, c, project, run.Name(), 0)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop the command after this long (whole seconds; 0: no bound)")
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "attach stdin (not supported by the runtime drivers: refused)")
	return cmd
}

// attachRun prints the output of run until it ends, then returns its exitStatus (nil when it
// succeeded). Interrupting it (ctx ends) cancels the run and answers 130; a timeout (0: none)
// that passes first answers 1 and leaves the run going.
func (a *app) attachRun(ctx context.Context, c *client.Client, project, name string, timeout time.Duration) error {
	out := &runPrinter{a: a}
	fctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	r, err := a.followRun(fctx, c, project, name, out.print)
	if err != nil {
		if ctx.Err() == nil && fctx.Err() != nil {
			return exitStatus{code: 1, msg: fmt.Sprintf("run %s did not end within %s; it goes on (berth job logs %s -f)", name, timeout, name)}
		}
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if _, cerr := c.CancelJobRun(cctx, project, name); cerr != nil {
				return exitStatus{code: 130, msg: fmt.Sprintf("interrupted; cancelling run %s failed: %v", name, cerr)}
			}
			return exitStatus{code: 130, msg: "interrupted; run " + name + " cancelled"}
		}
		return err
	}
	if a.output == outputJSON {
		if err := printJSON(a.stdout, r); err != nil {
			return err
		}
	}
	return runExit(r)
}

// runExit is the exitStatus of ended run r: nil when it succeeded, the process's code when it
// failed, 128+N for signal N, 1 otherwise (timed out, cancelled, never ran).
func runExit(r *client.JobRun) error {
	msg := fmt.Sprintf("run %s %s (exit %s, %s)", r.Name(), r.State, exitOf(*r), durationOf(*r))
	if r.Message != "" {
		msg += ": " + r.Message
	}
	switch {
	case r.State == "succeeded":
		return nil
	case r.Signal != 0:
		return exitStatus{code: 128 + r.Signal, msg: msg}
	case r.ExitCode != nil && *r.ExitCode != 0 && r.State == "failed":
		return exitStatus{code: *r.ExitCode, msg: msg}
	}
	return exitStatus{code: 1, msg: msg}
}

// runPrinter writes a run's output lines: stdout's to stdout, stderr's to stderr, a line's
// text as written (a partial line without its newline); with -o json one object per line.
type runPrinter struct{ a *app }

func (p *runPrinter) print(l node.LogLine) error {
	if p.a.output == outputJSON {
		return printJSON(p.a.stdout, l)
	}
	w := p.a.stdout
	if l.Stream == "stderr" {
		w = p.a.stderr
	}
	end := "\n"
	if l.Partial {
		end = ""
	}
	_, err := io.WriteString(w, l.Line+end)
	return err
}

// Bounds of following a run's output.
const (
	runPollInterval   = 500 * time.Millisecond // how often the run's state is read
	runReopenInterval = 200 * time.Millisecond // how soon a log stream that ended is opened again
	runFollowTail     = 10000                  // the newest lines a (re)opened stream starts with
)

// followRun prints (with fn) the whole output of run project/name, each line once and in
// order, and returns the run once it ended: it follows the run's log while the run is live
// (opening the stream again whenever it ends early, as it does before the run reaches its
// node), then reads what was written after the stream's last line. Lines carry the node's
// sequence numbers, so a line seen twice is printed once, and a gap (output the node no longer
// keeps) is said on stderr. It returns when ctx ends (ctx's error) or the run's state cannot
// be read.
func (a *app) followRun(ctx context.Context, c *client.Client, project, name string, fn func(node.LogLine) error) (*client.JobRun, error) {
	f := &seqFilter{a: a, fn: fn}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	type answer struct {
		r   *client.JobRun
		err error
	}
	ended := make(chan answer, 1)
	go func() { // reads the run's state until it is final, then stops the follow
		defer stop()
		t := time.NewTicker(runPollInterval)
		defer t.Stop()
		waiting := ""
		for {
			r, err := c.GetJobRun(fctx, project, name)
			if err != nil || r.Final() {
				ended <- answer{r, err}
				return
			}
			if r.State == "pending" && r.Message != "" && r.Message != waiting {
				waiting = r.Message
				fmt.Fprintf(a.stderr, "(run %s waits: %s)\n", name, r.Message)
			}
			select {
			case <-fctx.Done():
				ended <- answer{nil, fctx.Err()}
				return
			case <-t.C:
			}
		}
	}()
	for fctx.Err() == nil {
		err := c.FollowJobRunLogs(fctx, project, name, runFollowTail, f.line)
		var ae *client.APIError
		if err != nil && fctx.Err() == nil && !(errors.As(err, &ae) && (ae.Problem.Code == "unavailable" || ae.Problem.Code == "not_found")) {
			return nil, fmt.Errorf("follow the output of run %s: %w", name, err)
		}
		select {
		case <-fctx.Done():
		case <-time.After(runReopenInterval):
		}
	}
	res := <-ended
	if res.err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("read run %s: %w", name, res.err)
	}
	if res.r.WorkloadID == "" || (f.last == 0 && f.printed) {
		return res.r, nil // it never ran, or its lines carry no sequence to resume from
	}
	rest, err := c.JobRunLogs(ctx, project, name, 0)
	if err != nil {
		return res.r, fmt.Errorf("read the rest of the output of run %s: %w", name, err)
	}
	for _, l := range rest.Lines {
		if err := f.line(l); err != nil {
			return res.r, err
		}
	}
	return res.r, nil
}

// seqFilter passes each line of a run's output to fn once, in sequence order: lines whose
// sequence number was passed already are dropped, and a jump says on stderr which lines are
// not kept any more.
type seqFilter struct {
	a       *app
	fn      func(node.LogLine) error
	last    int64
	printed bool
}

func (f *seqFilter) line(l node.LogLine) error {
	if l.Seq > 0 {
		if l.Seq <= f.last {
			return nil
		}
		if l.Seq > f.last+1 {
			fmt.Fprintf(f.a.stderr, "(output lines %d to %d could not be read: the node no longer keeps them, or they did not fit its answer)\n", f.last+1, l.Seq-1)
		}
		f.last = l.Seq
	}
	f.printed = true
	return f.fn(l)
}
