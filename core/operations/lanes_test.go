package operations

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

var laneT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func laneQueue(t *testing.T) (*Queue, *store.Store, *clocktest.Clock) {
	t.Helper()
	st := storetest.Open(t)
	clk := clocktest.New(laneT0)
	return NewQueue(st, Config{Now: clk.Now, Policy: Policy{LeaseTTL: 30 * time.Second, MaxAttempts: 3}}), st, clk
}

func mustClaim(t *testing.T, q *Queue, node string, want int) []Claimed {
	t.Helper()
	got, err := q.Claim(context.Background(), node, 16, nil)
	if err != nil || len(got) != want {
		t.Fatalf("claim by %s = %d operations, %v; want %d", node, len(got), err, want)
	}
	return got
}

// TestClaimPassesASlotWhoseWriterCrashed: a slot number taken but never written (its writer died)
// does not stall the lane: the first claim that reaches it writes a tombstone and goes on.
func TestClaimPassesASlotWhoseWriterCrashed(t *testing.T) {
	ctx := context.Background()
	q, st, _ := laneQueue(t)
	if _, err := store.NextSequence(ctx, st, laneSequence(laneOf(""))); err != nil { // the crashed writer's slot
		t.Fatal(err)
	}
	op, _, err := q.Enqueue(ctx, EnqueueRequest{ProjectID: "prj_a", Kind: "k", IdempotencyKey: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, q, "n1", 1); got[0].Operation.ID != op.ID {
		t.Fatalf("claimed %s, want %s", got[0].Operation.ID, op.ID)
	}
	var s slot
	if err := store.FindByID(ctx, q.lanes, slotKey("*", 1), &s); err != nil || s.Op != "" {
		t.Fatalf("slot 1 = %+v, %v; want a tombstone", s, err)
	}
	// A late writer of the tombstoned slot is refused and queues under a new one.
	if ok, err := q.writeSlot(ctx, slotKey("*", 1), "op_late"); ok || err != nil {
		t.Fatalf("late write of a tombstoned slot = %v, %v; want refused", ok, err)
	}
}

// TestEnqueueFinishesAnInterruptedIntent: a request whose intent record was written but whose
// operation was not (the first attempt died between the two writes) is finished by its repeat, which
// converges on the recorded operation id; a lost slot write is repaired by a claim and the sweep.
func TestEnqueueFinishesAnInterruptedIntent(t *testing.T) {
	ctx := context.Background()
	q, _, _ := laneQueue(t)
	req := EnqueueRequest{ProjectID: "prj_a", Kind: "k", IdempotencyKey: "key-1"}
	// The first attempt: the whole enqueue, then its operation and slot removed as if never written.
	first, created, err := q.Enqueue(ctx, req)
	if err != nil || !created {
		t.Fatal(err)
	}
	if _, err := q.live.For(first.ID).DeleteOne(ctx, bson.M{"_id": first.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.lanes.DeleteOne(ctx, bson.M{"_id": first.Lane}); err != nil {
		t.Fatal(err)
	}
	again, created, err := q.Enqueue(ctx, req)
	if err != nil || created || again.ID != first.ID || again.State != Queued {
		t.Fatalf("repeat = %+v, created %v, %v; want the recorded operation, queued", again, created, err)
	}
	mustClaim(t, q, "n1", 1)

	// An operation whose slot write was lost: a claim tombstones the slot, the sweep queues the
	// operation again, the next claim takes it.
	op, _, err := q.Enqueue(ctx, EnqueueRequest{ProjectID: "prj_a", Kind: "k", IdempotencyKey: "key-2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.lanes.DeleteOne(ctx, bson.M{"_id": op.Lane}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, q, "n1", 0)
	if _, err := q.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustClaim(t, q, "n1", 1); got[0].Operation.ID != op.ID {
		t.Fatalf("claimed %s after the repair, want %s", got[0].Operation.ID, op.ID)
	}
}

// TestSettledOperationsLeaveTheLiveSet: a settled operation moves to the archive, stays readable and
// listed, keeps its idempotency key, and its lease is refused.
func TestSettledOperationsLeaveTheLiveSet(t *testing.T) {
	ctx := context.Background()
	q, st, _ := laneQueue(t)
	req := EnqueueRequest{ProjectID: "prj_a", Kind: "k", IdempotencyKey: "key-1"}
	op, _, err := q.Enqueue(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c := mustClaim(t, q, "n1", 1)[0]
	h := Holder{NodeID: "n1", Token: c.LeaseToken, Fence: c.Operation.Fence}
	if _, err := q.Complete(ctx, op.ID, h, []byte(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	if n, _ := q.live.For(op.ID).CountDocuments(ctx, bson.M{"_id": op.ID}); n != 0 {
		t.Fatal("a settled operation is still in the live set")
	}
	if n, _ := st.Collection(ArchiveCollection).CountDocuments(ctx, bson.M{"_id": op.ID}); n != 1 {
		t.Fatal("a settled operation is not in the archive")
	}
	got, err := q.Get(ctx, op.ID)
	if err != nil || got.State != Succeeded || got.Result != `{"ok":true}` {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if ops, err := q.List(ctx, "prj_a"); err != nil || len(ops) != 1 {
		t.Fatalf("list = %d, %v", len(ops), err)
	}
	if again, created, err := q.Enqueue(ctx, req); err != nil || created || again.ID != op.ID {
		t.Fatalf("repeat after settlement = %+v, %v, %v", again, created, err)
	}
	if _, err := q.Renew(ctx, op.ID, h); err == nil {
		t.Fatal("renewal of a settled operation accepted")
	}
	tok, _, _ := identity.NewToken(PrefixLease)
	if _, err := q.Check(ctx, op.ID, Holder{NodeID: "n1", Token: tok, Fence: c.Operation.Fence}); err == nil {
		t.Fatal("check of a settled operation accepted")
	}
}

// TestMigrateLegacyKeepsWorkHistoryKeysAndFences: operations of the earlier single-collection
// layout move to the live set, the lanes and the archive; queued work is claimable with a fence
// above the ones given before, a lease stays valid for its holder, settled history stays readable,
// keys keep converging, and a second run changes nothing.
func TestMigrateLegacyKeepsWorkHistoryKeysAndFences(t *testing.T) {
	ctx := context.Background()
	q, st, clk := laneQueue(t)
	now := clk.Now()
	tok, digest, _ := identity.NewToken(PrefixLease)
	legacy := []any{
		Operation{ID: "op_done", ProjectID: "prj_a", Kind: "k", IdempotencyKey: "done", RequestDigest: requestDigest("k", "", 3, []byte("{}")), Payload: "{}", State: Succeeded, Attempts: 1, MaxAttempts: 3, Fence: 1, CreatedAt: now, AvailableAt: now},
		Operation{ID: "op_leased", ProjectID: "prj_a", Kind: "k", IdempotencyKey: "leased", State: Leased, Attempts: 1, MaxAttempts: 3, Fence: 2,
			NodeID: "n1", TokenDigest: digest, LeaseExpiresAt: now.Add(20 * time.Second), CreatedAt: now.Add(time.Millisecond), AvailableAt: now},
		Operation{ID: "op_queued", ProjectID: "prj_a", Kind: "k", IdempotencyKey: "queued", State: Queued, MaxAttempts: 3, CreatedAt: now.Add(2 * time.Millisecond), AvailableAt: now},
	}
	if _, err := st.Collection(Collection).InsertMany(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the fence sequence as the earlier layout left it
		if _, err := store.NextSequence(ctx, st, FenceSequence("prj_a")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.MigrateLegacy(ctx); err != nil || n != 3 {
		t.Fatalf("migrate = %d, %v", n, err)
	}
	if n, err := q.MigrateLegacy(ctx); err != nil || n != 0 {
		t.Fatalf("second migrate = %d, %v", n, err)
	}
	if n, _ := st.Collection(Collection).CountDocuments(ctx, bson.M{}); n != 0 {
		t.Fatalf("%d operations left in the old collection", n)
	}
	got := mustClaim(t, q, "n2", 1)
	if got[0].Operation.ID != "op_queued" || got[0].Operation.Fence != 3 {
		t.Fatalf("claim after migration = %s fence %d; want op_queued fence 3", got[0].Operation.ID, got[0].Operation.Fence)
	}
	if _, err := q.Renew(ctx, "op_leased", Holder{NodeID: "n1", Token: tok, Fence: 2}); err != nil {
		t.Fatalf("renewal of a migrated lease: %v", err)
	}
	if o, err := q.Get(ctx, "op_done"); err != nil || o.State != Succeeded {
		t.Fatalf("migrated history = %+v, %v", o, err)
	}
	if o, created, err := q.Enqueue(ctx, EnqueueRequest{ProjectID: "prj_a", Kind: "k", IdempotencyKey: "done", MaxAttempts: 3}); err != nil || created || o.ID != "op_done" {
		t.Fatalf("repeat of a migrated key = %+v, %v, %v", o, created, err)
	}
}
