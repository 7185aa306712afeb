package fencing_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

type fixture struct {
	st    *store.Store
	reg   *nodes.Registry
	auth  *fencing.Authority
	clock *clocktest.Clock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st := storetest.Open(t)
	clock := clocktest.New(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC))
	return &fixture{st: st, reg: nodes.NewRegistry(st, nil), auth: fencing.New(st, fencing.Config{Now: clock.Now}), clock: clock}
}

func (f *fixture) enroll(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	tok, _, err := f.reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, _, err := f.reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: name, Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return n.ID
}

func grant(mode node.LeaseMode, d time.Duration, nodeID string) fencing.GrantRequest {
	return fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: "svc_01TEST", NodeID: nodeID, Mode: mode, Duration: d}
}

func TestAuthorityExpiringMoveAfterGate(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1, n2 := f.enroll(t, "n1"), f.enroll(t, "n2")
	d := 15 * time.Second
	l, moved, err := f.auth.Grant(ctx, grant(node.LeaseExpiring, d, n1))
	if err != nil || moved != "" || l.FencingToken != 1 || l.Holder != n1 || l.ID != "lse_01TEST" {
		t.Fatalf("first grant: %+v moved %q err %v", l, moved, err)
	}
	// Renewals keep the token and move T_grant.
	f.clock.Advance(5 * time.Second)
	l, err = f.auth.Renew(ctx, l.ID, n1, 1)
	if err != nil || l.FencingToken != 1 || !l.GrantedAt.Equal(f.clock.Now()) {
		t.Fatalf("renew: %+v %v", l, err)
	}
	renewedAt := f.clock.Now()
	// n1 goes silent. Before T_grant + D + 2M nobody else gets it.
	f.clock.Advance(18*time.Second - time.Millisecond)
	if _, _, err := f.auth.Grant(ctx, grant(node.LeaseExpiring, d, n2)); !errors.Is(err, fencing.ErrHeld) {
		t.Fatalf("grant to n2 before the gate: %v", err)
	}
	f.clock.Advance(time.Millisecond)
	l, moved, err = f.auth.Grant(ctx, grant(node.LeaseExpiring, d, n2))
	if err != nil || moved != n1 || l.FencingToken != 2 || l.Holder != n2 {
		t.Fatalf("grant to n2 at the gate (renewed at %s): %+v moved %q err %v", renewedAt, l, moved, err)
	}
	// n1 comes back and renews with its old token: stale.
	if _, err := f.auth.Renew(ctx, l.ID, n1, 1); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("old holder's renewal: %v", err)
	}
	// A grant message carries the lease and verifies.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	g, err := l.GrantMessage(priv)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(g)
	if got, err := node.VerifyLeaseGrant(raw, priv.Public().(ed25519.PublicKey)); err != nil || got.FencingToken != 2 || got.DurationMS != 15000 {
		t.Fatalf("grant message: %+v %v", got, err)
	}
}

func TestAuthorityLocalMovesOnlyByReleaseOrLost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1, n2 := f.enroll(t, "n1"), f.enroll(t, "n2")
	l, _, err := f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n1))
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(1000 * time.Hour)
	if _, _, err := f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n2)); !errors.Is(err, fencing.ErrHeld) {
		t.Fatalf("local lease moved by time: %v", err)
	}
	changed, err := f.auth.Lost(ctx, n1)
	if err != nil || len(changed) != 1 || changed[0].FencingToken != 2 || changed[0].Holder != "" {
		t.Fatalf("lost: %+v %v", changed, err)
	}
	if again, err := f.auth.Lost(ctx, n1); err != nil || len(again) != 0 {
		t.Fatalf("second lost changed %+v %v", again, err)
	}
	l, _, err = f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n2))
	if err != nil || l.FencingToken != 3 || l.Holder != n2 {
		t.Fatalf("grant after lost: %+v %v", l, err)
	}
	// A confirmed revoke frees it at once; the next grant has a higher token.
	if _, err := f.auth.Release(ctx, l.ID, n2, 2); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("release under an old token: %v", err)
	}
	if _, err := f.auth.Release(ctx, l.ID, n2, 3); err != nil {
		t.Fatal(err)
	}
	l, _, err = f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n1))
	if err != nil || l.FencingToken != 4 {
		t.Fatalf("grant after release: %+v %v", l, err)
	}
	// Deleting the service frees it for good with a higher token.
	before, err := f.auth.Delete(ctx, "svc_01TEST")
	if err != nil || before.Holder != n1 {
		t.Fatalf("delete: %+v %v", before, err)
	}
	if l, _ := f.auth.Get(ctx, l.ID); l.FencingToken != 5 || !l.Deleted || l.Holder != "" {
		t.Fatalf("after delete: %+v", l)
	}
	if _, _, err := f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n2)); !errors.Is(err, fencing.ErrDeleted) {
		t.Fatalf("grant of a deleted lease: %v", err)
	}
}

func TestAuthorityFailedFenceAndAck(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1, n2 := f.enroll(t, "n1"), f.enroll(t, "n2")
	l, _, err := f.auth.Grant(ctx, grant(node.LeaseExpiring, 3*time.Second, n1))
	if err != nil {
		t.Fatal(err)
	}
	ff := nodes.FenceFailure{LeaseID: l.ID, ResourceID: l.ResourceID, FencingToken: 1, WorkloadIDs: []string{"wl_1"}}
	if err := f.auth.RecordFenceFailure(ctx, n1, ff); err != nil {
		t.Fatal(err)
	}
	if err := f.auth.RecordFenceFailure(ctx, n1, ff); err != nil {
		t.Fatal(err)
	}
	n, _ := f.reg.Get(ctx, n1)
	if len(n.FenceFailure) != 1 || n.FenceFailure[0].LeaseID != l.ID {
		t.Fatalf("node fence_failure %+v", n.FenceFailure)
	}
	// Blocked for everyone, long after any gate; renewals too.
	f.clock.Advance(time.Hour)
	if _, _, err := f.auth.Grant(ctx, grant(node.LeaseExpiring, 3*time.Second, n2)); !errors.Is(err, fencing.ErrBlocked) {
		t.Fatalf("grant while blocked: %v", err)
	}
	if _, err := f.auth.Renew(ctx, l.ID, n1, 1); !errors.Is(err, fencing.ErrBlocked) {
		t.Fatalf("renew while blocked: %v", err)
	}
	// The acknowledgement must list exactly the outstanding leases.
	for _, ids := range [][]string{nil, {"lse_other"}, {l.ID, "lse_other"}} {
		if _, err := f.auth.FenceAck(ctx, n1, ids); !errors.Is(err, fencing.ErrAckMismatch) {
			t.Fatalf("ack %v: %v", ids, err)
		}
	}
	acked, err := f.auth.FenceAck(ctx, n1, []string{l.ID})
	if err != nil || len(acked) != 1 || acked[0].FencingToken != 2 || acked[0].Holder != "" {
		t.Fatalf("ack: %+v %v", acked, err)
	}
	n, _ = f.reg.Get(ctx, n1)
	if len(n.FenceFailure) != 0 || len(n.FenceAckPending) != 1 || len(n.FenceAcked) != 0 {
		t.Fatalf("node after ack: failure %+v pending %v acked %v", n.FenceFailure, n.FenceAckPending, n.FenceAcked)
	}
	l, _, err = f.auth.Grant(ctx, grant(node.LeaseExpiring, 3*time.Second, n2))
	if err != nil || l.FencingToken != 3 {
		t.Fatalf("grant after ack: %+v %v", l, err)
	}
	if err := f.auth.AckDelivered(ctx, n1, []string{l.ID}); err != nil {
		t.Fatal(err)
	}
	if n, _ = f.reg.Get(ctx, n1); len(n.FenceAckPending) != 0 {
		t.Fatalf("pending after delivery: %v", n.FenceAckPending)
	}
}

// TestAuthoritySweepCompletesInterruptedSteps writes the intermediate states a crash can leave and
// checks Sweep completes them.
func TestAuthoritySweepCompletesInterruptedSteps(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1 := f.enroll(t, "n1")
	l, _, err := f.auth.Grant(ctx, grant(node.LeaseLocal, 0, n1))
	if err != nil {
		t.Fatal(err)
	}
	// A failure recorded on the lease but not on the node.
	if _, err := f.st.Collection(fencing.Collection).UpdateOne(ctx, bson.M{"_id": l.ID}, bson.M{"$set": bson.M{"fence_failed": []string{n1}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.auth.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ := f.reg.Get(ctx, n1)
	if len(n.FenceFailure) != 1 || n.FenceFailure[0].LeaseID != l.ID {
		t.Fatalf("sweep did not record the failure on the node: %+v", n.FenceFailure)
	}
	// An acknowledgement recorded on the node but not applied to the lease.
	if _, err := f.st.Collection("nodes").UpdateOne(ctx, bson.M{"_id": n1}, bson.M{"$set": bson.M{
		"fence_failure": bson.A{}, "fence_acked": bson.A{l.ID}, "fence_ack_pending": bson.A{l.ID}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.auth.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := f.auth.Get(ctx, l.ID)
	if got.Blocked() || got.FencingToken != 2 || got.Holder != "" {
		t.Fatalf("sweep did not apply the acknowledgement: %+v", got)
	}
	if n, _ = f.reg.Get(ctx, n1); len(n.FenceAcked) != 0 || len(n.FenceFailure) != 0 {
		t.Fatalf("node after sweep: %+v", n)
	}
}

func TestGuardRejectsLowerTokens(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	g := fencing.NewGuard(f.st, f.clock.Now)
	for _, tok := range []int64{1, 1, 3} {
		if err := g.Check(ctx, "svc_a", tok); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	for _, tok := range []int64{2, 0, -1} {
		if err := g.Check(ctx, "svc_a", tok); !errors.Is(err, fencing.ErrStaleToken) {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	if err := g.Check(ctx, "svc_b", 1); err != nil {
		t.Fatalf("another resource: %v", err)
	}
	rec, err := g.Record(ctx, "svc_a")
	if err != nil || rec.Token != 3 || rec.Accepted != 3 || rec.Rejected != 3 || rec.LastRejectedToken != -1 {
		t.Fatalf("record %+v %v", rec, err)
	}
	// Durable: a new guard over the same store knows the highest token.
	if err := fencing.NewGuard(f.st, nil).Check(ctx, "svc_a", 2); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("a fresh guard forgot the highest token: %v", err)
	}
}
