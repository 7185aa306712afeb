package placement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

type fixture struct {
	t     *testing.T
	ctx   context.Context
	clk   *clocktest.Clock
	nodes *runners.Registry
	ops   *operations.Queue
	svc   *placement.Service
	creds map[string]string
}

func newFixture(t *testing.T) *fixture {
	st := storetest.Open(t)
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := runners.NewRegistry(st, runners.Config{NodeTTL: 45 * time.Second, Now: clk.Now})
	q := operations.NewQueue(st, operations.Config{Now: clk.Now})
	if err := q.EnsureIndexes(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: context.Background(), clk: clk, nodes: reg, ops: q, svc: placement.NewService(st, reg, q), creds: map[string]string{}}
}

func (f *fixture) enroll(id string, d runners.Declaration) {
	f.t.Helper()
	tok, _, err := f.nodes.CreateEnrollment(f.ctx, id, d.Region, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	_, cred, err := f.nodes.Register(f.ctx, tok, id, d)
	if err != nil {
		f.t.Fatalf("register %s: %v", id, err)
	}
	f.creds[id] = cred
}

func (f *fixture) heartbeat(ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if _, err := f.nodes.Heartbeat(f.ctx, id, f.creds[id], runners.HeartbeatRequest{}); err != nil {
			f.t.Fatalf("heartbeat %s: %v", id, err)
		}
	}
}

func (f *fixture) desire(project string, req placement.DesiredRequest) *placement.Placement {
	f.t.Helper()
	p, err := f.svc.SetDesired(f.ctx, project, req)
	if err != nil {
		f.t.Fatalf("set desired %s: %v", project, err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func (f *fixture) reserved(id string) int {
	f.t.Helper()
	n, err := f.nodes.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return n.Reserved
}

// Failure semantics: expired nodes become offline for placement.
func TestFailureExpiredNodesAreOfflineForPlacement(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("old", runners.Declaration{Region: "iad", Capacity: 10})
	f.clk.Advance(30 * time.Second)
	f.enroll("new", runners.Declaration{Region: "iad", Capacity: 2})
	f.clk.Advance(20 * time.Second) // "old" has not sent a heartbeat for 50 s > 45 s
	p := f.desire("prj_a", placement.DesiredRequest{Release: "r1"})
	if p.NodeID != "new" || p.Status != placement.Assigned {
		t.Fatalf("placed on %q (%s); want the online node", p.NodeID, p.Status)
	}
	f.clk.Advance(time.Minute) // both offline
	if p := f.desire("prj_b", placement.DesiredRequest{Release: "r1"}); p.Status != placement.Waiting || p.NodeID != "" {
		t.Fatalf("with every node offline: %s on %q; want waiting", p.Status, p.NodeID)
	}
	f.heartbeat("old")
	if p, _ := f.svc.Assign(f.ctx, "prj_b"); p.NodeID != "old" {
		t.Fatalf("after a heartbeat the waiting placement is on %q, want old", p.NodeID)
	}
}

// Failure semantics: draining nodes keep current work but receive no new desired placements or
// operation claims.
func TestFailureDrainingNodesKeepWorkButGetNoNewPlacementsOrClaims(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("a", runners.Declaration{Capacity: 10})
	p := f.desire("prj_a", placement.DesiredRequest{Release: "r1"})
	if p.NodeID != "a" {
		t.Fatalf("placed on %q", p.NodeID)
	}
	leased, err := f.ops.Claim(f.ctx, "a", 1, nil)
	if err != nil || len(leased) != 1 {
		t.Fatalf("claim: %v %v", leased, err)
	}
	if _, err := f.nodes.Heartbeat(f.ctx, "a", f.creds["a"], runners.HeartbeatRequest{Draining: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	if p := f.desire("prj_a", placement.DesiredRequest{Release: "r2"}); p.NodeID != "a" || p.Status != placement.Assigned {
		t.Fatalf("current work moved off the draining node: %q %s", p.NodeID, p.Status)
	}
	if p := f.desire("prj_b", placement.DesiredRequest{Release: "r1"}); p.Status != placement.Waiting {
		t.Fatalf("new placement on a draining node: %q %s", p.NodeID, p.Status)
	}
	if _, err := f.nodes.ClaimGate(f.ctx, "a", f.creds["a"]); !errors.Is(err, runners.ErrDraining) {
		t.Fatalf("claim gate of a draining node: %v, want ErrDraining", err)
	}
	h := operations.Holder{NodeID: "a", Token: leased[0].LeaseToken, Fence: leased[0].Operation.Fence}
	if _, err := f.ops.Renew(f.ctx, leased[0].Operation.ID, h); err != nil {
		t.Fatalf("a draining node renews its current lease: %v", err)
	}
	if _, err := f.ops.Complete(f.ctx, leased[0].Operation.ID, h, nil); err != nil {
		t.Fatalf("a draining node completes its current work: %v", err)
	}
}

// Failure semantics: portable placements may be reassigned after node loss; stateful placements
// stay pinned and fail closed until that node identity returns.
func TestFailurePortableReassignedStatefulPinned(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("a", runners.Declaration{Region: "iad", Capacity: 10, Labels: map[string]string{"isolation": "docker"}})
	f.enroll("b", runners.Declaration{Region: "iad", Capacity: 10, Labels: map[string]string{"isolation": "docker"}})
	req := placement.DesiredRequest{Release: "r1", CapacityUnits: ptr(4), Requirements: &placement.Requirements{Labels: map[string]string{"isolation": "docker"}}}
	port := f.desire("prj_port", req)
	req.Mode = ptr(placement.Stateful)
	stat := f.desire("prj_stat", req)
	if port.NodeID != "a" || stat.NodeID != "b" || !stat.Pinned {
		t.Fatalf("portable on %q, stateful on %q pinned=%v; want spread a, b", port.NodeID, stat.NodeID, stat.Pinned)
	}
	// A generation that omits mode, region, units and requirements inherits them.
	stat = f.desire("prj_stat", placement.DesiredRequest{Release: "r2", State: placement.Stopped})
	if stat.Mode != placement.Stateful || stat.CapacityUnits != 4 || stat.Requirements.Labels["isolation"] != "docker" || stat.NodeID != "b" || stat.Generation != 2 {
		t.Fatalf("inherited generation = %+v", stat)
	}
	if _, err := f.svc.SetDesired(f.ctx, "prj_stat", placement.DesiredRequest{Release: "r3", Mode: ptr(placement.Portable)}); !errors.Is(err, placement.ErrModeImmutable) {
		t.Fatalf("mode change: %v, want ErrModeImmutable", err)
	}
	if _, err := f.svc.SetDesired(f.ctx, "prj_stat", placement.DesiredRequest{Release: "r3", Region: ptr("sfo")}); !errors.Is(err, placement.ErrPinned) {
		t.Fatalf("region change after selection: %v, want ErrPinned", err)
	}
	// Both nodes lose their credential; a third node appears.
	f.enroll("c", runners.Declaration{Region: "iad", Capacity: 10, Labels: map[string]string{"isolation": "docker"}})
	if _, err := f.nodes.Revoke(f.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.nodes.Revoke(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Pass(f.ctx); err != nil {
		t.Fatal(err)
	}
	port, _ = f.svc.Get(f.ctx, "prj_port")
	stat, _ = f.svc.Get(f.ctx, "prj_stat")
	if port.NodeID != "c" || port.Status != placement.Assigned || f.reserved("c") != 4 || f.reserved("a") != 0 {
		t.Fatalf("portable after node loss: %q %s, reserved c=%d a=%d; want moved to c with the same demand", port.NodeID, port.Status, f.reserved("c"), f.reserved("a"))
	}
	if stat.NodeID != "b" || stat.Status != placement.Unavailable || f.reserved("b") != 4 {
		t.Fatalf("stateful after node loss: %q %s; want unavailable, still on b", stat.NodeID, stat.Status)
	}
	ops, _ := f.ops.List(f.ctx, "prj_port")
	for _, o := range ops {
		if !o.State.Terminal() && o.TargetNode != "c" {
			t.Fatalf("portable operation %s still targets %q", o.ID, o.TargetNode)
		}
	}
	f.enroll("b", runners.Declaration{Region: "iad", Capacity: 10, Labels: map[string]string{"isolation": "docker"}}) // the same identity returns
	if stat, _ = f.svc.Assign(f.ctx, "prj_stat"); stat.NodeID != "b" || stat.Status != placement.Assigned {
		t.Fatalf("after re-enrollment: %q %s; want assigned to b again", stat.NodeID, stat.Status)
	}
	// Portable failover waits while nothing fits, carrying the same demand.
	if _, err := f.nodes.Revoke(f.ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if port, _ = f.svc.Assign(f.ctx, "prj_port"); port.Status != placement.Assigned || port.NodeID != "b" {
		t.Fatalf("portable failover to b: %q %s", port.NodeID, port.Status)
	}
	if _, err := f.nodes.Revoke(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if port, _ = f.svc.Assign(f.ctx, "prj_port"); port.Status != placement.Waiting || port.CapacityUnits != 4 {
		t.Fatalf("with nothing fitting: %q %s", port.NodeID, port.Status)
	}
}

// Failure semantics: node capacity is process-slot based, deterministic, transactional (one
// compare-and-set on the node), capability-aware and region aware.
func TestFailureCapacityIsSlotBasedDeterministicCapabilityAndRegionAware(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("iad-1", runners.Declaration{Region: "iad", Capacity: 5, Endpoint: "https://iad-1.internal", Labels: map[string]string{"runtime": "node24"}})
	f.enroll("iad-2", runners.Declaration{Region: "iad", Capacity: 5, Labels: map[string]string{"runtime": "node24"}})
	f.enroll("sfo-1", runners.Declaration{Region: "sfo", Capacity: 50, Endpoint: "https://sfo-1.internal", Labels: map[string]string{"runtime": "node24"}})
	need := &placement.Requirements{Endpoint: true, Labels: map[string]string{"runtime": "node24"}}
	// Region and endpoint leave iad-1 as the only candidate; capacity is counted in units.
	p1 := f.desire("prj_1", placement.DesiredRequest{Release: "r", Region: ptr("iad"), CapacityUnits: ptr(3), Requirements: need})
	p2 := f.desire("prj_2", placement.DesiredRequest{Release: "r", Region: ptr("iad"), CapacityUnits: ptr(3), Requirements: need})
	p3 := f.desire("prj_3", placement.DesiredRequest{Release: "r", Region: ptr("iad"), CapacityUnits: ptr(2), Requirements: need})
	if p1.NodeID != "iad-1" || p2.Status != placement.Waiting || p3.NodeID != "iad-1" || f.reserved("iad-1") != 5 {
		t.Fatalf("p1 %q, p2 %s, p3 %q, reserved %d; want 3+2 on iad-1 and p2 waiting", p1.NodeID, p2.Status, p3.NodeID, f.reserved("iad-1"))
	}
	// Requirements are evaluated at every placement: a node without the label never gets it.
	if _, err := f.nodes.Heartbeat(f.ctx, "iad-2", f.creds["iad-2"], runners.HeartbeatRequest{Declaration: &runners.Declaration{Region: "iad", Capacity: 50, Endpoint: "https://iad-2.internal"}}); err != nil {
		t.Fatal(err)
	}
	if p2, _ = f.svc.Assign(f.ctx, "prj_2"); p2.Status != placement.Waiting {
		t.Fatalf("placed on a node without the required label: %q", p2.NodeID)
	}
	// A node cannot advertise less than it reserved, nor drop what an assigned placement requires.
	if _, err := f.nodes.Heartbeat(f.ctx, "iad-1", f.creds["iad-1"], runners.HeartbeatRequest{Declaration: &runners.Declaration{Region: "iad", Capacity: 4, Endpoint: "https://iad-1.internal", Labels: map[string]string{"runtime": "node24"}}}); !errors.Is(err, runners.ErrCapacityInUse) {
		t.Fatalf("capacity below reservations: %v", err)
	}
	if _, err := f.nodes.Heartbeat(f.ctx, "iad-1", f.creds["iad-1"], runners.HeartbeatRequest{Declaration: &runners.Declaration{Region: "iad", Capacity: 5, Labels: map[string]string{"runtime": "node24"}}}); !errors.Is(err, runners.ErrRequirementInUse) {
		t.Fatalf("endpoint dropped: %v", err)
	}
	tok, _, _ := f.nodes.CreateEnrollment(f.ctx, "iad-1", "iad", 0)
	if _, _, err := f.nodes.Register(f.ctx, tok, "iad-1", runners.Declaration{Region: "iad", Capacity: 5, Endpoint: "https://iad-1.internal"}); !errors.Is(err, runners.ErrRequirementInUse) {
		t.Fatalf("label dropped at credential rotation: %v", err)
	}
	// Releasing a placement frees its units for the waiting one, the same way every time.
	if err := f.svc.Remove(f.ctx, "prj_1"); err != nil {
		t.Fatal(err)
	}
	if p2, _ = f.svc.Assign(f.ctx, "prj_2"); p2.NodeID != "iad-1" || f.reserved("iad-1") != 5 {
		t.Fatalf("after the release: %q, reserved %d", p2.NodeID, f.reserved("iad-1"))
	}
}

// TestObservationsAreGenerationChecked: a late report for generation N never overwrites N+1.
func TestObservationsAreGenerationChecked(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("a", runners.Declaration{Capacity: 1})
	for _, r := range []string{"r1", "r2", "r3"} {
		f.desire("prj_a", placement.DesiredRequest{Release: r})
	}
	if _, err := f.svc.Observe(f.ctx, "prj_a", placement.Observation{NodeID: "a", Generation: 3, Release: "r3", State: placement.Running}); err != nil {
		t.Fatal(err)
	}
	for _, obs := range []placement.Observation{
		{NodeID: "a", Generation: 2, Release: "r2"}, // late
		{NodeID: "a", Generation: 4, Release: "r4"}, // from the future
		{NodeID: "b", Generation: 3, Release: "r3"}, // another node
	} {
		if _, err := f.svc.Observe(f.ctx, "prj_a", obs); !errors.Is(err, placement.ErrStale) {
			t.Errorf("observation %+v: %v, want ErrStale", obs, err)
		}
	}
	if p, _ := f.svc.Get(f.ctx, "prj_a"); p.Observed.Generation != 3 || p.Observed.Release != "r3" {
		t.Fatalf("observed = %+v", p.Observed)
	}
}

// TestSweepReleasesUnreferencedReservations: a reservation whose placement was never recorded (a
// berthd that died between the two steps) is released after the grace period.
func TestSweepReleasesUnreferencedReservations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.enroll("a", runners.Declaration{Capacity: 3})
	if _, err := f.nodes.Reserve(f.ctx, "a", "prj_ghost", runners.Reservation{Units: 2, At: f.clk.Now()}, placementFits(2)); err != nil {
		t.Fatal(err)
	}
	f.desire("prj_a", placement.DesiredRequest{Release: "r"})
	if n, _ := f.svc.SweepReservations(f.ctx); n != 0 {
		t.Fatalf("swept %d within the grace period", n)
	}
	f.clk.Advance(placement.SweepGrace)
	f.heartbeat("a")
	if n, err := f.svc.SweepReservations(f.ctx); n != 1 || err != nil || f.reserved("a") != 1 {
		t.Fatalf("sweep = %d, %v; reserved %d, want 1 left", n, err, f.reserved("a"))
	}
}

// TestMigrateLegacyNodesAndPlacements: nodes and placements of the earlier single-collection layout
// move to their buckets unchanged (credentials, reservations, generations), once.
func TestMigrateLegacyNodesAndPlacements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := storetest.Open(t)
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := runners.NewRegistry(st, runners.Config{Now: clk.Now})
	svc := placement.NewService(st, reg, nil)
	res := map[string]runners.Reservation{"prj_a": {Units: 2, At: clk.Now()}}
	if _, err := st.Collection(runners.NodesCollection).InsertOne(ctx, runners.Node{ID: "old-1", Capacity: 4, Reserved: 2,
		Reservations: res, ExpiresAt: clk.Now().Add(time.Minute), CredentialDigest: "d", Revision: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collection(placement.Collection).InsertOne(ctx, placement.Placement{ProjectID: "prj_a", Generation: 3, Release: "r",
		State: placement.Running, Mode: placement.Portable, CapacityUnits: 2, NodeID: "old-1", Status: placement.Assigned, Revision: 5}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		n1, err1 := reg.MigrateLegacy(ctx, st)
		n2, err2 := svc.MigrateLegacy(ctx, st)
		if err1 != nil || err2 != nil || (round == 0 && (n1 != 1 || n2 != 1)) || (round == 1 && (n1 != 0 || n2 != 0)) {
			t.Fatalf("round %d: migrated %d nodes (%v), %d placements (%v)", round, n1, err1, n2, err2)
		}
	}
	n, err := reg.Get(ctx, "old-1")
	if err != nil || n.Reserved != 2 || n.Reservations["prj_a"].Units != 2 || n.Revision != 7 || n.CredentialDigest != "d" {
		t.Fatalf("migrated node = %+v, %v", n, err)
	}
	p, err := svc.Assign(ctx, "prj_a")
	if err != nil || p.Generation != 3 || p.NodeID != "old-1" || p.Status != placement.Assigned {
		t.Fatalf("migrated placement = %+v, %v", p, err)
	}
}
