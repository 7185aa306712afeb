package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
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

// BenchmarkPlacementAssign is SetDesired + Assign of a new project (selection and reservation as
// one compare-and-set on the chosen node) with 1,000 nodes on the embedded store.
func BenchmarkPlacementAssign(b *testing.B) {
	st := openStore(b)
	seedFleet(b, st, "brn_bench")
	svc := placement.NewService(st, runners.NewRegistry(st, runners.Config{}), nil)
	ctx := context.Background()
	region := "r1"
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		p, err := svc.SetDesired(ctx, fmt.Sprintf("prj_%d", i), placement.DesiredRequest{Release: "sha256:x", Region: &region})
		if err != nil || p.Status != placement.Assigned {
			b.Fatalf("placement %d: %+v, %v", i, p, err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "placements/s")
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
