package reconciler

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// recorder stands in for the session server and the gateway plugin.
type recorder struct {
	mu     sync.Mutex
	pushed map[string]int
	tables []abiroutes.Table
}

func (r *recorder) Push(_ context.Context, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pushed[id]++
}

func (r *recorder) SetRoutes(_ context.Context, t abiroutes.Table) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tables = append(r.tables, t)
	return nil
}

func enroll(t *testing.T, reg *nodes.Registry) *nodes.Node {
	t.Helper()
	ctx := context.Background()
	tok, _, _ := reg.CreateJoinToken(ctx, 0)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "h", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.SessionStarted(ctx, n.ID, "ses_"+n.ID, "v", nil); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPassPlacesPublishesAndWithdraws(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a, b := enroll(t, reg), enroll(t, reg)
	rec := &recorder{pushed: map[string]int{}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec, Compiler: routes.Native{}})

	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 2, Domains: []string{"web.localhost"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	ws, _ := cat.ListWorkloads(ctx, bson.M{"service_id": svc.ID})
	if len(ws) != 2 || ws[0].NodeID == ws[1].NodeID {
		t.Fatalf("2 replicas should spread over 2 nodes: %+v", ws)
	}
	for _, n := range []*nodes.Node{a, b} {
		got, _ := reg.Get(ctx, n.ID)
		var spec node.Spec
		if err := json.Unmarshal([]byte(got.DesiredSpec), &spec); err != nil {
			t.Fatal(err)
		}
		if got.DesiredRev != 1 || len(spec.Workloads) != 1 || spec.Workloads[0].BundleDigest != "sha256:1" {
			t.Fatalf("node %s desired rev %d spec %+v", n.ID, got.DesiredRev, spec)
		}
	}
	// A second pass with nothing changed keeps the revisions.
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := reg.Get(ctx, a.ID); got.DesiredRev != 1 {
		t.Fatalf("unchanged pass moved the revision to %d", got.DesiredRev)
	}
	// No workload has reported an address yet: the route exists with no upstream.
	last := rec.tables[len(rec.tables)-1]
	if len(last.Routes) != 1 || last.Routes[0].Hostname != "web.localhost" || len(last.Routes[0].Upstreams) != 0 {
		t.Fatalf("table %+v", last)
	}
	// Reports make the upstreams routable.
	for i, w := range ws {
		if _, err := cat.Observe(ctx, w.NodeID, []services.Observation{{WorkloadID: w.ID, ObservedStatus: "running", Health: "passing", Address: "127.0.0.1:" + string(rune('1'+i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	last = rec.tables[len(rec.tables)-1]
	if len(last.Routes[0].Upstreams) != 2 || !last.Routes[0].Upstreams[0].Healthy {
		t.Fatalf("table %+v", last)
	}
	pushes := len(rec.tables)
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.tables) != pushes {
		t.Fatal("an unchanged table was pushed again")
	}

	// Deleting the service removes its workloads, empties both nodes and withdraws the route.
	if err := cat.DeleteService(ctx, p, "web", nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ws, _ := cat.ListWorkloads(ctx, nil); len(ws) != 0 {
		t.Fatalf("workloads left: %+v", ws)
	}
	if got, _ := reg.Get(ctx, a.ID); got.DesiredRev != 2 {
		t.Fatalf("node desired rev %d after delete, want 2", got.DesiredRev)
	}
	if last = rec.tables[len(rec.tables)-1]; len(last.Routes) != 0 {
		t.Fatalf("route not withdrawn: %+v", last)
	}
}

func TestDisconnectedNodeKeepsItsWorkloads(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	a := enroll(t, reg)
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Compiler: routes.Native{}})
	p, _, _ := cat.EnsureProject(ctx, "default")
	if _, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"x"}, Replicas: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := cat.ListWorkloads(ctx, nil)
	if err := reg.SessionEnded(ctx, a.ID, "ses_"+a.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := cat.ListWorkloads(ctx, nil)
	if len(after) != 1 || after[0].ID != before[0].ID {
		t.Fatalf("workloads moved off a disconnected node: %+v -> %+v", before, after)
	}
}

// liveRecorder is a recorder that also says which nodes hold a live session,
// as the session server does.
type liveRecorder struct {
	*recorder
	live map[string]bool
}

func (r *liveRecorder) Connected(id string) bool { return r.live[id] }

var _ LiveSessions = (*liveRecorder)(nil)

// TestPlacementCountsLiveSessions: nodes that dialled in a moment ago hold a
// live session while their documents still say pending (their status is
// written behind the session); a pass places on them as connected nodes and
// pushes their desired state, and a node without a session here stays out.
func TestPlacementCountsLiveSessions(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	var ids []string
	for range 3 {
		tok, _, _ := reg.CreateJoinToken(ctx, 0)
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		n, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "h", Address: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID) // no SessionStarted: the document says pending
	}
	rec := &liveRecorder{recorder: &recorder{pushed: map[string]int{}}, live: map[string]bool{ids[0]: true, ids[2]: true}}
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Pusher: rec, Routes: rec, Compiler: routes.Native{}})
	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "web", BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	ws, _ := cat.ListWorkloads(ctx, bson.M{"service_id": svc.ID})
	on := map[string]bool{}
	for _, w := range ws {
		on[w.NodeID] = true
	}
	if len(ws) != 2 || !on[ids[0]] || !on[ids[2]] {
		t.Fatalf("2 replicas should stand on the two nodes with live sessions %s and %s: %+v", ids[0], ids[2], ws)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.pushed[ids[0]] == 0 || rec.pushed[ids[2]] == 0 {
		t.Fatalf("desired state not pushed to the live nodes: %v", rec.pushed)
	}
}
