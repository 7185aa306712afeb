package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

func newRolloutCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout status|undo|pause|resume|restart SERVICE",
		RunE:  groupRunE,
		Short: "Follow, undo, pause, resume or restart a service's rollout",
		Long: `rollout follows a service on its way to its current desire, returns it to
its previous release, holds or resumes its rollout, or replaces every replica
(docs/reconciliation.md sections 5 and 7).`,
		Example: `  berth rollout status hello
  berth rollout undo hello
  berth rollout pause default/hello
  berth rollout restart hello`,
	}
	cmd.AddCommand(newRolloutStatusCmd(a), newRolloutUndoCmd(a), newRolloutControlCmd(a, "pause"),
		newRolloutControlCmd(a, "resume"), newRolloutControlCmd(a, "restart"))
	return cmd
}

func newRolloutStatusCmd(a *app) *cobra.Command {
	var (
		watch    bool
		interval time.Duration
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status SERVICE",
		Short: "Wait until a service's rollout converges, showing its progress",
		Long: `status reads the service's rollout every --interval until its verdict
(docs/reconciliation.md section 7) is converged for the current runtime spec
revision, and shows how many replicas run the current release and spec
(updated) and how many still run an older one (outdated).

On a terminal the progress is one line on stderr, redrawn in place; otherwise
one line is printed per change, for example
  rev 7 spec 3: 2/3 updated, 1 outdated, verdict converging
(on stderr with -o json, so that stdout holds only the final status).

It ends:
  - with exit 0 and "rollout of SERVICE converged" once the verdict is
    converged and every desired replica is updated, none outdated;
  - with exit 1 and the reason when the service is refused (for example
    refused(no-eligible-node)): a refusal does not pass by waiting;
  - with exit 1 after --timeout, naming what the service was waiting on.
A waiting verdict (failure-backoff, conflict) is followed, not ended on, and
so is a verdict about an older spec revision than the current one. A verdict
says nothing of a release change made since it was decided, which is why the
replica counts must agree as well.
With -o json it prints the last rollout status read as JSON. With
--watch=false it prints the status once and exits 0 whatever it says.`,
		Example: `  berth rollout status hello
  berth rollout status hello --timeout 2m
  berth rollout status hello --watch=false -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval must be positive")
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout must be positive")
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			name := args[0]
			if !watch {
				st, err := c.Rollout(cmd.Context(), s.Project, name)
				if err != nil {
					return fmt.Errorf("rollout status of %s/%s: %w", s.Project, name, err)
				}
				if a.output == outputJSON {
					return printJSON(a.stdout, st)
				}
				fmt.Fprintln(a.stdout, rolloutLine(st))
				return nil
			}
			return a.watchRollout(cmd.Context(), c, s.Project, name, interval, timeout)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&watch, "watch", true, "keep reading until the rollout converges, is refused or times out")
	f.DurationVar(&interval, "interval", time.Second, "time between two reads of the rollout")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	return cmd
}

// watchRollout polls the rollout of project/name every interval until, for the current spec
// revision, its verdict is converged with every desired replica updated and none outdated (nil) or
// refused (an error naming the reason), or until timeout passed (an error naming the last verdict).
// The loop is bounded by timeout and by the caller's ctx.
func (a *app) watchRollout(ctx context.Context, c *client.Client, project, name string, interval, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()

	progress := a.stdout
	if a.output == outputJSON {
		progress = a.stderr
	}
	bar := isTerminal(a.stderr)
	var last *client.RolloutStatus
	var lastLine string
	endBar := func() {
		if bar && last != nil {
			fmt.Fprintln(a.stderr)
		}
	}
	for {
		st, err := c.Rollout(wctx, project, name)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			endBar()
			return fmt.Errorf("rollout status of %s/%s: %w", project, name, ctx.Err())
		case wctx.Err() != nil:
			endBar()
			return a.rolloutTimeout(name, timeout, last)
		default:
			endBar()
			return fmt.Errorf("rollout status of %s/%s: %w", project, name, err)
		}
		last = st
		if line := rolloutLine(st); line != lastLine {
			lastLine = line
			if bar {
				fmt.Fprintf(a.stderr, "\r%s %s\x1b[K", progressBar(st, 20), line)
			} else {
				fmt.Fprintln(progress, line)
			}
		}
		switch current := st.Verdict.SpecRevision == st.SpecRevision; {
		case current && st.Verdict.State == "converged" && st.Updated >= st.Desired && st.Outdated == 0:
			endBar()
			if a.output == outputJSON {
				return printJSON(a.stdout, st)
			}
			fmt.Fprintf(a.stdout, "rollout of %s converged\n", name)
			return nil
		case current && st.Verdict.State == "refused":
			endBar()
			if a.output == outputJSON {
				if err := printJSON(a.stdout, st); err != nil {
					return err
				}
			}
			return fmt.Errorf("rollout of %s refused: %s", name, orDash(st.Verdict.Reason))
		}
		select {
		case <-ctx.Done():
			endBar()
			return fmt.Errorf("rollout status of %s/%s: %w", project, name, ctx.Err())
		case <-wctx.Done():
			endBar()
			return a.rolloutTimeout(name, timeout, last)
		case <-ticker.C:
		}
	}
}

// rolloutTimeout is the error of a watch that ran out of time; last is the last status read
// (nil when none was). With -o json the last status is printed first.
func (a *app) rolloutTimeout(name string, timeout time.Duration, last *client.RolloutStatus) error {
	if last == nil {
		return fmt.Errorf("rollout of %s: no answer within %s", name, timeout)
	}
	if a.output == outputJSON {
		if err := printJSON(a.stdout, last); err != nil {
			return err
		}
	}
	var on string
	switch v := last.Verdict; {
	case v.State == "waiting":
		on = "waiting on " + orDash(v.Reason)
	case v.SpecRevision != last.SpecRevision:
		on = fmt.Sprintf("its verdict %s is about spec revision %d, not %d yet", orDash(v.String()), v.SpecRevision, last.SpecRevision)
	default:
		on = fmt.Sprintf("verdict %s with %d/%d updated, %d outdated", orDash(v.String()), last.Updated, last.Desired, last.Outdated)
	}
	return fmt.Errorf("rollout of %s did not converge within %s: %s", name, timeout, on)
}

// rolloutLine is the one-line summary of a rollout status:
// "rev 7 spec 3: 2/3 updated, 1 outdated, verdict converging".
func rolloutLine(st *client.RolloutStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d spec %d: %d/%d updated, %d outdated, verdict %s", st.Revision, st.SpecRevision,
		st.Updated, st.Desired, st.Outdated, orDash(st.Verdict.String()))
	if st.Verdict.State != "" && st.Verdict.SpecRevision != st.SpecRevision {
		fmt.Fprintf(&b, " (of spec %d)", st.Verdict.SpecRevision)
	}
	if st.Deleting {
		b.WriteString(", deleting")
	}
	if w := st.WaitingOn; w != nil {
		fmt.Fprintf(&b, "; slot %s on %s: %s", w.Replica, orDash(w.NodeID), w.Reason)
		if w.LastFailure != nil && !strings.Contains(w.Reason, w.LastFailure.String()) {
			fmt.Fprintf(&b, ", last failure %s", w.LastFailure)
		}
	}
	return b.String()
}

// progressBar draws updated out of desired replicas as "[####------]" width cells wide; a
// service that desires nothing shows a full bar.
func progressBar(st *client.RolloutStatus, width int) string {
	done := width
	if st.Desired > 0 {
		done = min(max(st.Updated, 0)*width/st.Desired, width)
	}
	return "[" + strings.Repeat("#", done) + strings.Repeat("-", width-done) + "]"
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

func newRolloutUndoCmd(a *app) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "undo SERVICE",
		Short: "Return a service to what it ran before its latest change",
		Long: `undo sets the service back to what it ran before the latest change of what it
runs: the release bundle or image, and with it the command, environment, port,
limits and health check of that time (previous_release in 'berth rollout
status SERVICE -o json' names the release). Replicas, domains and the runtime
spec stay as they are. The write is one compare-and-set on the service; undo
again to return. Like any release change it rolls out under the service's
rollout bounds (max_surge, max_unavailable; by default each successor starts
beside its replica and the replica stops once the successor is observed
ready: docs/reconciliation.md section 5.2). Follow it with
'berth rollout status SERVICE'.

Before it writes, undo prints what it changes (release, runtime, command,
environment variables by name as removed, added or changed, port, user,
limits, health check with its defaults filled in; values of environment
variables are never shown), and then undoes exactly that: the write is fenced
to the revision the changes were read from. --dry-run prints only the changes.

It is refused with no_previous_release when what the service runs never
changed, revision_conflict when the service changed meanwhile (read it again
and retry), and service_deleting while the service is being deleted.`,
		Example: `  berth rollout undo hello --dry-run
  berth rollout undo hello && berth rollout status hello`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			plan, err := c.RolloutUndoWith(cmd.Context(), s.Project, args[0], client.UndoRequest{DryRun: true})
			if err != nil {
				return fmt.Errorf("undo rollout of %s/%s: %w", s.Project, args[0], err)
			}
			if dryRun {
				if a.output == outputJSON {
					return printJSON(a.stdout, plan)
				}
				a.printUndoChanges(args[0], plan, "would change")
				return nil
			}
			if a.output != outputJSON {
				a.printUndoChanges(args[0], plan, "will change")
			}
			rev := plan.Revision
			done, err := c.RolloutUndoWith(cmd.Context(), s.Project, args[0], client.UndoRequest{ExpectedRevision: &rev})
			if err != nil {
				return fmt.Errorf("undo rollout of %s/%s: %w", s.Project, args[0], err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, done)
			}
			fmt.Fprintf(a.stdout, "%s: back to %s (revision %d)\n", args[0], serviceRelease(&done.Service), done.Revision)
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what undo would change and write nothing")
	return cmd
}

// printUndoChanges prints the fields an undo of name changes, one per line: "  field: from -> to",
// and for the environment the names of the variables it removes, adds or changes, never values.
func (a *app) printUndoChanges(name string, r *client.UndoResult, verb string) {
	if len(r.Changes) == 0 {
		fmt.Fprintf(a.stdout, "undo of %s (revision %d) %s only the bundle name\n", name, r.Revision, verb)
		return
	}
	fmt.Fprintf(a.stdout, "undo of %s (revision %d) %s:\n", name, r.Revision, verb)
	tw := newTable(a.stdout)
	for _, ch := range r.Changes {
		if ch.Field == "env" {
			fmt.Fprintf(tw, "  %s:\t%s\n", ch.Field, envChangeText(ch))
			continue
		}
		fmt.Fprintf(tw, "  %s:\t%s\t->\t%s\n", ch.Field, ch.From, ch.To)
	}
	_ = tw.Flush()
}

// serviceRelease names what a service runs: its image when it has one, else its bundle digest.
func serviceRelease(svc *client.Service) string {
	if svc.Image != "" {
		return svc.Image
	}
	return orDash(svc.BundleDigest)
}

// envChangeText words an env change of an undo (keys "-K" leaving, "+K" arriving, "~K" changing
// value, docs/api.md) as "K removed, K added, K changed" by key.
func envChangeText(ch client.UndoChange) string {
	words := map[string]string{}
	for _, tok := range append(strings.Fields(ch.From), strings.Fields(ch.To)...) {
		switch {
		case len(tok) < 2: // "-": no keys on this side
		case strings.HasPrefix(tok, "-"):
			words[tok[1:]] = "removed"
		case strings.HasPrefix(tok, "+"):
			words[tok[1:]] = "added"
		case strings.HasPrefix(tok, "~"):
			words[tok[1:]] = "changed"
		}
	}
	parts := make([]string, 0, len(words))
	for _, k := range slices.Sorted(maps.Keys(words)) {
		parts = append(parts, k+" "+words[k])
	}
	return orDash(strings.Join(parts, ", "))
}

// rolloutControlHelp is the help of each of `berth rollout pause|resume|restart`.
var rolloutControlHelp = map[string][2]string{
	"pause": {"Hold a service's rollout where it is", `pause holds the service's rollout where it is: no replica begins a
replacement; successors already started finish and replace their replica, and
replicas that are missing still start. 'berth rollout status' then shows the
verdict waiting(rollout-paused) while replicas run an older attempt. New
releases applied meanwhile wait too. Pausing a paused service changes nothing.`},
	"resume": {"Let a paused rollout continue", `resume lets a paused rollout continue under the service's rollout bounds.
Resuming a service that is not paused changes nothing.`},
	"restart": {"Replace every replica of a service", `restart replaces every replica of the service with a new run of the same
release and configuration, under the service's rollout bounds (by default one
successor at a time, each started beside its replica, which stops once the
successor is ready). It writes a new restart generation on the service; each
call is a new restart. Follow it with 'berth rollout status SERVICE'.`},
}

func newRolloutControlCmd(a *app, action string) *cobra.Command {
	help := rolloutControlHelp[action]
	return &cobra.Command{
		Use:   action + " [PROJECT/]SERVICE",
		Short: help[0],
		Long: help[1] + `

SERVICE may name its project (PROJECT/SERVICE); otherwise --project applies.
The write is one compare-and-set on the service, recorded in the change log.
It is refused with service_not_found, service_deleting, or revision_conflict
when the service changed under it (run it again).`,
		Example: fmt.Sprintf("  berth rollout %s hello\n  berth rollout %s default/hello", action, action),
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			project, name := splitService(args[0], s.Project)
			var out *client.RolloutControl
			switch action {
			case "pause":
				out, err = c.RolloutPause(cmd.Context(), project, name)
			case "resume":
				out, err = c.RolloutResume(cmd.Context(), project, name)
			default:
				out, err = c.RolloutRestart(cmd.Context(), project, name)
			}
			if err != nil {
				return fmt.Errorf("%s rollout of %s/%s: %w", action, project, name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, out)
			}
			switch {
			case !out.Changed && out.Service.RolloutPaused:
				fmt.Fprintf(a.stdout, "rollout of %s/%s was already paused\n", project, name)
			case !out.Changed:
				fmt.Fprintf(a.stdout, "rollout of %s/%s was not paused\n", project, name)
			case action == "restart":
				fmt.Fprintf(a.stdout, "rollout of %s/%s restarting (restart generation %d, revision %d)\n", project, name, out.Service.RestartGeneration, out.Service.Revision)
			default:
				fmt.Fprintf(a.stdout, "rollout of %s/%s %sd (revision %d)\n", project, name, action, out.Service.Revision)
			}
			return nil
		},
	}
}
