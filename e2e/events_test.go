package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// reconcilePasses reads berthd's berth_reconcile_passes_total by kind.
func (cl *cluster) reconcilePasses(t *testing.T) map[string]int {
	t.Helper()
	resp, err := cl.hc.Get(cl.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `berth_reconcile_passes_total{kind="`)
		if !ok {
			continue
		}
		kind, val, _ := strings.Cut(line, `"} `)
		n, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", sc.Text(), err)
		}
		out[kind] = int(n)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok := out["full"]; !ok {
		t.Fatal("/metrics has no berth_reconcile_passes_total")
	}
	return out
}

// TestApplyAndDeleteWithoutSweep shows that a service's change is carried by the events it
// causes, not by the sweep (docs/reconciliation.md section 6): with every sweep wait set to an
// hour, so that no full pass can run after the first, an apply reaches the node, runs, is served
// through the gateway, and a deletion withdraws the route and stops the workload. The pass
// counter shows that only focused passes did it.
func TestApplyAndDeleteWithoutSweep(t *testing.T) {
	t.Parallel()
	cl := newClusterWith(t, "--sweep-floor", "1h", "--sweep-period", "1h", "--sweep-quiet", "1h")
	ctx := context.Background()
	startProcessAgent(t, cl, "a")
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", ns[0].Status
	})
	before := cl.reconcilePasses(t)
	if before["full"] != 1 {
		t.Fatalf("full passes before the apply = %d, want the first one only", before["full"])
	}

	cl.pushBundle(t, env.helloDir, "hello")
	replicas := 1
	if _, err := cl.c.ApplyService(ctx, "default", "hello", client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
		Domains: []string{"hello.localhost"}, Replicas: &replicas, HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}); err != nil {
		t.Fatal(err)
	}
	ids := cl.waitReplicas(t, "hello", 1)
	cl.waitAnswering(t, "hello.localhost", ids)
	mid := cl.reconcilePasses(t)
	if mid["full"] != 1 || mid["focused"] <= before["focused"] {
		t.Fatalf("passes after the apply %v (before %v): want no full pass and at least one focused", mid, before)
	}

	if err := cl.c.DeleteService(ctx, "default", "hello", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "route of the deleted service withdrawn", func() (bool, string) {
		resp, err := cl.get("hello.localhost", "/")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusNotFound, resp.Status
	})
	waitFor(t, converge, "the deleted service's process gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)
		return len(pids) == 0, fmt.Sprint(pids)
	})
	after := cl.reconcilePasses(t)
	if after["full"] != 1 {
		t.Fatalf("passes after the deletion %v: a full pass ran, want only focused ones", after)
	}
}

// newClusterWith is newCluster with extra berthd flags (later flags win).
func newClusterWith(t *testing.T, extra ...string) *cluster {
	t.Helper()
	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t), extra: extra}
	// Registered first, so it runs last (as newCluster's): a berthd killed with SIGKILL leaves
	// its gateway behind by design.
	t.Cleanup(func() { cl.killWorkloads(t); cl.killGateway(t) })
	startBerthd(t, cl)
	t.Cleanup(func() { cl.dumpLogs(t) })
	return cl
}
