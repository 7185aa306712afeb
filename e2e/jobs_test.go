package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// jobBundle writes a release whose ./job prints a line and then exits 0 (ok), exits 3 (fail) or
// sleeps a minute (sleep).
func jobBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"job $1 in $BERTH_WORKLOAD_ID\"\n" +
		"case \"$1\" in\n  ok) exit 0 ;;\n  fail) exit 3 ;;\n  sleep) exec sleep 60 ;;\nesac\nexit 9\n"
	if err := os.WriteFile(filepath.Join(dir, "job"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runCLI runs the berth CLI against cl and returns its stdout, stderr and exit code; a CLI
// still running after five minutes is killed (and fails the test by its exit code).
func (cl *cluster) runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.bin, "berth"), append([]string{"--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("berth %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// TestJobs runs jobs end to end on one node with the process driver (docs/jobs.md section 7):
// an "@every 2s" job whose runs succeed and are never started twice, a failing job retried once
// and then failed, a job stopped at its timeout and recorded timed_out, and `berth job run
// --wait` exiting with each run's exit code.
func TestJobs(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startAgent(t, cl, "a")
	cl.pushBundle(t, jobBundle(t, filepath.Join(t.TempDir(), "job")), "job")
	apply := func(name, arg string, job client.JobSpec) {
		t.Helper()
		spec := client.ServiceSpec{Kind: "job", Bundle: "job", Command: []string{"./job", arg}, Job: &job}
		if _, err := cl.c.ApplyService(ctx, "default", name, spec); err != nil {
			t.Fatalf("apply job %s: %v", name, err)
		}
	}
	apply("tick", "ok", client.JobSpec{Schedule: "@every 2s"})
	apply("flaky", "fail", client.JobSpec{Retries: 1})
	apply("slow", "sleep", client.JobSpec{TimeoutS: 2})
	// A job is refused what only a service has.
	two := 2
	if _, err := cl.c.ApplyService(ctx, "default", "bad", client.ServiceSpec{Kind: "job", Bundle: "job", Command: []string{"./job"}, Replicas: &two}); !client.IsCode(err, "validation_failed") {
		t.Fatalf("a job with replicas: %v, want validation_failed", err)
	}

	// The scheduled job: several fire times, each run succeeded once, none started twice.
	waitFor(t, 90*time.Second, "three succeeded runs of tick", func() (bool, string) {
		runs, err := cl.c.JobRuns(ctx, "default", "tick")
		if err != nil {
			return false, err.Error()
		}
		ok := 0
		for _, r := range runs {
			if r.State == "succeeded" {
				ok++
			}
		}
		return ok >= 3, fmt.Sprintf("%d succeeded of %+v", ok, runs)
	})
	runs, err := cl.c.JobRuns(ctx, "default", "tick")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if !strings.HasPrefix(r.ID, "default/tick@") {
			t.Errorf("run id %q", r.ID)
		}
		switch r.State {
		case "succeeded":
			if r.Attempts != 1 || r.ExitCode == nil || *r.ExitCode != 0 || !strings.Contains(r.OutputTail, "job ok in "+r.WorkloadID) {
				t.Errorf("succeeded run %+v: want one attempt, exit 0 and its output", r)
			}
			if r.FireTime.Unix()%2 != 0 {
				t.Errorf("run %s fired at an odd second", r.ID)
			}
		case "running", "pending", "missed":
		default:
			t.Errorf("run %s is %s (%s)", r.ID, r.State, r.Message)
		}
	}
	if out := cl.cli(t, "job", "ls"); !strings.Contains(out, "tick") || !strings.Contains(out, "@every 2s") {
		t.Errorf("job ls:\n%s", out)
	}
	cl.cli(t, "job", "suspend", "tick")

	// A manual run of a job that succeeds: --wait exits 0 with its output.
	stdout, stderr, code := cl.runCLI(t, "job", "run", "tick", "--wait", "--timeout", "90s")
	if code != 0 || !strings.Contains(stdout, "job ok in wl_") {
		t.Errorf("job run tick --wait: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	// The manual run's whole output outlives its workload: once the controller removed the
	// workload, berth logs RUN reads it from the segments its node shipped (docs/jobs.md
	// section 9, docs/logs.md), with the filters of any log.
	var manual client.JobRun
	if runs, err := cl.c.JobRuns(ctx, "default", "tick"); err == nil {
		for _, r := range runs {
			if r.Trigger == "manual" {
				manual = r
			}
		}
	}
	if manual.WorkloadID == "" {
		t.Fatalf("no manual run of tick with a workload")
	}
	waitFor(t, 90*time.Second, "the manual run's workload removed and its output read by berth logs RUN", func() (bool, string) {
		for _, w := range cl.workloads(t, "tick") {
			if w.ID == manual.WorkloadID {
				return false, "workload " + w.ID + " still there"
			}
		}
		out, errOut, code := cl.runCLI(t, "logs", manual.Name(), "--grep", "job ok")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return code == 0 && len(lines) == 1 && strings.HasSuffix(lines[0], " job ok in "+manual.WorkloadID), out + errOut
	})

	// The README's example job (examples/jobs/report), declared as the README declares it.
	cl.pushBundle(t, filepath.Join("..", "examples", "jobs", "report"), "report")
	readme := filepath.Join(cl.dir, "report.yaml")
	if err := os.WriteFile(readme, []byte("kind: job\nname: report\nbundle: report\ncommand: [\"./report\", \"--since\", \"24h\"]\n"+
		"schedule: \"30 2 * * *\"\ntime_zone: Europe/Berlin\nconcurrency: forbid\ntimeout_s: 600\nretries: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "apply", "-f", readme)
	stdout, stderr, code = cl.runCLI(t, "job", "run", "report", "--wait", "--timeout", "90s")
	if code != 0 || !strings.Contains(stdout, "report: the last 24h, run wl_") {
		t.Errorf("job run report --wait (the README's example): exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}

	// A failing job: retried once after the backoff, then failed; --wait exits with its code.
	stdout, stderr, code = cl.runCLI(t, "job", "run", "flaky", "--wait", "--timeout", "90s")
	if code != 3 || !strings.Contains(stderr, "failed") {
		t.Errorf("job run flaky --wait: exit %d, want 3\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	fr, err := cl.c.JobRuns(ctx, "default", "flaky")
	if err != nil || len(fr) != 1 || fr[0].State != "failed" || fr[0].Attempts != 2 || fr[0].ExitCode == nil || *fr[0].ExitCode != 3 {
		t.Errorf("runs of flaky: %+v %v; want one failed after 2 attempts with exit 3", fr, err)
	}

	// A job past its timeout: stopped, recorded timed_out, and no process of it is left.
	stdout, stderr, code = cl.runCLI(t, "job", "run", "slow", "--wait", "--timeout", "90s")
	if code != 1 || !strings.Contains(stderr, "timed_out") {
		t.Errorf("job run slow --wait: exit %d, want 1\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	sr, err := cl.c.JobRuns(ctx, "default", "slow")
	if err != nil || len(sr) != 1 || sr[0].State != "timed_out" {
		t.Fatalf("runs of slow: %+v %v; want one timed_out", sr, err)
	}
	waitFor(t, 30*time.Second, "the timed-out run's process gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)[sr[0].WorkloadID]
		return len(pids) == 0, fmt.Sprint(pids)
	})

	// Suspended: no new scheduled run is recorded.
	before, err := cl.c.JobRuns(ctx, "default", "tick")
	if err != nil {
		t.Fatal(err)
	}
	last := before[len(before)-1].ID
	time.Sleep(5 * time.Second) // a quiet interval is what is asserted: nothing may appear in it
	after, err := cl.c.JobRuns(ctx, "default", "tick")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range after {
		if r.ID > last && r.Trigger == "schedule" {
			t.Errorf("run %s recorded while tick was suspended", r.ID)
		}
	}
}

// TestRunCommand runs one-off commands in a service's environment with berth run, on one node
// with the process driver (docs/jobs.md section 9): the command's exit code is the CLI's, its
// stdout and stderr arrive on the CLI's, a long output arrives whole and in order, berth job
// logs reads the run's output again, the runs are listed and described, an interrupt cancels
// the run, and -i is refused.
func TestRunCommand(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startAgent(t, cl, "a")
	cl.pushBundle(t, jobBundle(t, filepath.Join(t.TempDir(), "app")), "app")
	spec := client.ServiceSpec{Bundle: "app", Command: []string{"./job", "sleep"}, Env: map[string]string{"GREETING": "hello"}}
	if _, err := cl.c.ApplyService(ctx, "default", "web", spec); err != nil {
		t.Fatalf("apply web: %v", err)
	}

	// Exit code, both streams, and the service's env.
	stdout, stderr, code := cl.runCLI(t, "run", "web", "--", "sh", "-c", "echo a $GREETING; echo b >&2; exit 7")
	if code != 7 || stdout != "a hello\n" || !strings.Contains(stderr, "b\n") {
		t.Errorf("berth run web -- sh -c '...exit 7': exit %d, want 7\nstdout %q\nstderr %q", code, stdout, stderr)
	}

	// A long output arrives whole and in order.
	const n = 5000
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	stdout, stderr, code = cl.runCLI(t, "run", "web", "--", "sh", "-c", fmt.Sprintf("i=1; while [ $i -le %d ]; do echo \"line $i\"; i=$((i+1)); done", n))
	if code != 0 || stdout != want.String() {
		t.Errorf("berth run web (%d lines): exit %d, %d bytes of stdout, want %d\nstderr %s", n, code, len(stdout), want.Len(), stderr)
	}
	_, name, ok := strings.Cut(strings.SplitN(stderr, "\n", 2)[0], "(run ")
	name = strings.TrimSuffix(name, ")")
	if !ok || !strings.HasPrefix(name, "web@") || !strings.Contains(name, "-run-") {
		t.Fatalf("berth run did not name its run first on stderr: %q", stderr)
	}
	r, err := cl.c.GetJobRun(ctx, "default", name)
	if err != nil || r.State != "succeeded" || r.Trigger != "command" || len(r.Command) != 3 {
		t.Errorf("run %s: %+v %v; want a succeeded command run", name, r, err)
	}

	// berth job logs reads the run's output again, from its node.
	if out := cl.cli(t, "job", "logs", name); out != want.String() {
		t.Errorf("berth job logs %s: %d bytes, want %d", name, len(out), want.Len())
	}

	// The service's one-off runs are listed, and shown by describe.
	if out := cl.cli(t, "job", "runs", "web"); !strings.Contains(out, name) || !strings.Contains(out, "failed") {
		t.Errorf("job runs web: want both one-off runs:\n%s", out)
	}
	if out := cl.cli(t, "describe", "service", "web"); !strings.Contains(out, "Runs (newest 2 of 2 kept)") {
		t.Errorf("describe service web: want its two one-off runs:\n%s", out)
	}

	// describe of a job shows its runs with how each ended.
	job := client.ServiceSpec{Kind: "job", Bundle: "app", Command: []string{"./job", "fail"}, Job: &client.JobSpec{}}
	if _, err := cl.c.ApplyService(ctx, "default", "once", job); err != nil {
		t.Fatalf("apply job once: %v", err)
	}
	if _, stderr, code := cl.runCLI(t, "job", "run", "once", "--wait"); code != 3 {
		t.Fatalf("job run once --wait: exit %d, want 3\n%s", code, stderr)
	}
	if out := cl.cli(t, "describe", "job", "once"); !strings.Contains(out, "Runs (newest 1 of 1 kept)") || !regexp.MustCompile(`once@\S+\s+failed\s+3\s`).MatchString(out) {
		t.Errorf("describe job once: want its failed run with exit 3:\n%s", out)
	}

	// Interrupting berth run cancels the run: exit 130, the run cancelled, its process gone.
	bg := exec.Command(filepath.Join(env.bin, "berth"), "--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint,
		"run", "web", "--", "sleep", "300")
	bg.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var bgErr bytes.Buffer
	bg.Stderr = &bgErr
	if err := bg.Start(); err != nil {
		t.Fatal(err)
	}
	bgDone := make(chan error, 1)
	go func() { bgDone <- bg.Wait() }()
	t.Cleanup(func() { _ = bg.Process.Kill(); <-bgDone })
	var sleeping client.JobRun
	waitFor(t, 60*time.Second, "the sleep run's process running", func() (bool, string) {
		runs, err := cl.c.JobRuns(ctx, "default", "web")
		if err != nil {
			return false, err.Error()
		}
		for _, r := range runs {
			if len(r.Command) == 2 && r.Command[0] == "sleep" && r.State == "running" && len(cl.workloadPIDs(t)[r.WorkloadID]) > 0 {
				sleeping = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", runs)
	})
	if err := bg.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bgDone:
		bgDone <- nil // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatalf("berth run did not end within 60 s of an interrupt\n%s", bgErr.String())
	}
	if code := bg.ProcessState.ExitCode(); code != 130 || !strings.Contains(bgErr.String(), "cancelled") {
		t.Errorf("interrupted berth run: exit %d, want 130\n%s", code, bgErr.String())
	}
	if r, err := cl.c.GetJobRun(ctx, "default", sleeping.Name()); err != nil || r.State != "cancelled" {
		t.Errorf("the interrupted run: %+v %v; want cancelled", r, err)
	}
	waitFor(t, 30*time.Second, "the cancelled run's process gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)[sleeping.WorkloadID]
		return len(pids) == 0, fmt.Sprint(pids)
	})

	// -i is refused, saying why.
	if _, stderr, code := cl.runCLI(t, "run", "-i", "web", "--", "sh"); code != 1 || !strings.Contains(stderr, "cannot attach stdin") {
		t.Errorf("berth run -i: exit %d, stderr %q; want 1 and the refusal", code, stderr)
	}
}
