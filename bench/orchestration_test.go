package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
)

// fleetNodes is the size of the simulated runner fleet.
const fleetNodes = 1000

// openStore opens the embedded store in a temporary directory.
func openStore(b testing.TB) *store.Store {
	b.Helper()
	return openStoreWith(b, nil)
}

// openStoreWith opens the embedded store in a temporary directory, counting
// its commands into reg when reg is not nil.
func openStoreWith(b testing.TB, reg prometheus.Registerer) *store.Store {
	b.Helper()
	dir := b.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unlock() })
	st, err := store.Open(context.Background(), store.Config{DataDir: dir, Metrics: reg})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close(context.Background()) })
	return st
}

// seedFleet inserts fleetNodes online runner nodes in 4 regions, all holding credential cred.
func seedFleet(b testing.TB, st *store.Store, cred string) {
	b.Helper()
	far := time.Now().Add(24 * time.Hour).UTC()
	docs := map[string][]any{}
	colls := map[string]*mongo.Collection{}
	for i := 0; i < fleetNodes; i++ {
		id := fmt.Sprintf("node-%04d", i)
		c := runners.NodeCollection(st, id)
		colls[c.Name()] = c
		docs[c.Name()] = append(docs[c.Name()], runners.Node{ID: id, Region: fmt.Sprintf("r%d", i%4), Capacity: 1 << 20,
			Labels: map[string]string{"isolation": "docker"}, CredentialDigest: identity.Digest(cred),
			ExpiresAt: far, LastHeartbeatAt: far, Reservations: map[string]runners.Reservation{}})
	}
	for name, d := range docs {
		if _, err := colls[name].InsertMany(context.Background(), d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlacementSelect is the pure placement decision of one runner project over 1,000
// candidate runner nodes, in memory.
func BenchmarkPlacementSelect(b *testing.B) {
	now := time.Now()
	nodes := make(map[string]*runners.Node, fleetNodes)
	for i := 0; i < fleetNodes; i++ {
		id := fmt.Sprintf("node-%04d", i)
		nodes[id] = &runners.Node{ID: id, Region: fmt.Sprintf("r%d", i%4), Capacity: 64, Reserved: i % 64,
			Labels: map[string]string{"isolation": "docker"}, ExpiresAt: now.Add(time.Hour)}
	}
	p := &placement.Placement{ProjectID: "prj_bench", CapacityUnits: 2, Region: "r1", Requirements: placement.Requirements{Labels: map[string]string{"isolation": "docker"}}}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if act := placement.Decide(p, nodes, nil, now); act.Status != placement.Assigned {
			b.Fatal("nothing fits")
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkPlacementAssign is SetDesired + Assign of a new project with 1,000 nodes on the embedded
// store, the projects placed by 1 or 64 callers at once, on each write path:
//
//   - direct: selection and reservation as one compare-and-set on the chosen node, the placement
//     recorded with its own writes (what several control planes on one store use);
//   - plans: each placement one plan of the applier, many plans one insert (docs/store.md
//     section 2.3; what berthd on the embedded store uses).
//
// A placement that lost its compare-and-set 16 times in a row is counted as refused, not placed.
// The plans runs also report the applier's mean plans per entry, append and materializing time.
func BenchmarkPlacementAssign(b *testing.B) {
	for _, c := range []struct {
		name    string
		planned bool
		callers int
	}{{"direct", false, 1}, {"direct-64", false, 64}, {"plans", true, 1}, {"plans-64", true, 64}} {
		b.Run(c.name, func(b *testing.B) { benchmarkAssign(b, c.planned, c.callers) })
	}
}

func benchmarkAssign(b *testing.B, planned bool, callers int) {
	st := openStore(b)
	seedFleet(b, st, "brn_bench")
	ctx := context.Background()
	var opts []placement.ServiceOption
	reg := prometheus.NewRegistry()
	if planned {
		a, err := plans.Open(ctx, st, plans.WithMetrics(reg))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = a.Close(context.Background()) })
		opts = append(opts, placement.WithPlans(a))
	}
	nodes := runners.NewRegistry(st, runners.Config{})
	svc := placement.NewService(st, nodes, nil, opts...)
	// Load the nodes and the placements into the read view before the clock starts: a berthd
	// that places has read them long before.
	if _, err := nodes.List(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := svc.List(ctx); err != nil {
		b.Fatal(err)
	}
	region := "r1"
	var next, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	b.ResetTimer()
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
				p, err := svc.SetDesired(ctx, fmt.Sprintf("prj_%d", i), placement.DesiredRequest{Release: "sha256:x", Region: &region})
				if err == nil && p.Status != placement.Assigned {
					err = fmt.Errorf("status %s", p.Status)
				}
				if errors.Is(err, store.ErrConflict) {
					refused.Add(1) // lost its races 16 times in a row: counted, not placed
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("placement %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(int64(b.N)-refused.Load())/elapsed.Seconds(), "placements/s")
	b.ReportMetric(float64(refused.Load()), "refused")
	if planned {
		reportPlanMetrics(b, reg)
	}
}

// reportPlanMetrics reports the applier's mean batch (plans per entry), mean append time and
// mean materializing time from its metrics in reg.
func reportPlanMetrics(b *testing.B, reg *prometheus.Registry) {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		h := f.GetMetric()[0].GetHistogram()
		if h == nil || h.GetSampleCount() == 0 {
			continue
		}
		mean := h.GetSampleSum() / float64(h.GetSampleCount())
		switch f.GetName() {
		case "berth_plan_batch_plans":
			b.ReportMetric(mean, "plans/entry")
		case "berth_plan_append_seconds":
			b.ReportMetric(mean*1000, "append_ms")
		case "berth_plan_materialize_seconds":
			b.ReportMetric(mean*1000, "materialize_ms")
		}
	}
}

// BenchmarkOperationClaim is one claim gate and one single-operation claim per call, across 1,000
// nodes, on the embedded store.
func BenchmarkOperationClaim(b *testing.B) {
	st := openStore(b)
	cred, _, err := identity.NewToken(identity.PrefixNode)
	if err != nil {
		b.Fatal(err)
	}
	seedFleet(b, st, cred)
	reg := runners.NewRegistry(st, runners.Config{})
	q := operations.NewQueue(st, operations.Config{})
	ctx := context.Background()
	if err := q.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, _, err := q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: fmt.Sprintf("prj_%d", i%50), Kind: "reconcile",
			IdempotencyKey: fmt.Sprintf("k%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		node := fmt.Sprintf("node-%04d", i%fleetNodes)
		if _, err := reg.ClaimGate(ctx, node, cred); err != nil {
			b.Fatal(err)
		}
		got, err := q.Claim(ctx, node, 1, nil)
		if err != nil || len(got) != 1 {
			b.Fatalf("claim %d: %d, %v", i, len(got), err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "claims/s")
}
