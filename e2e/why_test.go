package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// exitingBundle writes a release whose ./app exits at once with status code.
func exitingBundle(t *testing.T, dir string, code int) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\necho 'release gives up' >&2\nexit %d\n", code)
	if err := os.WriteFile(filepath.Join(dir, "app"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hogBundle writes a release whose ./app doubles a shell string 24 times (256 MiB, more with the
// shell's copies), then sleeps: over any limit of a few MiB, and bounded where none is set.
func hogBundle(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\nx=0123456789abcdef\ni=0\nwhile [ $i -lt 24 ]; do x=\"$x$x\"; i=$((i+1)); done\nsleep 600\n"
	if err := os.WriteFile(filepath.Join(dir, "app"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rolloutJSON is `berth rollout status NAME --watch=false -o json`.
func (cl *cluster) rolloutJSON(t *testing.T, name string) client.RolloutStatus {
	t.Helper()
	var st client.RolloutStatus
	if err := json.Unmarshal([]byte(cl.cli(t, "rollout", "status", name, "--watch=false", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// waitSaysWhy waits until `get services`, `describe service` and `rollout status -o json` all
// name the reason the service waits on, and the failure of the slot it waits on.
func (cl *cluster) waitSaysWhy(t *testing.T, name, reason, failure string) {
	t.Helper()
	waitFor(t, 2*converge, name+" waiting("+reason+")", func() (bool, string) {
		if v := cl.verdict(t, name); v != "waiting("+reason+")" {
			return false, "verdict " + v
		}
		return true, ""
	})
	for _, line := range strings.Split(cl.cli(t, "get", "services"), "\n") {
		if strings.HasPrefix(line, name+" ") && !strings.Contains(line, "waiting("+reason+")") {
			t.Errorf("get services: %q does not say waiting(%s)", line, reason)
		}
	}
	desc := cl.cli(t, "describe", "service", name)
	if !strings.Contains(desc, "waiting("+reason+")") || !strings.Contains(desc, "last failure: "+failure) {
		t.Errorf("describe service %s says neither waiting(%s) nor last failure %q:\n%s", name, reason, failure, desc)
	}
	wls := cl.cli(t, "get", "workloads")
	if !strings.Contains(wls, failure) {
		t.Errorf("get workloads does not name %q:\n%s", failure, wls)
	}
	st := cl.rolloutJSON(t, name)
	if st.Verdict.State != "waiting" || st.Verdict.Reason != reason {
		t.Errorf("rollout status verdict %s, want waiting(%s)", st.Verdict.String(), reason)
	}
	if w := st.WaitingOn; w == nil || w.Replica != "0" || w.Reason != reason || w.LastFailure == nil || w.LastFailure.String() != failure {
		t.Errorf("rollout status waiting_on %+v, want slot 0 waiting on %s with last failure %s", w, reason, failure)
	}
}

// TestSayWhyAndAutoRollback deploys go-httpbin, rolls it to a health check that answers 404 and
// a second service to a release that exits 2, checks that get services, describe and rollout
// status name the exact reason, and that the progress deadline with auto_rollback brings the
// previous release back (docs/reconciliation.md sections 7.1 and 7.2).
func TestSayWhyAndAutoRollback(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startProcessAgent(t, cl, "a")
	cl.pushBundle(t, env.httpbinDir, "httpbin")
	cl.pushBundle(t, exitingBundle(t, filepath.Join(t.TempDir(), "exit2"), 2), "exit2")
	one := 1
	good := client.ServiceSpec{Bundle: "httpbin", Command: []string{"./go-httpbin"}, Replicas: &one,
		HealthCheck: client.HealthCheck{Path: "/status/200", IntervalS: 1}}
	for _, name := range []string{"web", "crash"} {
		if _, err := cl.c.ApplyService(ctx, "default", name, good); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"web", "crash"} {
		waitFor(t, 2*converge, name+" converged", func() (bool, string) {
			v := cl.verdict(t, name)
			return v == "converged", v
		})
	}

	// A health check that answers 404: the run is up and never ready.
	bad := good
	bad.HealthCheck.Path = "/status/404"
	if _, err := cl.c.ApplyService(ctx, "default", "web", bad); err != nil {
		t.Fatal(err)
	}
	cl.waitSaysWhy(t, "web", "unhealthy: probe /status/404 -> 404", "probe /status/404 -> 404")

	// A release that exits 2: the slot crash-loops, across its attempts.
	crash := good
	crash.Bundle, crash.Command = "exit2", []string{"./app"}
	if _, err := cl.c.ApplyService(ctx, "default", "crash", crash); err != nil {
		t.Fatal(err)
	}
	cl.waitSaysWhy(t, "crash", "crash-loop: exit 2", "exit 2")
	// Its output is read by slot, now and from the attempt before (kept by the node after it
	// removed that workload, whose id the slot no longer names).
	if out := cl.cli(t, "logs", "crash/0"); !strings.Contains(out, "release gives up") {
		t.Errorf("berth logs crash/0:\n%s", out)
	}
	waitFor(t, 2*converge, "berth logs crash --previous shows the exited attempt", func() (bool, string) {
		out, errOut, code := cl.berth(t, cl.token, "", "logs", "crash", "--previous")
		return code == 0 && strings.Contains(out, "release gives up"), out + errOut
	})

	// A release that grows without bound under a 32 MiB limit: the process driver runs it in
	// its memory cgroup (the agent runs as root here), the kernel's OOM killer ends it, and
	// every view names oom, not a bare exit 137 (docs/placement.md section 4).
	// The limit is the runtime spec's (docs/reconciliation.md section 1), written before the
	// replica exists, so the release never runs unlimited.
	zero := 0
	hog := good
	hog.Bundle, hog.Command, hog.Replicas = "hog", []string{"./app"}, &zero
	cl.pushBundle(t, hogBundle(t, filepath.Join(t.TempDir(), "hog")), "hog")
	if _, err := cl.c.ApplyService(ctx, "default", "hog", hog); err != nil {
		t.Fatal(err)
	}
	doc, err := cl.c.GetRuntimeSpec(ctx, "default", "hog")
	if err != nil {
		t.Fatal(err)
	}
	rs := doc.Spec
	rs.Replicas.Total, rs.Resources.MemoryBytes = 1, 32<<20
	if _, err := cl.c.PutRuntimeSpec(ctx, "default", "hog", client.SpecWrite{Spec: rs} /* no operator spec was read */); err != nil {
		t.Fatal(err)
	}
	cl.waitSaysWhy(t, "hog", "crash-loop: oom", "oom: killed by the OOM killer over its memory limit")

	// A short progress deadline with auto_rollback: the stalled rollout of web is failed, an
	// event says so, and the previous release (health check /status/200) comes back.
	bad.ProgressDeadlineS, bad.AutoRollback = 3, true
	applied, err := cl.c.ApplyService(ctx, "default", "web", bad)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*converge, "web rolled back and converged", func() (bool, string) {
		s, err := cl.c.GetService(ctx, "default", "web")
		if err != nil {
			return false, err.Error()
		}
		return s.RollbackOf == applied.Revision && s.HealthCheck.Path == "/status/200" && s.Verdict != nil && s.Verdict.String() == "converged",
			fmt.Sprintf("revision %d rollback_of %d path %s verdict %v", s.Revision, s.RollbackOf, s.HealthCheck.Path, s.Verdict)
	})
	evs, err := cl.c.Events(ctx, 0, "rollout.failed")
	if err != nil {
		t.Fatal(err)
	}
	var was string
	if len(evs) == 1 {
		_ = json.Unmarshal(evs[0].Event.Data["verdict"], &was)
	}
	if len(evs) != 1 || evs[0].Event.Subject.ID != applied.ID || string(evs[0].Event.Data["auto_rollback"]) != "true" ||
		was != "waiting(unhealthy: probe /status/404 -> 404)" {
		t.Fatalf("rollout.failed events (verdict %q): %+v", was, evs)
	}
	if st := cl.rolloutJSON(t, "web"); st.WaitingOn != nil || st.Updated != 1 {
		t.Fatalf("after the rollback: %+v", st)
	}
}
