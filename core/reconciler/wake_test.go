package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store/storetest"
)

// hourly is a sweep that runs its first full pass and then none within any test.
var hourly = slots.SweepConfig{Quiet: time.Hour, Period: time.Hour, Floor: time.Hour}

// hookedSink is a [signalling] sink whose Push runs onPush first (on the reconciler's
// goroutine, inside the pass), when set.
type hookedSink struct {
	*signalling
	mu     sync.Mutex
	onPush func()
}

func (h *hookedSink) Push(ctx context.Context, id string) {
	h.mu.Lock()
	f := h.onPush
	h.onPush = nil
	h.mu.Unlock()
	if f != nil {
		f()
	}
	h.signalling.Push(ctx, id)
}

// runLoop runs r until the test ends.
func runLoop(t *testing.T, r *Reconciler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// desires reports whether node n's stored desired state runs a workload of service svcID.
func desires(t *testing.T, reg *nodes.Registry, n *nodes.Node, svcID string) bool {
	t.Helper()
	got, err := reg.Get(context.Background(), n.ID)
	if err != nil || got.DesiredSpec == "" {
		return false
	}
	var spec node.Spec
	if err := json.Unmarshal([]byte(got.DesiredSpec), &spec); err != nil {
		t.Fatal(err)
	}
	for _, w := range spec.Workloads {
		if w.ServiceID == svcID {
			return true
		}
	}
	return false
}

// pending returns the reconcile request service id holds (nil: none, or no service).
func pending(t *testing.T, cat *services.Catalog, id string) *services.ReconcileRequest {
	t.Helper()
	s, err := cat.GetServiceByID(context.Background(), id)
	if err != nil {
		return nil
	}
	return s.Reconcile
}

// TestStoreWritesWakeFocusedPasses: with every sweep wait at an hour, writes that nobody hints
// are carried out by focused passes: an apply through the Catalog, then a deletion mark written
// straight into the services collection (as another berthd, or any other path, would). Each
// request is cleared once its pass ran. Without the store's wake-up (hints only), neither write
// is acted on before the sweep, an hour away.
func TestStoreWritesWakeFocusedPasses(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a, b := enroll(t, reg), enroll(t, reg)
	sink := &signalling{changed: make(chan struct{}, 1)}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: sink, Routes: sink, Compiler: routes.Native{}, Sweep: hourly})
	runLoop(t, r)
	sink.await(t, "the first full pass", func() bool { return r.Stats().Full == 1 })

	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 2, Domains: []string{"web.localhost"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink.await(t, "both nodes desire a replica, with no hint", func() bool { return desires(t, reg, a, svc.ID) && desires(t, reg, b, svc.ID) })
	sink.await(t, "the apply's request cleared", func() bool { return pending(t, cat, svc.ID) == nil })
	if len(sink.last().Routes) != 1 {
		t.Fatalf("routes %+v; want the service's one", sink.last().Routes)
	}

	// A write by another path: the deletion mark and its request, straight into the collection.
	cur, err := cat.GetServiceByID(ctx, svc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateIfRevision(ctx, st.Collection("services"), svc.ID, cur.Revision, bson.M{"$set": bson.M{
		"deleting": true, "reconcile": services.ReconcileRequest{Revision: cur.Revision + 1, Cause: "test.raw", At: time.Now().UTC()}}}); err != nil {
		t.Fatal(err)
	}
	sink.await(t, "the deleting service's route withdrawn, with no hint", func() bool { return len(sink.last().Routes) == 0 })
	sink.await(t, "the raw write's request cleared", func() bool { return pending(t, cat, svc.ID) == nil })
	if s := r.Stats(); s.Full != 1 || s.Focused < 2 || s.Cleared < 2 {
		t.Fatalf("passes %+v: want the first full pass only, focused passes and two requests cleared", s)
	}
}

// TestANewerRequestOutlivesAnOlderPass: a write made while a pass works on the service's older
// revision keeps its request (the older pass's clear misses), and a pass acts on it: the
// service ends at the newer revision's replicas with no request pending. A clear that did not
// compare the revision would drop the newer request, and the second replica would wait for the
// sweep.
func TestANewerRequestOutlivesAnOlderPass(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a, b := enroll(t, reg), enroll(t, reg)
	sink := &hookedSink{signalling: &signalling{changed: make(chan struct{}, 1)}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: sink, Routes: sink, Compiler: routes.Native{}, Sweep: hourly})
	runLoop(t, r)
	sink.await(t, "the first full pass", func() bool { return r.Stats().Full == 1 })

	p, _, _ := cat.EnsureProject(ctx, "default")
	written := make(chan error, 1)
	sink.mu.Lock()
	sink.onPush = func() {
		// Inside the pass for revision 1: scale to 2 replicas (revision 2).
		cur, err := cat.GetService(ctx, p, "web")
		if err != nil {
			written <- err
			return
		}
		if cur.Revision != 1 {
			written <- fmt.Errorf("the first push came from a pass over revision %d, not 1", cur.Revision)
			return
		}
		next := *cur
		rev := cur.Revision
		next.Replicas = 2
		_, _, err = cat.ApplyService(ctx, p, &next, &rev)
		written <- err
	}
	sink.mu.Unlock()
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("the write during the pass: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no pass pushed a desired state within 30 s")
	}
	sink.await(t, "both nodes desire a replica of revision 2", func() bool { return desires(t, reg, a, svc.ID) && desires(t, reg, b, svc.ID) })
	sink.await(t, "no request pending", func() bool { return pending(t, cat, svc.ID) == nil })
	if got, err := cat.GetServiceByID(ctx, svc.ID); err != nil || got.Revision != 2 || got.Replicas != 2 {
		t.Fatalf("service %+v, %v; want revision 2 with 2 replicas", got, err)
	}
}

// TestPendingRequestsWaitForANode is a restart in process: a service written before the loop
// starts, with every node disconnected (as a core marks them at start), keeps its request
// through the first passes, which cannot place it; once a node's session starts (the session
// server hints), a focused pass places it and clears the request, with the sweep an hour away.
func TestPendingRequestsWaitForANode(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a := enroll(t, reg)
	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.MarkAllDisconnected(ctx); err != nil {
		t.Fatal(err)
	}
	sink := &signalling{changed: make(chan struct{}, 1)}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: sink, Routes: sink, Compiler: routes.Native{}, Sweep: hourly})
	runLoop(t, r)
	sink.await(t, "the first full pass and the focused pass of the pending request", func() bool {
		s := r.Stats()
		return s.Full == 1 && s.Focused >= 1
	})
	if req := pending(t, cat, svc.ID); req == nil || req.Revision != svc.Revision {
		t.Fatalf("request %+v after passes with no node; want the one of revision %d still pending", req, svc.Revision)
	}
	if desires(t, reg, a, svc.ID) {
		t.Fatal("a disconnected node was given the service")
	}

	if err := reg.SessionStarted(ctx, a.ID, "ses_again", "v", nil); err != nil {
		t.Fatal(err)
	}
	r.Hint("node.connected")
	sink.await(t, "the node desires the service", func() bool { return desires(t, reg, a, svc.ID) })
	sink.await(t, "the request cleared", func() bool { return pending(t, cat, svc.ID) == nil })
	if s := r.Stats(); s.Full != 1 {
		t.Fatalf("passes %+v: a full pass ran", s)
	}
}

// TestSpecWriteWakesAFocusedPass: an operator's runtime spec write (what `berth scale` does)
// carries its reconcile request like a service write: with the sweep an hour away and no hint,
// a focused pass places the second replica it asks for and clears the spec's request.
func TestSpecWriteWakesAFocusedPass(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a, b := enroll(t, reg), enroll(t, reg)
	sink := &signalling{changed: make(chan struct{}, 1)}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: sink, Routes: sink, Compiler: routes.Native{}, Sweep: hourly})
	runLoop(t, r)
	sink.await(t, "the first full pass", func() bool { return r.Stats().Full == 1 })

	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sink.await(t, "one node desires the replica", func() bool { return desires(t, reg, a, svc.ID) || desires(t, reg, b, svc.ID) })
	sink.await(t, "the apply's request cleared", func() bool { return pending(t, cat, svc.ID) == nil })

	specs := rollout.NewStore(st, cat, nil)
	doc, err := specs.PutSpec(ctx, svc, slots.SpecWrite{Spec: slots.Spec{Replicas: slots.Replicas{Total: 2}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Reconcile == nil || doc.Reconcile.Revision != doc.Revision || doc.Reconcile.Cause != services.CauseSpec {
		t.Fatalf("spec written with request %+v; want one at revision %d", doc.Reconcile, doc.Revision)
	}
	sink.await(t, "both nodes desire a replica, with no hint", func() bool { return desires(t, reg, a, svc.ID) && desires(t, reg, b, svc.ID) })
	sink.await(t, "the spec's request cleared", func() bool {
		d, err := specs.Spec(ctx, svc.ID)
		return err == nil && d != nil && d.Reconcile == nil && d.Revision == doc.Revision
	})
	if s := r.Stats(); s.Full != 1 {
		t.Fatalf("passes %+v: a full pass ran", s)
	}
}

var _ Pusher = (*hookedSink)(nil)
