package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneReplicaRedeployFailsNoRequest redeploys a one-replica service twice, once with a new
// release and once with `berth rollout restart`, while a bounded loop of requests runs through
// the gateway: under the default rollout (max_surge 1, max_unavailable 0) the successor starts
// beside the replica, is probed ready, and only then does the old one stop, so every request
// answers 200.
func TestOneReplicaRedeployFailsNoRequest(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	startProcessAgent(t, cl, "a")
	waitFor(t, converge, "the node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", fmt.Sprint(ns)
	})
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	first := cl.waitReplicas(t, "hello", 1)
	cl.waitAnswering(t, "hello.localhost", first)

	// One request after the other, each 2xx or a failure (bounded in count and time: see
	// startRequestLoop).
	loop := cl.startRequestLoop("hello.localhost")
	t.Cleanup(func() { loop.finish() })
	loop.waitMore(t, 20, "requests through the gateway before the redeploy")

	// A new release (the same program with another VERSION file).
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
	var second []string
	waitFor(t, 3*converge, "the new release serving", func() (bool, string) {
		ids := cl.workloadIDs(t, "hello")
		st, err := cl.c.Rollout(ctx, "default", "hello")
		if err != nil || st.Verdict.State != "converged" || st.Updated != 1 || st.Outdated != 0 || len(ids) != 1 || ids[0] == first[0] {
			return false, fmt.Sprintf("%+v %v %v", st, ids, err)
		}
		second = ids
		return true, ""
	})
	cl.waitAnswering(t, "hello.localhost", second)

	// A restart: the same release and configuration, a new run.
	if out := cl.cli(t, "rollout", "restart", "hello"); !strings.Contains(out, "restart generation 1") {
		t.Fatalf("rollout restart:\n%s", out)
	}
	var third []string
	waitFor(t, 3*converge, "the restarted replica serving", func() (bool, string) {
		ids := cl.workloadIDs(t, "hello")
		st, err := cl.c.Rollout(ctx, "default", "hello")
		if err != nil || st.Verdict.State != "converged" || st.Updated != 1 || len(ids) != 1 || ids[0] == second[0] {
			return false, fmt.Sprintf("%+v %v %v", st, ids, err)
		}
		third = ids
		return true, ""
	})
	cl.waitAnswering(t, "hello.localhost", third)
	loop.waitMore(t, 20, "requests through the gateway after the restart")
	ok, failed, firstErr := loop.finish()
	t.Logf("%d requests through the gateway answered 200 across both redeploys", ok)
	if failed > 0 {
		t.Fatalf("%d of %d requests failed during the redeploys; the first: %s", failed, ok+failed, firstErr)
	}
}
