package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestPlacementRequirements runs three fake-driver nodes labelled differently (a: eu, disk=ssd;
// b: eu, disk=hdd; c: us, disk=ssd) and checks the placement decider end to end
// (docs/placement.md): a node_selector lands replicas only on matching nodes, anti-affinity
// keeps a service off the nodes of another, and a replica that fits nowhere waits with the
// decider's reason in its verdict, an event, and `berth placement explain`.
func TestPlacementRequirements(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	a := startFakeNode(t, cl, "a", "--region", "eu", "--label", "disk=ssd")
	b := startFakeNode(t, cl, "b", "--region", "eu", "--label", "disk=hdd")
	c := startFakeNode(t, cl, "c", "--region", "us", "--label", "disk=ssd")
	waitNodes(t, cl, a, b, c)
	cl.pushBundle(t, env.helloDir, "hello")
	apply := func(name string, replicas int, sc client.Scheduling, res *client.Resources) {
		t.Helper()
		if _, err := cl.c.ApplyService(ctx, "default", name, client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
			Replicas: &replicas, Scheduling: sc, Resources: res}); err != nil {
			t.Fatalf("apply %s: %v", name, err)
		}
	}
	// nodesOf waits until svc has want workloads running and returns the node of each.
	nodesOf := func(svc string, want int) map[string]int {
		t.Helper()
		var on map[string]int
		waitFor(t, converge, svc+" running", func() (bool, string) {
			ws, err := cl.c.ListWorkloads(ctx, "default")
			if err != nil {
				return false, err.Error()
			}
			on = map[string]int{}
			running := 0
			for _, w := range ws {
				if w.Service == svc && w.DesiredStatus == "running" {
					on[w.NodeID]++
					if w.ObservedStatus == "running" {
						running++
					}
				}
			}
			return running == want, fmt.Sprintf("%d of %d running, on %v", running, want, on)
		})
		return on
	}

	// A selector: 4 replicas on disk=ssd land on a and c only, never b.
	apply("ssd", 4, client.Scheduling{NodeSelector: map[string]string{"disk": "ssd"}}, nil)
	on := nodesOf("ssd", 4)
	if on[b.id] != 0 || on[a.id] == 0 || on[c.id] == 0 {
		t.Fatalf("ssd replicas on %v; want them spread over a (%s) and c (%s), none on b (%s)", on, a.id, c.id, b.id)
	}

	// Region and selector together: only a qualifies.
	apply("db", 1, client.Scheduling{Region: "eu", NodeSelector: map[string]string{"disk": "ssd"}}, nil)
	if on := nodesOf("db", 1); on[a.id] != 1 {
		t.Fatalf("db on %v, want a (%s)", on, a.id)
	}
	// Anti-affinity: web avoids db, so its replicas go to b and c, never a.
	apply("web", 2, client.Scheduling{AntiAffinity: []string{"db"}, MaxPerNode: 1}, nil)
	on = nodesOf("web", 2)
	if on[a.id] != 0 || on[b.id] != 1 || on[c.id] != 1 {
		t.Fatalf("web replicas on %v; want one each on b (%s) and c (%s), none next to db on a (%s)", on, b.id, c.id, a.id)
	}

	// Unplaceable: two replicas that need a gpu no node declares wait with the reason.
	apply("gpu", 2, client.Scheduling{Region: "eu"}, &client.Resources{Extended: map[string]int64{"gpu": 1}})
	want := "unplaceable: needs gpu 1, largest free 0 on 2 nodes matching region=eu"
	waitFor(t, converge, "gpu waiting unplaceable", func() (bool, string) {
		s, err := cl.c.GetService(ctx, "default", "gpu")
		if err != nil {
			return false, err.Error()
		}
		return s.Verdict != nil && s.Verdict.State == "waiting" && s.Verdict.Reason == want, fmt.Sprintf("verdict %+v", s.Verdict)
	})
	ws, err := cl.c.ListWorkloads(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Service == "gpu" {
			t.Fatalf("an unplaceable replica has a workload: %+v", w)
		}
	}
	waitFor(t, converge, "a placement.unplaceable event", func() (bool, string) {
		evs, err := cl.c.Events(ctx, 0, "placement.unplaceable")
		if err != nil {
			return false, err.Error()
		}
		return len(evs) > 0, fmt.Sprintf("%d events", len(evs))
	})
	out := cl.cli(t, "placement", "explain", "default/gpu", "--all")
	for _, w := range []string{"replica 0: unplaceable: needs gpu 1, largest free 0 on 2 nodes matching region=eu",
		a.id + "   capacity", "needs gpu 1, gpu 0 free", c.id + "   region"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(w), " ")) {
			t.Fatalf("placement explain lacks %q:\n%s", w, out)
		}
	}
	out = cl.cli(t, "placement", "explain", "web")
	if !strings.Contains(out, "stands on") || !strings.Contains(out, "anti_affinity") {
		t.Fatalf("placement explain web:\n%s", out)
	}
}
