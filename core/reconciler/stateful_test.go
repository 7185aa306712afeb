package reconciler

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

// leaseRecorder stands in for the session server's lease messages.
type leaseRecorder struct {
	mu      sync.Mutex
	grants  []string // "node:token"
	revokes []string // "node:reason:token"
}

func (l *leaseRecorder) SendLeaseGrant(_ context.Context, nodeID string, le *fencing.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants = append(l.grants, nodeID+":"+itoa(le.FencingToken))
}

func (l *leaseRecorder) RevokeLease(_ context.Context, nodeID string, le *fencing.Lease, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revokes = append(l.revokes, nodeID+":"+reason+":"+itoa(le.FencingToken))
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// statefulOn returns the stateful workloads in node id's stored desired state.
func statefulOn(t *testing.T, reg *nodes.Registry, id string) []node.WorkloadSpec {
	t.Helper()
	n, err := reg.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var spec node.Spec
	if n.DesiredSpec != "" {
		if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
			t.Fatal(err)
		}
	}
	return spec.Workloads
}

// TestStatefulFollowsItsLease: the slot of a stateful service is placed only under a granted lease,
// appears in the holder's desired state with the lease id and token and nowhere else, stays with a
// silent holder until the gate of its expiring lease opens, then moves with a higher token; a local
// lease stays with its disconnected holder until the operator declares the node lost.
func TestStatefulFollowsItsLease(t *testing.T) {
	for _, mode := range []node.LeaseMode{node.LeaseExpiring, node.LeaseLocal} {
		t.Run(string(mode), func(t *testing.T) {
			st := storetest.Open(t)
			ctx := context.Background()
			reg := nodes.NewRegistry(st, nil)
			cat := services.NewCatalog(st, nil)
			clock := clocktest.New(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC))
			auth := fencing.New(st, fencing.Config{Now: clock.Now})
			a, b := enroll(t, reg), enroll(t, reg)
			lr := &leaseRecorder{}
			r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Compiler: routes.Native{}, Leases: auth, LeaseSender: lr})

			p, _, _ := cat.EnsureProject(ctx, "default")
			svc := &services.Service{Name: "db", BundleDigest: "sha256:1", Command: []string{"./db"}, Replicas: 1,
				PlacementMode: services.PlacementStateful, LeaseMode: string(mode)}
			if mode == node.LeaseExpiring {
				svc.LeaseDurationMS = 15000
			}
			svc, _, err := cat.PutService(ctx, p, svc, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := auth.Get(ctx, fencing.LeaseID(svc.ID))
			if err != nil || l.FencingToken != 1 {
				t.Fatalf("lease after first pass: %+v %v", l, err)
			}
			holder, other := a, b
			if l.Holder == b.ID {
				holder, other = b, a
			}
			ws := statefulOn(t, reg, holder.ID)
			if len(ws) != 1 || !ws[0].Stateful || ws[0].LeaseID != l.ID || ws[0].FencingToken != 1 {
				t.Fatalf("holder's desired state: %+v", ws)
			}
			if ws := statefulOn(t, reg, other.ID); len(ws) != 0 {
				t.Fatalf("the other node got the stateful workload: %+v", ws)
			}
			if len(lr.grants) != 1 || lr.grants[0] != holder.ID+":1" {
				t.Fatalf("grants sent: %v", lr.grants)
			}

			// The holder goes silent.
			if err := reg.SessionEnded(ctx, holder.ID, "ses_"+holder.ID); err != nil {
				t.Fatal(err)
			}
			clock.Advance(18*time.Second - time.Millisecond)
			if err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if got, _ := auth.Get(ctx, l.ID); got.Holder != holder.ID {
				t.Fatalf("moved before the gate: %+v", got)
			}
			clock.Advance(time.Millisecond)
			if err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if mode == node.LeaseLocal {
				if got, _ := auth.Get(ctx, l.ID); got.Holder != holder.ID {
					t.Fatalf("a local lease moved by time: %+v", got)
				}
				if _, err := auth.Lost(ctx, holder.ID); err != nil {
					t.Fatal(err)
				}
				if err := r.Pass(ctx); err != nil {
					t.Fatal(err)
				}
			}
			got, _ := auth.Get(ctx, l.ID)
			wantToken := int64(2)
			if mode == node.LeaseLocal {
				wantToken = 3 // lost incremented once, the new grant once more
			}
			if got.Holder != other.ID || got.FencingToken != wantToken {
				t.Fatalf("after the holder went away: %+v, want %s at token %d", got, other.ID, wantToken)
			}
			if ws := statefulOn(t, reg, holder.ID); len(ws) != 0 {
				t.Fatalf("the old holder still has the stateful workload: %+v", ws)
			}
			ws = statefulOn(t, reg, other.ID)
			if len(ws) != 1 || ws[0].FencingToken != wantToken {
				t.Fatalf("new holder's desired state: %+v", ws)
			}
			wls, _ := cat.ListWorkloads(ctx, bson.M{"service_id": svc.ID})
			if len(wls) != 1 || wls[0].NodeID != other.ID {
				t.Fatalf("workloads: %+v", wls)
			}
			if mode == node.LeaseExpiring && (len(lr.revokes) != 1 || lr.revokes[0] != holder.ID+":moved:2") {
				t.Fatalf("revokes sent: %v", lr.revokes)
			}

			// Deleting the service frees the lease for good and revokes its holder.
			if _, err := cat.RemoveService(ctx, p, "db", nil); err != nil {
				t.Fatal(err)
			}
			if err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if got, _ := auth.Get(ctx, l.ID); !got.Deleted || got.Holder != "" || got.FencingToken != wantToken+1 {
				t.Fatalf("lease of the deleted service: %+v", got)
			}
		})
	}
}

// TestStatefulBlockedByFailedFence: while a failed fence is outstanding the service's slot goes to
// no node and disappears from every desired state.
func TestStatefulBlockedByFailedFence(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	auth := fencing.New(st, fencing.Config{})
	a, b := enroll(t, reg), enroll(t, reg)
	r := New(Config{Catalog: cat, Runtime: rollout.NewStore(st, cat, nil), Nodes: reg, Compiler: routes.Native{}, Leases: auth})
	p, _, _ := cat.EnsureProject(ctx, "default")
	svc, _, err := cat.PutService(ctx, p, &services.Service{Name: "db", BundleDigest: "sha256:1", Command: []string{"./db"}, Replicas: 1,
		PlacementMode: services.PlacementStateful, LeaseMode: "local"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	l, _ := auth.Get(ctx, fencing.LeaseID(svc.ID))
	if err := auth.RecordFenceFailure(ctx, l.Holder, nodes.FenceFailure{LeaseID: l.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Lost(ctx, l.Holder); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*nodes.Node{a, b} {
		if ws := statefulOn(t, reg, n.ID); len(ws) != 0 {
			t.Fatalf("blocked lease, yet node %s has %+v", n.ID, ws)
		}
	}
	if got, _ := auth.Get(ctx, l.ID); got.Holder != "" || !got.Blocked() {
		t.Fatalf("blocked lease granted: %+v", got)
	}
	if _, err := auth.FenceAck(ctx, l.Holder, []string{l.ID}); err != nil {
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := auth.Get(ctx, l.ID)
	if got.Holder == "" || got.FencingToken != 4 {
		t.Fatalf("after the acknowledgement: %+v (want granted at token 4: grant 1, lost 2, ack 3, grant 4)", got)
	}
	if ws := statefulOn(t, reg, got.Holder); len(ws) != 1 || ws[0].FencingToken != 4 {
		t.Fatalf("holder's desired state: %+v", ws)
	}
}
