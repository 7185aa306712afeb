package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/sdk/client"
)

type leaseAPI struct {
	auth    *fencing.Authority
	reg     *nodes.Registry
	admin   *client.Client
	machine *client.Client
	n1      string
	clog    *changelog.Log
}

func newLeaseAPI(t *testing.T) *leaseAPI {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t)
	tokens := testTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	machine, err := tokens.Create(ctx, identity.KindMachine, "ci", []identity.Scope{identity.ScopeAdmin}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.NewRegistry(st, nil)
	bs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	auth := fencing.New(st, fencing.Config{})
	clog := changelog.New(st, 1, nil)
	cat := services.NewCatalog(st, nil)
	s := New(Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Changelog: clog, Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: nopHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Leases: auth, Guard: fencing.NewGuard(st, nil)})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	a, _ := client.New(srv.URL, client.WithToken(admin))
	m, _ := client.New(srv.URL, client.WithToken(machine))
	tok, _, err := reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	npub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(npub), Hostname: "n1", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return &leaseAPI{auth: auth, reg: reg, admin: a, machine: m, n1: n.ID, clog: clog}
}

func (f *leaseAPI) grant(t *testing.T, svc string) *fencing.Lease {
	t.Helper()
	l, _, err := f.auth.Grant(context.Background(), fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: svc, NodeID: f.n1, Mode: node.LeaseLocal})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestNodeLostAndFenceAckEndpoints(t *testing.T) {
	t.Parallel()
	f := newLeaseAPI(t)
	ctx := context.Background()
	a := f.grant(t, "svc_A")
	b := f.grant(t, "svc_B")

	// Human-only: a machine token with admin scope is refused.
	if _, err := f.machine.NodeLost(ctx, f.n1); !client.IsCode(err, "forbidden") {
		t.Fatalf("machine declared a node lost: %v", err)
	}
	if _, err := f.admin.NodeLost(ctx, "nod_nope"); !client.IsCode(err, "node_not_found") {
		t.Fatalf("unknown node: %v", err)
	}
	got, err := f.admin.NodeLost(ctx, f.n1)
	if err != nil || len(got.Leases) != 2 || got.Leases[0].FencingToken != 2 || got.Leases[0].Holder != "" {
		t.Fatalf("lost: %+v %v", got, err)
	}
	if again, err := f.admin.NodeLost(ctx, f.n1); err != nil || len(again.Leases) != 0 {
		t.Fatalf("second lost: %+v %v", again, err)
	}
	ls, err := f.admin.ListLeases(ctx)
	if err != nil || len(ls) != 2 || ls[0].GateAt == nil {
		t.Fatalf("leases: %+v %v", ls, err)
	}

	// A failed fence: granted to nobody until an exact acknowledgement.
	a = f.grant(t, "svc_A")
	if err := f.auth.RecordFenceFailure(ctx, f.n1, nodes.FenceFailure{LeaseID: a.ID, FencingToken: a.FencingToken, WorkloadIDs: []string{"wl_1"}}); err != nil {
		t.Fatal(err)
	}
	fence, err := f.admin.NodeFence(ctx, f.n1)
	if err != nil || len(fence.FenceFailure) != 1 || fence.FenceFailure[0].LeaseID != a.ID {
		t.Fatalf("fence state: %+v %v", fence, err)
	}
	if _, err := f.machine.FenceAck(ctx, f.n1, []string{a.ID}); !client.IsCode(err, "forbidden") {
		t.Fatalf("machine acknowledged a fence: %v", err)
	}
	for _, ids := range [][]string{{b.ID}, {a.ID, b.ID}} {
		if _, err := f.admin.FenceAck(ctx, f.n1, ids); !client.IsCode(err, "fence_ack_mismatch") {
			t.Fatalf("ack %v: %v", ids, err)
		}
	}
	if _, err := f.admin.FenceAck(ctx, f.n1, nil); !client.IsCode(err, "validation_failed") {
		t.Fatalf("empty ack: %v", err)
	}
	acked, err := f.admin.FenceAck(ctx, f.n1, []string{a.ID})
	if err != nil || len(acked.Leases) != 1 || acked.Leases[0].FencingToken != a.FencingToken+1 {
		t.Fatalf("ack: %+v %v", acked, err)
	}
	fence, _ = f.admin.NodeFence(ctx, f.n1)
	if len(fence.FenceFailure) != 0 || len(fence.FenceAckPending) != 1 {
		t.Fatalf("after ack: %+v", fence)
	}
}

func TestFencedBundleWrite(t *testing.T) {
	t.Parallel()
	f := newLeaseAPI(t)
	ctx := context.Background()
	bundle := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if _, err := f.admin.PushBundleFenced(ctx, "p", "data", "svc_A", 3, bytes.NewReader(bundle)); err != nil {
		t.Fatalf("token 3: %v", err)
	}
	_, err := f.admin.PushBundleFenced(ctx, "p", "data2", "svc_A", 2, bytes.NewReader(bundle))
	if !client.IsCode(err, "stale_fencing_token") {
		t.Fatalf("token 2 after 3: %v", err)
	}
	list, err := f.admin.ListBundles(ctx, "p")
	if err != nil || len(list) != 1 || list[0].Name != "data" {
		t.Fatalf("the refused write stored something: %+v %v", list, err)
	}
	if _, err := f.admin.PushBundleFenced(ctx, "p", "data3", "", 9, bytes.NewReader(bundle)); !client.IsCode(err, "bad_request") {
		t.Fatalf("token without resource: %v", err)
	}
}

func TestStatefulServiceValidation(t *testing.T) {
	t.Parallel()
	f := newLeaseAPI(t)
	ctx := context.Background()
	bundle := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if _, err := f.admin.PushBundle(ctx, "p", "app", bytes.NewReader(bundle)); err != nil {
		t.Fatal(err)
	}
	one, two := 1, 2
	spec := func(mut func(*client.ServiceSpec)) client.ServiceSpec {
		s := client.ServiceSpec{Bundle: "app", Command: []string{"./app"}, Replicas: &one, PlacementMode: "stateful"}
		mut(&s)
		return s
	}
	for name, tc := range map[string]struct {
		spec client.ServiceSpec
		code string
	}{
		"two replicas":           {spec(func(s *client.ServiceSpec) { s.Replicas = &two }), "validation_failed"},
		"duration below floor":   {spec(func(s *client.ServiceSpec) { s.Lease = &client.LeaseSpec{Mode: "expiring", DurationMS: 2999} }), "validation_failed"},
		"unknown lease mode":     {spec(func(s *client.ServiceSpec) { s.Lease = &client.LeaseSpec{Mode: "forever"} }), "validation_failed"},
		"duration on local":      {spec(func(s *client.ServiceSpec) { s.Lease = &client.LeaseSpec{Mode: "local", DurationMS: 5000} }), "validation_failed"},
		"lease on portable":      {spec(func(s *client.ServiceSpec) { s.PlacementMode = ""; s.Lease = &client.LeaseSpec{Mode: "local"} }), "validation_failed"},
		"unknown placement mode": {spec(func(s *client.ServiceSpec) { s.PlacementMode = "sticky" }), "validation_failed"},
	} {
		if _, err := f.admin.ApplyService(ctx, "p", "db", tc.spec); !client.IsCode(err, tc.code) {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	got, err := f.admin.ApplyService(ctx, "p", "db", spec(func(s *client.ServiceSpec) { s.Lease = &client.LeaseSpec{Mode: "expiring"} }))
	if err != nil || got.PlacementMode != "stateful" || got.Lease == nil || got.Lease.Mode != "expiring" || got.Lease.DurationMS != 15000 {
		t.Fatalf("stateful service: %+v %v", got, err)
	}
	if _, err := f.admin.ApplyService(ctx, "p", "db", spec(func(s *client.ServiceSpec) { s.PlacementMode = "portable" })); !client.IsCode(err, "placement_mode_immutable") {
		t.Fatalf("changing the placement mode: %v", err)
	}
}

// TestNodeLostAndFenceAckLogged: through the API, declaring a node lost
// appends one node_lost entry per superseded lease (none for a repeat), an
// exact fence acknowledgement one node_fence_ack entry (none for a refused
// one), and every outbox is cleared by the request's handover, by the
// principal that made the change.
func TestNodeLostAndFenceAckLogged(t *testing.T) {
	t.Parallel()
	f := newLeaseAPI(t)
	ctx := context.Background()
	a, b := f.grant(t, "svc_A"), f.grant(t, "svc_B")
	for range 2 {
		if _, err := f.admin.NodeLost(ctx, f.n1); err != nil {
			t.Fatal(err)
		}
	}
	c := f.grant(t, "svc_C")
	if err := f.auth.RecordFenceFailure(ctx, f.n1, nodes.FenceFailure{LeaseID: c.ID, FencingToken: c.FencingToken}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.FenceAck(ctx, f.n1, []string{a.ID}); !client.IsCode(err, "fence_ack_mismatch") {
		t.Fatalf("mismatched ack: %v", err)
	}
	if _, err := f.admin.FenceAck(ctx, f.n1, []string{c.ID}); err != nil {
		t.Fatal(err)
	}
	entries, err := f.clog.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.EntityType == "node" {
			continue // the enrollment
		}
		if e.ActorType != "admin" || e.ActorID != "token:bootstrap" {
			t.Errorf("entry %d by %s %s; want the admin token", e.Seq, e.ActorType, e.ActorID)
		}
		got = append(got, e.EntityType+" "+e.EntityID)
	}
	want := []string{fencing.LostEntityType + " " + f.n1, fencing.LostEntityType + " " + f.n1, fencing.FenceAckEntityType + " " + f.n1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("entries %v; want %v", got, want)
	}
	if err := f.clog.Cleared(ctx); err != nil { // outboxes are cleared after the entries
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, b.ID} {
		if l, err := f.auth.Get(ctx, id); err != nil || len(l.LogOutbox) != 0 {
			t.Fatalf("lease %s outbox after the request: %v, %v; want empty", id, l, err)
		}
	}
	if n, err := f.reg.Get(ctx, f.n1); err != nil || len(n.LogOutbox) != 0 {
		t.Fatalf("node outbox after the request: %v; want empty", err)
	}
}
