package rollout_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// putStateful creates or updates the stateful service db (one replica, local lease) at release.
func (h *harness) putStateful(release string) *services.Service {
	h.t.Helper()
	svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "db", BundleDigest: release, Command: []string{"./db"},
		Replicas: 1, PlacementMode: services.PlacementStateful, LeaseMode: string(node.LeaseLocal)}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return svc
}

// specWorkloads returns node id's stored desired workloads of service svcID.
func (h *harness) specWorkloads(id, svcID string) []node.WorkloadSpec {
	h.t.Helper()
	n, err := h.reg.Get(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	var spec node.Spec
	if n.DesiredSpec != "" {
		if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
			h.t.Fatal(err)
		}
	}
	var out []node.WorkloadSpec
	for _, w := range spec.Workloads {
		if w.ServiceID == svcID {
			out = append(out, w)
		}
	}
	return out
}

// pass runs one reconcile pass with no node reporting.
func (h *harness) pass() {
	h.t.Helper()
	if err := h.rec.Pass(h.ctx); err != nil {
		h.t.Fatalf("pass: %v", err)
	}
	h.clk.Advance(time.Second)
}

// TestStatefulReplacedStopBeforeStart: a stateful service runs its one slot on its lease's holder
// through the slot table and converges; a new release replaces the slot stop-before-start under
// the same lease (no attempt of the new release exists anywhere until the holder acknowledged
// the old attempt's stop and then its removal); and a deletion settles the slot through the
// holder's receipts before the lease is released.
func TestStatefulReplacedStopBeforeStart(t *testing.T) {
	h := newHarnessOpts(t, 2, nil, true)
	svc := h.putStateful("sha256:a")
	h.until(10, "converged on release a", h.converged(svc.ID), nil)
	l, err := h.auth.Get(h.ctx, fencing.LeaseID(svc.ID))
	if err != nil || l.Holder == "" {
		t.Fatalf("lease: %+v %v", l, err)
	}
	holder, token := l.Holder, l.FencingToken
	set, _ := h.rs.Slots(h.ctx, svc.ID)
	if len(set.Slots) != 1 || set.Slots[0].NodeID != holder {
		t.Fatalf("slots %+v, want one on the holder %s", set.Slots, holder)
	}
	if ws := h.specWorkloads(holder, svc.ID); len(ws) != 1 || !ws[0].Stateful || ws[0].FencingToken != token || ws[0].BundleDigest != "sha256:a" {
		t.Fatalf("holder's desired state: %+v", ws)
	}
	old := set.Slots[0].WorkloadID

	svc = h.putStateful("sha256:b")
	// noSuccessor fails the test if an attempt of release b exists in the catalog or any desired state.
	noSuccessor := func(when string) {
		t.Helper()
		ws, _ := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID})
		for _, w := range ws {
			if w.ID != old {
				t.Fatalf("%s: a successor workload %s exists before the old attempt's stop and removal were acknowledged", when, w.ID)
			}
		}
		for _, n := range h.nodes {
			for _, w := range h.specWorkloads(n.ID, svc.ID) {
				if w.WorkloadID != old {
					t.Fatalf("%s: node %s is asked to run %s", when, n.ID, w.WorkloadID)
				}
			}
		}
	}
	for i := range 3 { // the holder does not answer: the stop stays unacknowledged
		h.pass()
		noSuccessor("stop unacknowledged, pass " + strconv.Itoa(i))
		set, _ = h.rs.Slots(h.ctx, svc.ID)
		if g := set.Slots[0].Generation; g != int(slots.GenStop) {
			t.Fatalf("generation %d with the stop unacknowledged, want %d (stop)", g, slots.GenStop)
		}
	}
	if ws := h.specWorkloads(holder, svc.ID); len(ws) != 1 || ws[0].DesiredStatus != node.DesiredStopped {
		t.Fatalf("holder's desired state during the stop: %+v", ws)
	}
	h.report(holder) // stopped
	for i := range 2 {
		h.pass()
		noSuccessor("remove unacknowledged, pass " + strconv.Itoa(i))
	}
	set, _ = h.rs.Slots(h.ctx, svc.ID)
	if g := set.Slots[0].Generation; g != int(slots.GenRemove) {
		t.Fatalf("generation %d after the stop receipt, want %d (remove)", g, slots.GenRemove)
	}
	h.report(holder) // removed
	h.pass()
	set, _ = h.rs.Slots(h.ctx, svc.ID)
	r := set.Slots[0]
	if r.Generation != int(slots.GenRun) || r.NodeID != holder || r.Attempt.Predecessor == "" || r.WorkloadID == old {
		t.Fatalf("after both receipts: %+v, want the successor run on %s", r, holder)
	}
	h.until(10, "converged on release b", func() bool {
		return h.converged(svc.ID)() && len(h.specWorkloads(holder, svc.ID)) == 1 && h.specWorkloads(holder, svc.ID)[0].BundleDigest == "sha256:b"
	}, nil)
	if got, _ := h.auth.Get(h.ctx, l.ID); got.Holder != holder || got.FencingToken != token {
		t.Fatalf("lease after the rollout: %+v, want still %s at token %d", got, holder, token)
	}

	// A deletion stops and removes the slot through the holder's receipts; the lease goes last.
	if _, err := h.cat.MarkDeleting(h.ctx, h.p, "db", nil); err != nil {
		t.Fatal(err)
	}
	h.pass()
	if got, _ := h.auth.Get(h.ctx, l.ID); got.Deleted {
		t.Fatalf("lease released before the slot settled: %+v", got)
	}
	h.until(10, "the service deleted", func() bool {
		_, err := h.cat.GetServiceByID(h.ctx, svc.ID)
		return errors.Is(err, services.ErrServiceNotFound)
	}, nil)
	h.step()
	if got, _ := h.auth.Get(h.ctx, l.ID); !got.Deleted || got.Holder != "" {
		t.Fatalf("lease of the deleted service: %+v", got)
	}
}

// TestDeleteWithPurgeVolumes: a deletion with purge_volumes names the service in the desired
// state of the node holding its workload from the first pass until the slot settled on that
// node's receipts (the agent purges before acknowledging the removal), and in no desired state
// once the service is gone; a plain deletion names it nowhere.
func TestDeleteWithPurgeVolumes(t *testing.T) {
	h := newHarnessOpts(t, 2, nil, true)
	put := func(name string) *services.Service {
		t.Helper()
		svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: name, BundleDigest: "sha256:a", Command: []string{"./db"},
			Replicas: 1, PlacementMode: services.PlacementStateful, Volumes: []services.Volume{{Name: "data"}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	purged, kept := put("db"), put("cache")
	h.until(10, "both converged", func() bool { return h.converged(purged.ID)() && h.converged(kept.ID)() }, nil)
	holder := func(svc *services.Service) string {
		l, err := h.auth.Get(h.ctx, fencing.LeaseID(svc.ID))
		if err != nil {
			t.Fatal(err)
		}
		return l.Holder
	}
	dbNode := holder(purged)
	named := func() map[string][]string { // service ids named in purge_volumes, by node
		out := map[string][]string{}
		for _, n := range h.nodes {
			got, err := h.reg.Get(h.ctx, n.ID)
			if err != nil {
				t.Fatal(err)
			}
			var spec node.Spec
			_ = json.Unmarshal([]byte(got.DesiredSpec), &spec)
			for _, p := range spec.PurgeVolumes {
				out[n.ID] = append(out[n.ID], p.ServiceID)
			}
		}
		return out
	}
	if _, err := h.cat.MarkDeletingWith(h.ctx, h.p, "db", nil, true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cat.MarkDeleting(h.ctx, h.p, "cache", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.cat.GetServiceByID(h.ctx, purged.ID); !got.Deleting || !got.PurgeVolumes {
		t.Fatalf("service after the delete: %+v", got)
	}
	h.pass()
	if got := named(); len(got) != 1 || len(got[dbNode]) != 1 || got[dbNode][0] != purged.ID {
		t.Fatalf("purge_volumes by node after the delete: %v, want only %s on %s", got, purged.ID, dbNode)
	}
	// The node holds on: the stop and removal are not acknowledged, the mark stays.
	h.pass()
	if got := named(); len(got[dbNode]) != 1 {
		t.Fatalf("purge_volumes withdrawn before the node acknowledged: %v", got)
	}
	h.until(10, "both deleted", func() bool {
		_, e1 := h.cat.GetServiceByID(h.ctx, purged.ID)
		_, e2 := h.cat.GetServiceByID(h.ctx, kept.ID)
		return errors.Is(e1, services.ErrServiceNotFound) && errors.Is(e2, services.ErrServiceNotFound)
	}, nil)
	h.step()
	if got := named(); len(got) != 0 {
		t.Fatalf("purge_volumes after the services are gone: %v", got)
	}
}
