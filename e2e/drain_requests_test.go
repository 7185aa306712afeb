package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// nodesOf counts the workloads of service by node.
func (cl *cluster) nodesOf(t *testing.T, service string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, w := range cl.workloads(t, service) {
		out[w.NodeID]++
	}
	return out
}

// TestRebalanceAndDrainFailNoRequest runs a two-replica portable service through the gateway
// while its replicas move twice, with a bounded request loop (count and time bounded, see
// startRequestLoop) running throughout. First both replicas run on node-a; node-b joins and takes
// nothing until `berth rebalance` moves one replica there. Then node-c joins and `berth node
// drain node-a` moves node-a's replica to node-c. Each move starts the successor on the new node,
// waits until it is ready and routed, and only then stops the old one: every request answers 200,
// the replicas end on node-b and node-c, and node-a runs nothing of the service.
func TestRebalanceAndDrainFailNoRequest(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	a := cl.enrollNamed(t, "node-a")
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 2)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)
	if on := cl.nodesOf(t, "hello"); on[a.ID] != 2 {
		t.Fatalf("both replicas should run on the only node %s: %v", a.ID, on)
	}

	loop := cl.startRequestLoop("hello.localhost")
	t.Cleanup(func() { loop.finish() })
	loop.waitMore(t, 20, "requests through the gateway before any move")

	// node-b joins: it takes no running replica by itself.
	b := cl.enrollNamed(t, "node-b")
	if on := cl.nodesOf(t, "hello"); on[a.ID] != 2 {
		t.Fatalf("a node that joined took a running replica: %v", on)
	}
	out := cl.cli(t, "rebalance", "hello", "--dry-run")
	if !strings.Contains(out, "dry run") || !strings.Contains(out, b.ID) || !strings.Contains(out, a.ID) {
		t.Fatalf("rebalance --dry-run printed:\n%s", out)
	}
	var res client.RebalanceResult
	if err := json.Unmarshal([]byte(cl.cli(t, "rebalance", "hello", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Recorded || len(res.Moves) != 1 || res.Moves[0].From != a.ID || res.Moves[0].To != b.ID {
		t.Fatalf("rebalance answered %+v", res)
	}
	waitFor(t, 3*converge, "one replica on each of node-a and node-b", func() (bool, string) {
		on := cl.nodesOf(t, "hello")
		st, err := cl.c.Rollout(ctx, "default", "hello")
		if err != nil {
			return false, err.Error()
		}
		return on[a.ID] == 1 && on[b.ID] == 1 && len(on) == 2 && st.Verdict.State == "converged", fmt.Sprintf("%v %+v", on, st.Verdict)
	})
	ids = cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)
	if out := cl.cli(t, "rebalance", "hello"); !strings.Contains(out, "nothing to move") {
		t.Fatalf("a second rebalance printed:\n%s", out)
	}
	loop.waitMore(t, 20, "requests through the gateway after the rebalance")

	// node-c joins; node-a drains: its replica moves to node-c.
	c := cl.enrollNamed(t, "node-c")
	if out := cl.cli(t, "node", "drain", a.ID, "--deadline", "3m"); !strings.Contains(out, "drained") {
		t.Fatalf("node drain printed:\n%s", out)
	}
	ids = cl.waitReplicas(t, "hello", 2)
	if on := cl.nodesOf(t, "hello"); on[b.ID] != 1 || on[c.ID] != 1 || on[a.ID] != 0 {
		t.Fatalf("after the drain the replicas run on %v; want one on node-b %s and one on node-c %s, none on node-a %s", on, b.ID, c.ID, a.ID)
	}
	cl.waitAnswering(t, "hello.localhost", ids)
	loop.waitMore(t, 20, "requests through the gateway after the drain")
	got, err := cl.c.GetNode(ctx, a.ID)
	if err != nil || got.Drain == nil || got.Drain.State != "drained" || len(got.Drain.Remaining) != 0 {
		t.Fatalf("node-a after the drain: %+v %v", got, err)
	}

	ok, failed, firstErr := loop.finish()
	t.Logf("%d requests through the gateway answered 200 across the rebalance and the drain", ok)
	if failed > 0 {
		t.Fatalf("%d of %d requests failed while replicas moved; the first: %s", failed, ok+failed, firstErr)
	}
}
