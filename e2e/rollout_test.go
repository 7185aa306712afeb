package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// startProcessAgent enrolls a node named name and runs its agent with the process driver.
func startProcessAgent(t *testing.T, cl *cluster, name string) {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cl.dir, "agent-"+name)
	logPath := filepath.Join(cl.dir, "agent-"+name+".log")
	enroll := start(t, logPath, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", dir, "--label", "name="+name)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("enroll %s exited %d:\n%s", name, code, b)
	}
	start(t, logPath, "berth-agent", "run", "--data-dir", dir)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("---- agent %s (tail) ----\n%s", name, b)
		}
	})
}

// crashingBundle writes a release whose ./hello exits at once with status 3.
func crashingBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("#!/bin/sh\necho 'release refuses to start' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (cl *cluster) verdict(t *testing.T, name string) string {
	t.Helper()
	s, err := cl.c.GetService(context.Background(), "default", name)
	if err != nil || s.Verdict == nil {
		return fmt.Sprint(err)
	}
	return s.Verdict.String()
}

// TestRolloutCrashingReleaseUndoAndDeletion runs docs/reconciliation.md with real agents and the
// process driver: a release that crashes on start rolls into one surge slot only, which backs off
// while both old replicas keep serving; `berth rollout undo` recovers; a deletion during a rollout stops
// everything and removes the service once the nodes acknowledged it.
func TestRolloutCrashingReleaseUndoAndDeletion(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startProcessAgent(t, cl, "a")
	startProcessAgent(t, cl, "b")
	waitFor(t, converge, "two nodes connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 2 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected" && ns[1].Status == "connected", fmt.Sprint(ns)
	})

	good := cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 2)
	cl.cli(t, "apply", "-f", spec)
	if out := cl.cli(t, "rollout", "status", "hello", "--timeout", "2m"); !strings.Contains(out, "converged") {
		t.Fatalf("rollout status:\n%s", out)
	}
	ids := cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)

	// A release that crashes on start: one surge slot takes it and backs off beside the old
	// replicas, which keep serving (max_surge 1, max_unavailable 0).
	cl.pushBundle(t, crashingBundle(t, filepath.Join(cl.dir, "bad")), "hello")
	cl.cli(t, "apply", "-f", spec)
	waitFor(t, converge, "waiting on the crash loop", func() (bool, string) {
		v := cl.verdict(t, "hello")
		return v == "waiting(crash-loop: exit 3)", v
	})
	var serving []string
	for _, w := range cl.workloads(t, "hello") {
		if w.ObservedStatus == "running" && w.Health == "passing" {
			serving = append(serving, w.ID)
		}
	}
	if len(serving) != 2 {
		t.Fatalf("serving %v during the failed rollout, want the two old replicas", serving)
	}
	cl.waitAnswering(t, "hello.localhost", serving)
	if out := cl.cli(t, "get", "slots", "hello"); !strings.Contains(out, "failed") {
		t.Fatalf("get slots shows no failed slot:\n%s", out)
	}
	st, err := cl.c.Rollout(ctx, "default", "hello")
	if err != nil || st.PreviousRelease != good || st.Outdated != 2 || st.Updated != 0 {
		t.Fatalf("rollout %+v %v", st, err)
	}

	// rollout undo: back to the good release, slot by slot, until converged.
	if out := cl.cli(t, "rollout", "undo", "hello"); !strings.Contains(out, good) {
		t.Fatalf("rollout undo:\n%s", out)
	}
	if out := cl.cli(t, "rollout", "status", "hello", "--timeout", "3m"); !strings.Contains(out, "converged") {
		t.Fatalf("rollout status after undo:\n%s", out)
	}
	ids = cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)

	// A deletion during a rollout: every slot stops at once, the route goes at once, and the
	// service is removed once both nodes acknowledged the stops and removals.
	changed := filepath.Join(cl.dir, "hello2")
	if err := os.MkdirAll(changed, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("cp", filepath.Join(env.helloDir, "hello"), filepath.Join(changed, "hello")).Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(changed, "VERSION"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cl.pushBundle(t, changed, "hello")
	cl.cli(t, "apply", "-f", spec)
	if out := cl.cli(t, "delete", "service", "hello"); !strings.Contains(out, "deleting") {
		t.Fatalf("delete:\n%s", out)
	}
	waitFor(t, converge, "the service removed", func() (bool, string) {
		_, err := cl.c.GetService(ctx, "default", "hello")
		return client.IsCode(err, "service_not_found"), fmt.Sprint(err)
	})
	waitFor(t, converge, "no workload process left", func() (bool, string) {
		pids := cl.workloadPIDs(t)
		return len(pids) == 0, fmt.Sprint(pids)
	})
	if ws := cl.workloads(t, "hello"); len(ws) != 0 {
		t.Fatalf("workloads left: %+v", ws)
	}
}
