package rollout_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/slots"
)

// slotNodes returns the node of every slot of service id that has not settled, by replica.
func (h *harness) slotNodes(id string) map[string]string {
	h.t.Helper()
	set, err := h.rs.Slots(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range set.Slots {
		if r.Generation != int(slots.GenRemove) || r.Acked != int(slots.GenRemove) {
			out[r.Replica] = r.NodeID
		}
	}
	return out
}

// TestCordonAndDrainMoveScheduledReplicas: a cordoned node gets no new replica while what runs on
// it stays; a drained node's replicas are placed on other schedulable nodes and removed from it
// through its receipts, the drain's progress lists them until none is left; uncordon returns the
// node to placement without moving anything back.
func TestCordonAndDrainMoveScheduledReplicas(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.put("sha256:a", 2)
	h.until(10, "converged", h.converged(svc.ID), nil)
	on := map[string]int{}
	for _, id := range h.slotNodes(svc.ID) {
		on[id]++
	}
	var empty, busy string
	for _, n := range h.nodes {
		if on[n.ID] == 0 && empty == "" {
			empty = n.ID
		} else if on[n.ID] > 0 && busy == "" {
			busy = n.ID
		}
	}
	if empty == "" || busy == "" {
		t.Fatalf("2 replicas on 3 nodes left no empty node: %v", on)
	}

	// Cordon the empty node and the busy one: the busy one keeps its replica, and a third replica
	// lands on the one node left.
	for _, id := range []string{empty, busy} {
		if _, err := h.reg.Cordon(h.ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	svc = h.put("sha256:a", 3)
	h.until(10, "converged on 3 replicas", func() bool { return h.converged(svc.ID)() && len(h.slotNodes(svc.ID)) == 3 }, nil)
	for r, id := range h.slotNodes(svc.ID) {
		if id == empty {
			t.Fatalf("replica %s was placed on the cordoned node %s", r, id)
		}
	}
	if got := h.slotNodes(svc.ID); !containsValue(got, busy) {
		t.Fatalf("the cordoned node's replica moved: %v", got)
	}

	// Drain the busy node: its replica moves to the only schedulable node.
	views := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}
	n, err := h.reg.StartDrain(h.ctx, busy, h.clk.Now().Add(600e9))
	if err != nil {
		t.Fatal(err)
	}
	p, err := views.DrainProgress(h.ctx, n, nil, h.clk.Now())
	if err != nil || p == nil || p.State != rollout.DrainDraining || len(p.Remaining) == 0 || p.Remaining[0].Kind != "replica" || p.Remaining[0].Service != "default/web" {
		t.Fatalf("progress right after the drain began: %+v %v", p, err)
	}
	h.until(20, "the drained node emptied", func() bool {
		return h.converged(svc.ID)() && !containsValue(h.slotNodes(svc.ID), busy) && len(h.slotNodes(svc.ID)) == 3
	}, nil)
	for r, id := range h.slotNodes(svc.ID) {
		if id == busy || id == empty {
			t.Fatalf("replica %s on %s after the drain; only the third node is schedulable", r, id)
		}
	}
	n, _ = h.reg.Get(h.ctx, busy)
	if p, err = views.DrainProgress(h.ctx, n, nil, h.clk.Now()); err != nil || p.State != rollout.DrainDrained || len(p.Remaining) != 0 {
		t.Fatalf("progress once nothing is left: %+v %v", p, err)
	}

	// Uncordon both: nothing moves back by itself.
	before := h.slotNodes(svc.ID)
	for _, id := range []string{empty, busy} {
		if _, err := h.reg.Cordon(h.ctx, id, false); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		h.step()
	}
	if after := h.slotNodes(svc.ID); len(after) != len(before) || !sameMap(before, after) {
		t.Fatalf("uncordon moved replicas: %v, was %v", after, before)
	}
}

// leaseSender stands for the node sessions (core/session) in the reconciler: it records what was
// sent and answers a revoke as a cooperating agent does (it stops the lease's workloads, then
// answers ok, which frees the lease).
type leaseSender struct {
	h       *harness
	mu      sync.Mutex
	revokes []string // "<node> <reason> <token>"
}

func (s *leaseSender) SendLeaseGrant(context.Context, string, *fencing.Lease) {}

func (s *leaseSender) RevokeLease(ctx context.Context, nodeID string, l *fencing.Lease, reason string) {
	s.mu.Lock()
	s.revokes = append(s.revokes, nodeID+" "+reason)
	s.mu.Unlock()
	if reason == node.RevokeDrain && l.Holder == nodeID {
		if _, err := s.h.auth.Release(ctx, l.ID, nodeID, l.FencingToken); err != nil {
			s.h.t.Errorf("release after the drain's revoke: %v", err)
		}
	}
}

var _ reconciler.LeaseSender = (*leaseSender)(nil)

// TestDrainHandsLeaseOverInOrder: draining the holder of a stateful service's local lease (which
// never moves by time) revokes it with reason drain; once the holder gave it back the lease is
// granted to the other node under the next token, and the service runs there, never on both.
func TestDrainHandsLeaseOverInOrder(t *testing.T) {
	h := newHarnessOpts(t, 2, nil, true)
	ls := &leaseSender{h: h}
	h.rec = reconciler.New(reconciler.Config{Catalog: h.cat, Nodes: h.reg, Routes: h.sink, Compiler: routes.Native{}, Rollout: h.prod, Leases: h.auth, LeaseSender: ls})
	svc := h.putStateful("sha256:a")
	h.until(10, "converged", h.converged(svc.ID), nil)
	l, err := h.auth.Get(h.ctx, fencing.LeaseID(svc.ID))
	if err != nil || l.Holder == "" {
		t.Fatalf("lease: %+v %v", l, err)
	}
	holder, token := l.Holder, l.FencingToken
	if _, err := h.reg.StartDrain(h.ctx, holder, h.clk.Now().Add(600e9)); err != nil {
		t.Fatal(err)
	}
	other := h.nodes[0].ID
	if other == holder {
		other = h.nodes[1].ID
	}
	h.until(20, "the service moved to the other node", func() bool {
		got, _ := h.auth.Get(h.ctx, l.ID)
		return got.Holder == other && h.converged(svc.ID)() && len(h.specWorkloads(other, svc.ID)) == 1 && len(h.specWorkloads(holder, svc.ID)) == 0
	}, func() {
		running := 0
		for _, n := range h.nodes {
			for _, w := range h.specWorkloads(n.ID, svc.ID) {
				if w.DesiredStatus == node.DesiredRunning {
					running++
				}
			}
		}
		if running > 1 {
			t.Fatalf("the stateful service is desired running on %d nodes during the handover", running)
		}
	})
	got, _ := h.auth.Get(h.ctx, l.ID)
	if got.FencingToken != token+1 {
		t.Fatalf("token after the handover %d, want %d", got.FencingToken, token+1)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.revokes) == 0 || ls.revokes[0] != holder+" "+node.RevokeDrain {
		t.Fatalf("revokes sent: %v, want first %q", ls.revokes, holder+" "+node.RevokeDrain)
	}
}

func containsValue(m map[string]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

func sameMap(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return len(a) == len(b)
}

// TestDrainWithNowhereToGoKeepsReplicas: draining the only node stops nothing: its replicas stay,
// the drain lists them as remaining, and they move once another node can take them.
func TestDrainWithNowhereToGoKeepsReplicas(t *testing.T) {
	h := newHarness(t, 2)
	other := h.nodes[1].ID
	if _, err := h.reg.Cordon(h.ctx, other, true); err != nil {
		t.Fatal(err)
	}
	svc := h.put("sha256:a", 2)
	h.until(10, "converged", h.converged(svc.ID), nil)
	only := h.nodes[0].ID
	n, err := h.reg.StartDrain(h.ctx, only, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		h.step()
		if got := h.serving(svc)["sha256:a"]; got != 2 {
			t.Fatalf("%d replicas serving while the only schedulable node drains, want both kept", got)
		}
	}
	views := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}
	if p, err := views.DrainProgress(h.ctx, n, nil, h.clk.Now()); err != nil || p.State != rollout.DrainDraining || len(p.Remaining) != 2 {
		t.Fatalf("progress with nowhere to go: %+v %v", p, err)
	}
	if _, err := h.reg.Cordon(h.ctx, other, false); err != nil {
		t.Fatal(err)
	}
	h.until(20, "both replicas moved", func() bool {
		// A moved replica runs in its second slot name ("0~") after a surging rollout.
		got := map[string]string{}
		for slot, node := range h.slotNodes(svc.ID) {
			got[slots.BaseReplica(slot)] = node
		}
		return h.converged(svc.ID)() && len(h.slotNodes(svc.ID)) == 2 && got["0"] == other && got["1"] == other
	}, nil)
}

// TestDrainKeepsLeaseWithNowhereToGo: the drained holder of a stateful service keeps its lease,
// and the service keeps running, while no other node is schedulable; it is handed over once one is.
func TestDrainKeepsLeaseWithNowhereToGo(t *testing.T) {
	h := newHarnessOpts(t, 2, nil, true)
	ls := &leaseSender{h: h}
	h.rec = reconciler.New(reconciler.Config{Catalog: h.cat, Nodes: h.reg, Routes: h.sink, Compiler: routes.Native{}, Rollout: h.prod, Leases: h.auth, LeaseSender: ls})
	svc := h.putStateful("sha256:a")
	h.until(10, "converged", h.converged(svc.ID), nil)
	l, _ := h.auth.Get(h.ctx, fencing.LeaseID(svc.ID))
	holder, other := l.Holder, h.nodes[0].ID
	if other == holder {
		other = h.nodes[1].ID
	}
	if _, err := h.reg.Cordon(h.ctx, other, true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reg.StartDrain(h.ctx, holder, time.Time{}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		h.step()
	}
	if got, _ := h.auth.Get(h.ctx, l.ID); got.Holder != holder || got.FencingToken != l.FencingToken || len(h.specWorkloads(holder, svc.ID)) != 1 {
		t.Fatalf("with nowhere to go the lease moved or the service stopped: %+v", got)
	}
	if _, err := h.reg.Cordon(h.ctx, other, false); err != nil {
		t.Fatal(err)
	}
	h.until(20, "handed over", func() bool {
		got, _ := h.auth.Get(h.ctx, l.ID)
		return got.Holder == other && h.converged(svc.ID)()
	}, nil)
}
