package reconciler

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store/storetest"
)

// signalling stands in for the session server and the gateway plugin and says when either was
// called, so a test waits on what the loop did instead of on time.
type signalling struct {
	mu      sync.Mutex
	tables  []abiroutes.Table
	changed chan struct{}
}

func (s *signalling) Push(context.Context, string) { s.signal() }

func (s *signalling) SetRoutes(_ context.Context, t abiroutes.Table) error {
	s.mu.Lock()
	s.tables = append(s.tables, t)
	s.mu.Unlock()
	s.signal()
	return nil
}

func (s *signalling) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *signalling) last() abiroutes.Table {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tables) == 0 {
		return abiroutes.Table{}
	}
	return s.tables[len(s.tables)-1]
}

// await waits, at most 30 s, until cond holds, checking it after each push or route table.
func (s *signalling) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-s.changed:
		case <-time.After(200 * time.Millisecond): // a condition on the store may follow the last signal
		case <-ctx.Done():
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

// TestKeyedHintsRunWithoutTheSweep runs the loop with every sweep wait at an hour, so no full
// pass can follow the first: an apply reaches both nodes' desired states, status reports make
// the route's upstreams healthy and a deletion withdraws the route, each by the focused pass its
// write (through the store) or its keyed node hint woke (docs/reconciliation.md section 6).
func TestKeyedHintsRunWithoutTheSweep(t *testing.T) {
	st := storetest.Open(t)
	ctx, cancel := context.WithCancel(context.Background())
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a, b := enroll(t, reg), enroll(t, reg)
	sink := &signalling{changed: make(chan struct{}, 1)}
	metrics := prometheus.NewRegistry()
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: sink, Routes: sink, Compiler: routes.Native{},
		Sweep: slots.SweepConfig{Quiet: time.Hour, Period: time.Hour, Floor: time.Hour}, Metrics: metrics})
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	sink.await(t, "the first full pass", func() bool { return r.Stats().Full == 1 })

	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 2, Domains: []string{"web.localhost"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	holds := func(n *nodes.Node) bool {
		got, err := reg.Get(ctx, n.ID)
		if err != nil || got.DesiredSpec == "" {
			return false
		}
		var spec node.Spec
		if err := json.Unmarshal([]byte(got.DesiredSpec), &spec); err != nil {
			t.Fatal(err)
		}
		return len(spec.Workloads) == 1 && spec.Workloads[0].ServiceID == svc.ID
	}
	sink.await(t, "both nodes desire a replica", func() bool { return holds(a) && holds(b) })

	ws, err := cat.ListWorkloads(ctx, bson.M{"service_id": svc.ID})
	if err != nil || len(ws) != 2 {
		t.Fatalf("workloads %+v, %v", ws, err)
	}
	for i, w := range ws {
		if _, err := cat.Observe(ctx, w.NodeID, []services.Observation{{WorkloadID: w.ID, ObservedStatus: "running", Health: "passing", Address: "127.0.0.1:" + string(rune('1'+i))}}); err != nil {
			t.Fatal(err)
		}
		r.HintNode("test.status_report", w.NodeID)
	}
	sink.await(t, "the route's two upstreams healthy", func() bool {
		tb := sink.last()
		if len(tb.Routes) != 1 || len(tb.Routes[0].Upstreams) != 2 {
			return false
		}
		return tb.Routes[0].Upstreams[0].Healthy && tb.Routes[0].Upstreams[1].Healthy
	})

	if err := cat.DeleteService(ctx, p, "web", nil); err != nil {
		t.Fatal(err)
	}
	sink.await(t, "the deleted service's route withdrawn", func() bool { return len(sink.last().Routes) == 0 })

	sink.await(t, "three focused passes finished", func() bool { return r.Stats().Focused >= 3 })
	if st := r.Stats(); st.Full != 1 {
		t.Fatalf("passes %+v: want the first full pass only and at least 3 focused ones", st)
	}
	// Every pass is timed under its kind (docs/operating.md "Metrics").
	cancel()
	<-done
	passes := r.Stats()
	timed := map[string]uint64{}
	fams, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "berth_reconcile_pass_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			timed[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	if timed["full"] != uint64(passes.Full) || timed["focused"] != uint64(passes.Focused) {
		t.Fatalf("timed passes %v, want full %d and focused %d", timed, passes.Full, passes.Focused)
	}
}
