package operations_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newQueue(t *testing.T, st *store.Store, clk *clocktest.Clock) *operations.Queue {
	t.Helper()
	q := operations.NewQueue(st, operations.Config{Now: clk.Now, Policy: operations.Policy{
		LeaseTTL: 30 * time.Second, BaseDelay: time.Second, MaxDelay: 8 * time.Second, MaxAttempts: 3}})
	if err := q.EnsureIndexes(context.Background()); err != nil {
		t.Fatal(err)
	}
	return q
}

func enqueue(t *testing.T, q *operations.Queue, project, key, payload string) *operations.Operation {
	t.Helper()
	op, _, err := q.Enqueue(context.Background(), operations.EnqueueRequest{ProjectID: project, Kind: "reconcile", IdempotencyKey: key, Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func claimOne(t *testing.T, q *operations.Queue, node string) operations.Claimed {
	t.Helper()
	got, err := q.Claim(context.Background(), node, 1, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim by %s: %d operations, %v; want 1", node, len(got), err)
	}
	return got[0]
}

func holder(c operations.Claimed) operations.Holder {
	return operations.Holder{NodeID: c.Operation.NodeID, Token: c.LeaseToken, Fence: c.Operation.Fence}
}

// Failure semantics: duplicate requests converge through idempotency keys.
func TestFailureDuplicateRequestsConvergeThroughIdempotencyKeys(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, storetest.Open(t), clocktest.New(t0))
	a := enqueue(t, q, "prj_a", "deploy-7", `{"release":"r7"}`)
	b, created, err := q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: "prj_a", Kind: "reconcile", IdempotencyKey: "deploy-7", Payload: json.RawMessage(`{"release":"r7"}`)})
	if err != nil || created || b.ID != a.ID {
		t.Fatalf("repeat = %s created=%v %v; want %s, not created", b.ID, created, err, a.ID)
	}
	if _, _, err := q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: "prj_a", Kind: "reconcile", IdempotencyKey: "deploy-7", Payload: json.RawMessage(`{"release":"r8"}`)}); !errors.Is(err, operations.ErrIdempotencyKeyReused) {
		t.Fatalf("same key, other body: %v, want ErrIdempotencyKeyReused", err)
	}
	if other := enqueue(t, q, "prj_b", "deploy-7", `{"release":"r8"}`); other.ID == a.ID {
		t.Fatal("the same key in another project must be another operation")
	}
	ops, _ := q.List(ctx, "prj_a")
	if len(ops) != 1 {
		t.Fatalf("project a has %d operations, want 1", len(ops))
	}
}

// Failure semantics: crashed workers leave leased operations that become reclaimable; the reclaim
// has a higher fence and the crashed worker's late completion is rejected.
func TestFailureCrashedWorkerLeavesReclaimableOperation(t *testing.T) {
	ctx := context.Background()
	clk := clocktest.New(t0)
	q := newQueue(t, storetest.Open(t), clk)
	op := enqueue(t, q, "prj_a", "k1", `{}`)
	first := claimOne(t, q, "node-1")
	if got, _ := q.Claim(ctx, "node-2", 5, nil); len(got) != 0 {
		t.Fatalf("a live lease was claimed again: %+v", got)
	}
	clk.Advance(31 * time.Second) // node-1 crashed and never renewed
	second := claimOne(t, q, "node-2")
	if second.Operation.ID != op.ID || second.Operation.Fence <= first.Operation.Fence || second.Operation.Attempts != 2 {
		t.Fatalf("reclaim = %+v; want the same operation, fence > %d, attempt 2", second.Operation, first.Operation.Fence)
	}
	if _, err := q.Complete(ctx, op.ID, holder(first), nil); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want ErrLeaseLost", err)
	}
	if _, err := q.Renew(ctx, op.ID, holder(first)); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("stale renewal: %v, want ErrLeaseLost", err)
	}
	forged := holder(second)
	forged.Token = first.LeaseToken
	if _, err := q.Complete(ctx, op.ID, forged, nil); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("completion with the current fence but an old token: %v, want ErrLeaseLost", err)
	}
	done, err := q.Complete(ctx, op.ID, holder(second), json.RawMessage(`{"ok":true}`))
	if err != nil || done.State != operations.Succeeded {
		t.Fatalf("completion by the current holder = %v, %v", done.State, err)
	}
	if _, err := q.Complete(ctx, op.ID, holder(second), nil); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("second completion: %v, want ErrLeaseLost", err)
	}
}

// Failure semantics: retry delay is exponential and bounded; exhausted operations enter failed.
func TestFailureRetryDelayIsExponentialBoundedAndExhaustionFails(t *testing.T) {
	p := operations.Policy{BaseDelay: time.Second, MaxDelay: 8 * time.Second}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
	for i, w := range want {
		if got := p.Backoff(i + 1); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	ctx := context.Background()
	clk := clocktest.New(t0)
	q := newQueue(t, storetest.Open(t), clk) // 3 attempts
	op := enqueue(t, q, "prj_a", "k", `{}`)
	for attempt := 1; attempt <= 3; attempt++ {
		c := claimOne(t, q, "node-1")
		got, err := q.Fail(ctx, op.ID, holder(c), "boom", true)
		if err != nil {
			t.Fatal(err)
		}
		if attempt < 3 {
			if got.State != operations.Retry || !got.AvailableAt.Equal(clk.Now().Add(p.Backoff(attempt))) {
				t.Fatalf("attempt %d: %s available at %v", attempt, got.State, got.AvailableAt)
			}
			clk.Advance(p.Backoff(attempt) - time.Millisecond)
			if c, _ := q.Claim(ctx, "node-1", 1, nil); len(c) != 0 {
				t.Fatalf("attempt %d: claimed before its retry delay", attempt)
			}
			clk.Advance(time.Millisecond)
		} else if got.State != operations.Failed {
			t.Fatalf("after the last attempt: %s, want failed", got.State)
		}
	}
	// A lease that expires on the last attempt is failed by the sweep.
	op2 := enqueue(t, q, "prj_a", "k2", `{}`)
	for range 3 {
		claimOne(t, q, "node-1")
		clk.Advance(31 * time.Second)
	}
	if n, err := q.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep = %d, %v", n, err)
	}
	if got, _ := q.Get(ctx, op2.ID); got.State != operations.Failed {
		t.Fatalf("expired last attempt: %s, want failed", got.State)
	}
}

// TestFencesComeFromOneDurableSequencePerProject: later work gets higher fences than earlier work of
// the same project, unrelated projects are independent, a restart does not reset the sequence, and
// revocation removes it only after the operations are revoked.
func TestFencesComeFromOneDurableSequencePerProject(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	unlock := func() error { return nil }
	open := func() *store.Store {
		_ = unlock() // the previous opening was closed by the caller
		var err error
		if unlock, err = store.LockDir(dir); err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(ctx, store.Config{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close(ctx); _ = unlock() })
		return st
	}
	clk := clocktest.New(t0)
	st := open()
	q := newQueue(t, st, clk)
	enqueue(t, q, "prj_a", "r1", `{"release":"r1"}`)
	a1 := claimOne(t, q, "n")
	enqueue(t, q, "prj_a", "r2", `{"release":"r2"}`)
	a2 := claimOne(t, q, "n")
	enqueue(t, q, "prj_b", "r1", `{}`)
	b1 := claimOne(t, q, "n")
	if a1.Operation.Fence != 1 || a2.Operation.Fence != 2 || b1.Operation.Fence != 1 {
		t.Fatalf("fences a=%d,%d b=%d; want 1,2 and 1", a1.Operation.Fence, a2.Operation.Fence, b1.Operation.Fence)
	}
	if err := st.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st = open()
	q = newQueue(t, st, clk)
	enqueue(t, q, "prj_a", "r3", `{"release":"r3"}`)
	if a3 := claimOne(t, q, "n"); a3.Operation.Fence != 3 {
		t.Fatalf("after a restart the fence is %d, want 3", a3.Operation.Fence)
	}
	if err := q.RevokeProject(ctx, "prj_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Complete(ctx, a2.Operation.ID, holder(a2), nil); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("completion of a revoked operation: %v", err)
	}
	var seq struct{ Value int64 }
	if err := store.FindByID(ctx, st.Collection(store.SequencesCollection), operations.FenceSequence("prj_a"), &seq); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("sequence after revocation: %+v, %v; want removed", seq, err)
	}
	if err := store.FindByID(ctx, st.Collection(store.SequencesCollection), operations.FenceSequence("prj_b"), &seq); err != nil || seq.Value != 1 {
		t.Fatalf("the unrelated project's sequence = %d, %v", seq.Value, err)
	}
}
