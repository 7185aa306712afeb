package rollout_test

import (
	"testing"

	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// rebalance plans a rebalance of svc and, unless dryRun or the plan matches what the service
// carries, records it through the deployer as the API does; it returns the plan and whether
// it wrote.
func (h *harness) rebalance(d *deploy.Deployer, svc *services.Service, dryRun bool) (*rollout.RebalancePlan, bool) {
	h.t.Helper()
	cur, err := h.cat.GetService(h.ctx, h.p, svc.Name)
	if err != nil {
		h.t.Fatal(err)
	}
	plan, err := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}.Rebalance(h.ctx, cur)
	if err != nil {
		h.t.Fatal(err)
	}
	if dryRun || !plan.NeedsWrite() {
		return plan, false
	}
	res, err := d.Rebalance(h.ctx, deploy.Change{Project: h.p, Service: cur.Name, ExpectedRevision: &cur.Revision}, plan.Recorded())
	if err != nil {
		h.t.Fatal(err)
	}
	return plan, res.Changed()
}

func (h *harness) revision(svc *services.Service) int64 {
	h.t.Helper()
	cur, err := h.cat.GetService(h.ctx, h.p, svc.Name)
	if err != nil {
		h.t.Fatal(err)
	}
	return cur.Revision
}

// TestRebalanceMovesOneReplicaToTheNewNode: three replicas on two nodes and a third node that
// joined later (it takes nothing by itself). A dry run names one move to the new node and writes
// nothing; the rebalance records it on the service (cause rollout.rebalance) and the rollout
// carries it out successor first (three replicas serve throughout), moving exactly one replica;
// a second rebalance moves and writes nothing.
func TestRebalanceMovesOneReplicaToTheNewNode(t *testing.T) {
	h := newHarness(t, 2)
	d := deploy.New(deploy.Config{Catalog: h.cat, Runtime: h.rs})
	svc := h.put("sha256:a", 3)
	h.until(10, "converged", h.converged(svc.ID), nil)
	newcomer := h.enrollLabelled(nil)
	for range 3 {
		h.step()
	}
	before := h.slotNodes(svc.ID)
	if containsValue(before, newcomer.ID) {
		t.Fatalf("the node that joined took a running replica: %v", before)
	}
	on := map[string]int{}
	for _, id := range before {
		on[id]++
	}
	if len(before) != 3 || len(on) != 2 {
		t.Fatalf("3 replicas on 2 nodes expected before the rebalance: %v", before)
	}

	rev := h.revision(svc)
	plan, wrote := h.rebalance(d, svc, true)
	if wrote || len(plan.Moves) != 1 || plan.Moves[0].To != newcomer.ID || on[plan.Moves[0].From] != 2 || !plan.After.Less(plan.Before) || plan.Moves[0].Why == "" {
		t.Fatalf("dry run: %+v (wrote %v), replicas on %v", plan, wrote, before)
	}
	for range 3 {
		h.step()
	}
	if h.revision(svc) != rev || !sameMap(before, h.slotNodes(svc.ID)) {
		t.Fatalf("the dry run changed something: revision %d (was %d), slots %v (were %v)", h.revision(svc), rev, h.slotNodes(svc.ID), before)
	}

	plan, wrote = h.rebalance(d, svc, false)
	if !wrote || len(plan.Moves) != 1 {
		t.Fatalf("rebalance: %+v (wrote %v)", plan, wrote)
	}
	cur, _ := h.cat.GetService(h.ctx, h.p, svc.Name)
	if cur.Revision != rev+1 || cur.Rebalance == nil || cur.Rebalance.Generation != 1 || len(cur.Rebalance.Moves) != 1 ||
		cur.Reconcile == nil || cur.Reconcile.Cause != string(deploy.CauseRolloutRebalance) {
		t.Fatalf("the recorded rebalance: revision %d, %+v, reconcile %+v", cur.Revision, cur.Rebalance, cur.Reconcile)
	}
	// An apply of the same declaration writes nothing and keeps the record.
	if again := h.put("sha256:a", 3); again.Revision != cur.Revision || again.Rebalance == nil || again.Rebalance.Generation != 1 {
		t.Fatalf("an unchanged apply after the rebalance: revision %d (was %d), rebalance %+v", again.Revision, cur.Revision, again.Rebalance)
	}
	// Recording the same moves again writes nothing.
	if _, again := h.rebalance(d, svc, false); again {
		t.Fatal("a rebalance recording the moves already pending wrote again")
	}
	moved := plan.Moves[0]
	h.until(20, "the replica moved to the new node", func() bool {
		got := h.slotNodes(svc.ID)
		return h.converged(svc.ID)() && len(got) == 3 && containsValue(got, newcomer.ID)
	}, func() {
		if n := h.serving(svc)["sha256:a"]; n < 3 {
			t.Fatalf("%d replicas serving during the move; the successor must be ready before its predecessor stops", n)
		}
	})
	after := h.slotNodes(svc.ID)
	per := map[string]int{}
	for _, id := range after {
		per[id]++
	}
	if len(per) != 3 || per[newcomer.ID] != 1 {
		t.Fatalf("after the rebalance: %v", after)
	}
	changed := 0
	for slot, id := range after {
		r := slots.BaseReplica(slot) // a moved replica's successor is its surge slot ("2~")
		if before[r] != id {
			changed++
			if r != moved.Replica || id != moved.To {
				t.Fatalf("replica %s went to %s; the rebalance moved %s to %s", r, id, moved.Replica, moved.To)
			}
		}
	}
	if changed != 1 {
		t.Fatalf("%d replicas changed node, want exactly 1: %v, were %v", changed, after, before)
	}

	rev = h.revision(svc)
	plan, wrote = h.rebalance(d, svc, false)
	if wrote || len(plan.Moves) != 0 || h.revision(svc) != rev {
		t.Fatalf("a second rebalance: %+v (wrote %v, revision %d, was %d)", plan, wrote, h.revision(svc), rev)
	}
	for range 3 {
		h.step()
	}
	if !sameMap(after, h.slotNodes(svc.ID)) {
		t.Fatalf("replicas moved after the second rebalance: %v, were %v", h.slotNodes(svc.ID), after)
	}
}

// TestRebalanceNeverMovesToACordonedNode: a cordoned newcomer is no target of a rebalance, and a
// move recorded before the target was cordoned is not carried out while it is: the replica keeps
// its node.
func TestRebalanceNeverMovesToACordonedNode(t *testing.T) {
	h := newHarness(t, 2)
	d := deploy.New(deploy.Config{Catalog: h.cat, Runtime: h.rs})
	svc := h.put("sha256:a", 3)
	h.until(10, "converged", h.converged(svc.ID), nil)
	newcomer := h.enrollLabelled(nil)
	if _, err := h.reg.Cordon(h.ctx, newcomer.ID, true); err != nil {
		t.Fatal(err)
	}
	if plan, wrote := h.rebalance(d, svc, false); wrote || len(plan.Moves) != 0 {
		t.Fatalf("rebalance with the new node cordoned: %+v (wrote %v)", plan, wrote)
	}

	// Uncordoned, the move is recorded; cordoned again before any pass, it is not carried out.
	if _, err := h.reg.Cordon(h.ctx, newcomer.ID, false); err != nil {
		t.Fatal(err)
	}
	plan, wrote := h.rebalance(d, svc, false)
	if !wrote || len(plan.Moves) != 1 || plan.Moves[0].To != newcomer.ID {
		t.Fatalf("rebalance with the new node uncordoned: %+v (wrote %v)", plan, wrote)
	}
	if _, err := h.reg.Cordon(h.ctx, newcomer.ID, true); err != nil {
		t.Fatal(err)
	}
	before := h.slotNodes(svc.ID)
	for range 5 {
		h.step()
		if got := h.slotNodes(svc.ID); containsValue(got, newcomer.ID) {
			t.Fatalf("a replica was moved to the cordoned node %s: %v", newcomer.ID, got)
		}
	}
	if !sameMap(before, h.slotNodes(svc.ID)) || !h.converged(svc.ID)() {
		t.Fatalf("replicas moved while the target was cordoned: %v, were %v (verdict %v)", h.slotNodes(svc.ID), before, h.verdict(svc.ID))
	}
}
