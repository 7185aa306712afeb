package rollout_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/rollout/rollouttest"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

type sink struct {
	mu    sync.Mutex
	table abiroutes.Table
}

func (s *sink) SetRoutes(_ context.Context, t abiroutes.Table) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.table = t
	return nil
}

func (s *sink) hostnames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.table.Routes {
		out = append(out, r.Hostname)
	}
	return out
}

// harness runs the real reconciler and store on a manual clock (observations, backoffs and
// report freshness are measured on it; a test advances it instead of sleeping), with nodes
// simulated by rollouttest.Report: a release in crash crashes on start.
type harness struct {
	t     *testing.T
	ctx   context.Context
	st    *store.Store
	clk   *clocktest.Clock
	reg   *nodes.Registry
	cat   *services.Catalog
	rs    *rollout.Store
	prod  *rollout.Producer
	rec   *reconciler.Reconciler
	auth  *fencing.Authority // nil unless the harness was made with leases
	sink  *sink
	p     *services.Project
	nodes []*nodes.Node
	down  map[string]bool // nodes that no longer answer
	crash map[string]bool // release digests whose workloads crash on start
}

func newHarness(t *testing.T, nodeCount int) *harness {
	t.Helper()
	return newHarnessWith(t, nodeCount, nil)
}

// newHarnessWith is newHarness with the producer's metrics (nil: none).
func newHarnessWith(t *testing.T, nodeCount int, m *rollout.Metrics) *harness {
	t.Helper()
	return newHarnessOpts(t, nodeCount, m, false)
}

// newHarnessOpts is newHarnessWith, with the lease authority of stateful services on the
// harness's clock when leased.
func newHarnessOpts(t *testing.T, nodeCount int, m *rollout.Metrics, leased bool) *harness {
	t.Helper()
	st := storetest.Open(t)
	h := &harness{t: t, ctx: context.Background(), st: st, clk: clocktest.New(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)),
		sink: &sink{}, down: map[string]bool{}, crash: map[string]bool{}}
	h.reg = nodes.NewRegistry(st, h.clk.Now)
	h.cat = services.NewCatalog(st, h.clk.Now)
	h.rs = rollout.NewStore(st, h.cat, h.clk.Now)
	if leased {
		h.auth = fencing.New(st, fencing.Config{Now: h.clk.Now})
	}
	h.prod = rollout.NewProducer(rollout.Config{Store: h.rs, Catalog: h.cat, Nodes: h.reg, Now: h.clk.Now, Metrics: m, Leases: h.auth})
	h.rec = reconciler.New(reconciler.Config{Catalog: h.cat, Nodes: h.reg, Routes: h.sink, Compiler: routes.Native{}, Rollout: h.prod, Leases: h.auth})
	for range nodeCount {
		tok, _, err := h.reg.CreateJoinToken(h.ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		n, _, err := h.reg.Enroll(h.ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "h", Address: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.reg.SessionStarted(h.ctx, n.ID, "ses_"+n.ID, "v", []string{"process"}); err != nil {
			t.Fatal(err)
		}
		h.nodes = append(h.nodes, n)
	}
	var err error
	if h.p, _, err = h.cat.EnsureProject(h.ctx, "default"); err != nil {
		t.Fatal(err)
	}
	return h
}

// put creates or updates service web with release digest and replicas.
func (h *harness) put(release string, replicas int) *services.Service {
	h.t.Helper()
	svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", BundleDigest: release, Command: []string{"./web"}, Port: 8080,
		Replicas: replicas, Domains: []string{"web.localhost"}}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return svc
}

// step runs one reconcile pass, then lets every answering node apply and report. The clock
// moves by one second, like sweeps apart.
func (h *harness) step() {
	h.t.Helper()
	if err := h.rec.Pass(h.ctx); err != nil {
		h.t.Fatalf("pass: %v", err)
	}
	for _, n := range h.nodes {
		if !h.down[n.ID] {
			h.report(n.ID)
		}
	}
	h.clk.Advance(time.Second)
}

func (h *harness) report(id string) {
	h.t.Helper()
	if err := rollouttest.Report(h.ctx, h.reg, h.cat, id, func(d string) bool { return h.crash[d] }); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) verdict(id string) slots.Verdict {
	h.t.Helper()
	d, err := h.rs.Verdict(h.ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	if d == nil {
		return slots.Verdict{}
	}
	return d.Verdict
}

// serving counts the service's workloads running and passing on their nodes, by release.
func (h *harness) serving(svc *services.Service) map[string]int {
	h.t.Helper()
	out := map[string]int{}
	ws, err := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, n := range h.nodes {
		got, _ := h.reg.Get(h.ctx, n.ID)
		var spec node.Spec
		_ = json.Unmarshal([]byte(got.DesiredSpec), &spec)
		for _, ws2 := range spec.Workloads {
			for _, w := range ws {
				if w.ID == ws2.WorkloadID && ws2.DesiredStatus == node.DesiredRunning && w.ObservedStatus == "running" && w.Health == "passing" {
					out[ws2.BundleDigest]++
				}
			}
		}
	}
	return out
}

// until steps until cond holds, at most limit steps, calling each (when not nil) after every
// step.
func (h *harness) until(limit int, what string, cond func() bool, each func()) {
	h.t.Helper()
	for i := 0; i < limit; i++ {
		if cond() {
			return
		}
		h.step()
		if each != nil {
			each()
		}
	}
	if !cond() {
		h.t.Fatalf("not %s after %d passes", what, limit)
	}
}

func (h *harness) converged(id string) func() bool {
	return func() bool { return h.verdict(id).State == slots.Converged }
}

// putRollout is put with the service's rollout bounds.
func (h *harness) putRollout(release string, replicas int, ro *slots.RolloutSpec) *services.Service {
	h.t.Helper()
	svc, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", BundleDigest: release, Command: []string{"./web"}, Port: 8080,
		Replicas: replicas, Domains: []string{"web.localhost"}, Rollout: ro}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return svc
}

// stopFirst is the rollout of max_surge 0, max_unavailable 1: one replica at a time, stop
// before start.
var stopFirst = &slots.RolloutSpec{MaxSurge: &slots.Bound{}, MaxUnavailable: &slots.Bound{Value: 1}}

func TestRollingReleaseReplacesOneSlotAtATime(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.putRollout("sha256:a", 3, stopFirst)
	h.until(10, "converged on release a", h.converged(svc.ID), nil)
	if got := h.serving(svc); got["sha256:a"] != 3 {
		t.Fatalf("serving %v, want 3 of release a", got)
	}
	svc = h.putRollout("sha256:b", 3, stopFirst)
	// Before any sweep decided over the new release, the converged verdict about the same spec
	// revision reads as converging.
	views := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}
	if v, err := views.VerdictOf(h.ctx, svc); err != nil || v == nil || v.State != string(slots.Converging) {
		t.Fatalf("verdict right after a release change: %+v %v, want converging", v, err)
	}
	stoppedAtOnce := 0
	h.until(40, "converged on release b", func() bool {
		return h.verdict(svc.ID).State == slots.Converged && h.serving(svc)["sha256:b"] == 3
	}, func() {
		got := h.serving(svc)
		if got["sha256:a"]+got["sha256:b"] < 2 {
			t.Fatalf("only %v serving during the rollout: more than one slot was replaced at once", got)
		}
		set, _ := h.rs.Slots(h.ctx, svc.ID)
		n := 0
		for _, r := range set.Slots {
			if r.Generation != int(slots.GenRun) {
				n++
			}
		}
		stoppedAtOnce = max(stoppedAtOnce, n)
	})
	if stoppedAtOnce != 1 {
		t.Fatalf("at most %d slots stood stopped or removed at once, want exactly 1", stoppedAtOnce)
	}
	set, _ := h.rs.Slots(h.ctx, svc.ID)
	for _, r := range set.Slots {
		if len(r.Ancestors) != 1 || r.Attempt.Predecessor != r.Ancestors[0].ID {
			t.Fatalf("slot %s: attempt %+v ancestors %+v, want one predecessor", r.Replica, r.Attempt, r.Ancestors)
		}
	}
	if ws, _ := h.cat.ListWorkloads(h.ctx, bson.M{"service_id": svc.ID}); len(ws) != 3 {
		t.Fatalf("%d workloads after the rollout, want the 3 current ones", len(ws))
	}
}

func TestCrashingReleaseBacksOffAndUndoRecovers(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.putRollout("sha256:good", 3, stopFirst)
	h.until(10, "converged", h.converged(svc.ID), nil)
	h.crash["sha256:bad"] = true
	svc = h.putRollout("sha256:bad", 3, stopFirst)
	h.until(10, "waiting on the failure backoff", func() bool {
		return h.verdict(svc.ID) == slots.Verdict{SpecRevision: 1, State: slots.Waiting, Reason: slots.ReasonFailureBackoff}
	}, nil)
	// The old replicas keep serving while the new slot crashes.
	h.until(30, "the crashed slot replaced once", func() bool {
		set, _ := h.rs.Slots(h.ctx, svc.ID)
		for _, r := range set.Slots {
			if len(r.Ancestors) >= 2 && r.Ancestors[0].Key == r.Attempt.Key {
				return true
			}
		}
		return false
	}, func() {
		if got := h.serving(svc); got["sha256:good"] != 2 {
			set, _ := h.rs.Slots(h.ctx, svc.ID)
			ws, _ := h.cat.ListWorkloads(h.ctx, nil)
			t.Fatalf("serving %v during the failed rollout, want the 2 old replicas\nslots %+v\nworkloads %+v", got, set, ws)
		}
	})
	st, err := rollout.Views{Store: h.rs, Catalog: h.cat, Nodes: h.reg}.Rollout(h.ctx, mustService(t, h, svc.ID))
	if err != nil {
		t.Fatal(err)
	}
	if st.Updated != 0 || st.Outdated != 2 || st.PreviousRelease != "sha256:good" {
		t.Fatalf("rollout status %+v", st)
	}
	// rollout undo returns to the good release: the old slots stop drifting, the crashing one is
	// replaced, and the service converges.
	dep := deploy.New(deploy.Config{Catalog: h.cat, Runtime: h.rs})
	if _, err := dep.Undo(h.ctx, deploy.Change{Project: h.p, Service: "web"}); err != nil {
		t.Fatal(err)
	}
	h.until(20, "converged after undo", func() bool {
		return h.converged(svc.ID)() && h.serving(svc)["sha256:good"] == 3
	}, nil)
	if _, err := dep.Undo(h.ctx, deploy.Change{Project: h.p, Service: "web"}); err != nil {
		t.Fatalf("undo of the undo: %v", err) // it goes back to the bad release, which is allowed
	}
}

func mustService(t *testing.T, h *harness, id string) *services.Service {
	t.Helper()
	s, err := h.cat.GetServiceByID(h.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDeletionDuringRolloutSettlesThenRemoves(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.put("sha256:a", 3)
	h.until(10, "converged", h.converged(svc.ID), nil)
	svc = h.put("sha256:b", 3)
	h.step() // the first slot of the rollout stops
	if _, err := h.cat.MarkDeleting(h.ctx, h.p, "web", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.cat.PutService(h.ctx, h.p, &services.Service{Name: "web", BundleDigest: "sha256:c", Replicas: 3}, nil); !errors.Is(err, services.ErrServiceDeleting) {
		t.Fatalf("write to a deleting service: %v", err)
	}
	h.step()
	if got := h.sink.hostnames(); len(got) != 0 {
		t.Fatalf("routes of a deleting service not withdrawn: %v", got)
	}
	set, _ := h.rs.Slots(h.ctx, svc.ID)
	for _, r := range set.Slots {
		if r.Generation == int(slots.GenRun) {
			t.Fatalf("slot %s still runs after the deleting pass: an empty desire stops every slot at once", r.Replica)
		}
	}
	h.until(10, "the service removed", func() bool {
		_, err := h.cat.GetServiceByID(h.ctx, svc.ID)
		return errors.Is(err, services.ErrServiceNotFound)
	}, nil)
	if ws, _ := h.cat.ListWorkloads(h.ctx, nil); len(ws) != 0 {
		t.Fatalf("workloads left: %+v", ws)
	}
	spec, _ := h.rs.Spec(h.ctx, svc.ID)
	set, _ = h.rs.Slots(h.ctx, svc.ID)
	verdict, _ := h.rs.Verdict(h.ctx, svc.ID)
	if spec != nil || set.Revision != 0 || verdict != nil {
		t.Fatalf("left behind: spec %+v slots %+v verdict %+v", spec, set, verdict)
	}
	for _, n := range h.nodes {
		got, _ := h.reg.Get(h.ctx, n.ID)
		if got.DesiredSpec != "" && got.DesiredSpec != `{"workloads":[],"routes":[],"network":{"address":"127.0.0.1"}}` {
			var spec node.Spec
			_ = json.Unmarshal([]byte(got.DesiredSpec), &spec)
			if len(spec.Workloads) != 0 {
				t.Fatalf("node %s still desires %+v", n.ID, spec.Workloads)
			}
		}
	}
}

func TestSweepRacingSpecEditAbortsWithConflict(t *testing.T) {
	h := newHarness(t, 2)
	svc := h.put("sha256:a", 1)
	h.step() // the derived spec is stored at revision 1
	two := slots.Spec{Replicas: slots.Replicas{Total: 2}}
	doc, err := h.rs.PutSpec(h.ctx, svc, slots.SpecWrite{Spec: two}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Source != rollout.SourceOperator || doc.Revision != 2 {
		t.Fatalf("first operator spec over the derived one: %+v", doc)
	}
	raced := false
	rollout.SetBeforeCommit(h.prod, func() {
		if raced {
			return
		}
		raced = true
		rev := doc.Revision
		// The edit changes what a slot runs (its CPU limit), so the desired key moves under
		// the commit; a replica count alone would not.
		edit := slots.Spec{Replicas: slots.Replicas{Total: 3}, Resources: slots.Resources{CPUMillis: 500}}
		if _, err := h.rs.PutSpec(h.ctx, svc, slots.SpecWrite{Spec: edit, ExpectedRevision: &rev}, nil); err != nil {
			t.Errorf("operator edit: %v", err)
		}
	})
	out, err := h.prod.Sweep(h.ctx, mustList(t, h), mustNodes(t, h), nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Conflicts == 0 {
		t.Fatalf("sweep %+v: the commit racing the spec edit did not abort", out)
	}
	if v := h.verdict(svc.ID); v.State != slots.Waiting || v.Reason != slots.ReasonConflict {
		t.Fatalf("verdict %v after the conflict, want waiting(conflict)", v)
	}
	h.until(10, "converged on the edited spec", func() bool {
		v := h.verdict(svc.ID)
		return v.State == slots.Converged && v.SpecRevision == 3
	}, nil)
	set, _ := h.rs.Slots(h.ctx, svc.ID)
	if len(set.Slots) != 3 {
		t.Fatalf("%d slots, want the edited 3", len(set.Slots))
	}
	// A stale expected revision and a null over an operator spec are refused conflict.
	stale := int64(2)
	for _, w := range []slots.SpecWrite{{Spec: two, ExpectedRevision: &stale}, {Spec: two}} {
		if _, err := h.rs.PutSpec(h.ctx, svc, w, nil); !errors.Is(err, &slots.Refusal{Reason: slots.ReasonConflict}) {
			t.Fatalf("write %+v: %v, want conflict", w, err)
		}
	}
}

func mustList(t *testing.T, h *harness) []services.Service {
	t.Helper()
	s, err := h.cat.ListServices(h.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustNodes(t *testing.T, h *harness) []nodes.Node {
	t.Helper()
	s, err := h.reg.List(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func slotNodes(t *testing.T, h *harness, id string) map[string]string {
	t.Helper()
	set, err := h.rs.Slots(h.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range set.Slots {
		if r.Generation == int(slots.GenRun) {
			out[r.Replica] = r.NodeID
		}
	}
	return out
}

func TestNodeRetirementWithdrawnAndLost(t *testing.T) {
	h := newHarness(t, 3)
	svc := h.put("sha256:a", 2)
	h.until(10, "converged", h.converged(svc.ID), nil)
	on := slotNodes(t, h, svc.ID)
	withdrawn := on["0"]

	// Withdrawn: its slot is stopped and removed against its receipts, a successor runs
	// elsewhere, and the node is retired only then.
	if _, err := h.reg.Retire(h.ctx, withdrawn, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reg.Retire(h.ctx, withdrawn, nodes.DispositionWithdrawn); !errors.Is(err, nodes.ErrAlreadyRetired) {
		t.Fatalf("second withdrawn retirement: %v", err)
	}
	h.until(15, "the withdrawn node retired", func() bool {
		n, _ := h.reg.Get(h.ctx, withdrawn)
		return n.Status == nodes.StatusRemoved && n.Retirement.State == nodes.RetirementRetired
	}, func() {
		n, _ := h.reg.Get(h.ctx, withdrawn)
		set, _ := h.rs.Slots(h.ctx, svc.ID)
		for _, r := range set.Slots {
			if n.Status == nodes.StatusRemoved && r.NodeID == withdrawn && r.Acked != int(slots.GenRemove) {
				t.Fatalf("node retired while slot %s on it is unsettled: %+v", r.Replica, r)
			}
		}
	})
	h.until(10, "converged without the withdrawn node", h.converged(svc.ID), nil)
	on = slotNodes(t, h, svc.ID)
	if len(on) != 2 || on["0"] == withdrawn || on["1"] == withdrawn {
		t.Fatalf("slots on %v after the withdrawal of %s", on, withdrawn)
	}

	// Lost: refused while the node still reports, then its slot is released at once.
	lost := on["1"]
	if _, err := h.reg.Retire(h.ctx, lost, nodes.DispositionLost); !errors.Is(err, nodes.ErrStillReporting) {
		t.Fatalf("lost retirement of a connected node: %v", err)
	}
	h.down[lost] = true
	if err := h.reg.SessionEnded(h.ctx, lost, "ses_"+lost); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(2 * nodes.ReportFreshness)
	if _, err := h.reg.Retire(h.ctx, lost, nodes.DispositionLost); err != nil {
		t.Fatal(err)
	}
	h.step()
	if n, _ := h.reg.Get(h.ctx, lost); n.Status != nodes.StatusRemoved {
		t.Fatalf("lost node status %s after one pass, want removed", n.Status)
	}
	h.until(10, "converged without the lost node", h.converged(svc.ID), nil)
	on = slotNodes(t, h, svc.ID)
	if len(on) != 2 || on["1"] == lost || on["0"] == lost {
		t.Fatalf("slots on %v after the loss of %s", on, lost)
	}
}
