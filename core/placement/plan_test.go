package placement_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

// racers sets up two runner nodes in region "race": "a-last" with 1 of 4 units free and "b-spare"
// with 1 of 1 free (equally loaded after a placement, so the decider picks a-last, the lower id),
// and a Service on an applier that waits batchWait for more plans, so two plans submitted
// together are decided in one batch. It returns the service, the registry and the applier's
// metrics.
func racers(t *testing.T, spare bool, batchWait time.Duration) (*placement.Service, *runners.Registry, *prometheus.Registry, *store.Store) {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t)
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := runners.NewRegistry(st, runners.Config{Now: clk.Now})
	nodes := []runners.Declaration{{Region: "race", Capacity: 4}}
	ids := []string{"a-last"}
	if spare {
		nodes, ids = append(nodes, runners.Declaration{Region: "race", Capacity: 1}), append(ids, "b-spare")
	}
	for i, d := range nodes {
		tok, _, err := reg.CreateEnrollment(ctx, ids[i], d.Region, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := reg.Register(ctx, tok, ids[i], d); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Reserve(ctx, "a-last", "prj_before", runners.Reservation{Units: 3, At: clk.Now()}, placementFits(3)); err != nil {
		t.Fatal(err)
	}
	m := prometheus.NewRegistry()
	a, err := plans.Open(ctx, st, plans.WithMaxWait(batchWait), plans.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return placement.NewService(st, reg, nil, placement.WithPlans(a)), reg, m, st
}

// conflicts returns how many plans the applier refused at its re-check.
func conflicts(t *testing.T, m *prometheus.Registry) float64 {
	t.Helper()
	fams, err := m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "berth_plan_conflicts_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no berth_plan_conflicts_total")
	return 0
}

// race places two projects at once (both decided from the same view) and returns them.
func race(t *testing.T, svc *placement.Service) [2]*placement.Placement {
	t.Helper()
	var got [2]*placement.Placement
	var errs [2]error
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = svc.SetDesired(context.Background(), fmt.Sprintf("prj_racer%d", i), placement.DesiredRequest{Release: "r", Region: ptr("race")})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	return got
}

// storedNode reads runner node id from the store itself (not the view): what the materializer wrote.
func storedNode(t *testing.T, st *store.Store, id string) runners.Node {
	t.Helper()
	var n runners.Node
	if err := store.FindByID(context.Background(), runners.NodeCollection(st, id), id, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Two submitters race through the applier for the last unit of a-last: both chose it from the same
// view, the applier's re-check lets one have it and refuses the other, which decides again and
// lands on b-spare. No node holds more than its capacity, in the view or as materialized.
func TestPlannedRaceForTheLastUnitReplans(t *testing.T) {
	t.Parallel()
	svc, reg, m, st := racers(t, true, 500*time.Millisecond)
	got := race(t, svc)
	on := map[string]int{}
	for i, p := range got {
		if p.Status != placement.Assigned {
			t.Fatalf("racer %d: %+v, want assigned", i, p)
		}
		on[p.NodeID]++
	}
	if on["a-last"] != 1 || on["b-spare"] != 1 {
		t.Fatalf("placed on %v, want one on a-last and one on b-spare", on)
	}
	if c := conflicts(t, m); c < 1 {
		t.Fatalf("the applier refused %v plans: both racers were not decided against each other", c)
	}
	waitStored(t, st, map[string]int{"a-last": 4, "b-spare": 1})
	for _, id := range []string{"a-last", "b-spare"} {
		n, err := reg.Get(context.Background(), id)
		if err != nil || n.Reserved != n.Capacity {
			t.Fatalf("%s in the view: %+v, %v", id, n, err)
		}
	}
}

// With no other node, the refused racer decides again, finds nothing that fits and waits (the
// decider's no-capacity outcome), holding no reservation.
func TestPlannedRaceForTheLastUnitWaitsWithoutRoom(t *testing.T) {
	t.Parallel()
	svc, _, m, st := racers(t, false, 500*time.Millisecond)
	got := race(t, svc)
	won := 0
	for i, p := range got {
		switch {
		case p.Status == placement.Assigned && p.NodeID == "a-last":
			won++
		case p.Status == placement.Waiting && p.NodeID == "":
		default:
			t.Fatalf("racer %d: %+v", i, p)
		}
	}
	if won != 1 {
		t.Fatalf("%d racers won the last unit, want 1", won)
	}
	if c := conflicts(t, m); c < 1 {
		t.Fatalf("the applier refused %v plans: both racers were not decided against each other", c)
	}
	waitStored(t, st, map[string]int{"a-last": 4})
	if n := storedNode(t, st, "a-last"); len(n.Reservations) != 2 {
		t.Fatalf("a-last as stored: %+v", n)
	}
}

// waitStored waits (bounded) until the materializer has written each node's reserved units.
func waitStored(t *testing.T, st *store.Store, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for id, units := range want {
			n := storedNode(t, st, id)
			if n.Reserved > n.Capacity {
				t.Fatalf("%s as stored holds %d of %d units", id, n.Reserved, n.Capacity)
			}
			ok = ok && n.Reserved == units
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the materializer did not write %v in 10 s", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Deleting a project right after its placement was committed (through the applier, its
// documents maybe not materialized yet) holds, releases and removes it: the node's units come
// back, the placement is gone from the view and the store, and a pass places nothing again.
func TestDeleteAfterAssignment(t *testing.T) {
	bothPaths(t, func(t *testing.T, f *fixture) {
		f.enroll("a", runners.Declaration{Capacity: 3})
		if p := f.desire("prj_del", placement.DesiredRequest{Release: "r", CapacityUnits: ptr(2)}); p.Status != placement.Assigned || f.reserved("a") != 2 {
			t.Fatalf("placed %+v, a holds %d", p, f.reserved("a"))
		}
		res, err := f.svc.Delete(f.ctx, "prj_del")
		if err != nil || res.Status != placement.DeleteDone {
			t.Fatalf("delete: %+v, %v", res, err)
		}
		if err := f.svc.Pass(f.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.Get(f.ctx, "prj_del"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("placement after delete: %v", err)
		}
		if n := f.reserved("a"); n != 0 {
			t.Fatalf("a holds %d units after the delete", n)
		}
	})
}
