package plans_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

func seedNodes(t testing.TB, st *store.Store, n, capacity int) {
	t.Helper()
	docs := make([]any, n)
	for i := range docs {
		docs[i] = testNode{ID: fmt.Sprintf("node-%03d", i), Capacity: capacity, Reservations: map[string]int{}}
	}
	if _, err := st.Collection(nodesColl).InsertMany(context.Background(), docs); err != nil {
		t.Fatal(err)
	}
}

func seedOps(t testing.TB, st *store.Store, n int) {
	t.Helper()
	docs := make([]any, n)
	for i := range docs {
		docs[i] = testOp{ID: fmt.Sprintf("op-%04d", i)}
	}
	if _, err := st.Collection(opsColl).InsertMany(context.Background(), docs); err != nil {
		t.Fatal(err)
	}
}

func openApplier(t testing.TB, st *store.Store, opts ...plans.Option) *plans.Applier {
	t.Helper()
	a, err := plans.Open(context.Background(), st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

// storedNode reads a node from the store itself, not the view.
func storedNode(t testing.TB, st *store.Store, id string) testNode {
	t.Helper()
	var n testNode
	if err := store.FindByID(context.Background(), st.Collection(nodesColl), id, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Two submitters race for the last unit of a node, decided in one batch: the first wins, the
// second is refused with a conflict, plans again against the view (which shows the node full
// at once) and lands on the other node.
func TestRaceForTheLastUnit(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	if _, err := st.Collection(nodesColl).InsertMany(ctx, []any{
		testNode{ID: "full-but-one", Capacity: 3, Reserved: 2, Reservations: map[string]int{"a": 1, "b": 1}},
		testNode{ID: "spare", Capacity: 1, Reservations: map[string]int{}},
	}); err != nil {
		t.Fatal(err)
	}
	// A long wait puts both plans in one batch, so the second is decided against the first.
	a := openApplier(t, st, plans.WithMaxWait(200*time.Millisecond))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = a.Submit(ctx, reservePlan("full-but-one", fmt.Sprintf("racer-%d", i), 1, placedOn))
		}()
	}
	wg.Wait()
	won, lost := -1, -1
	for i, err := range errs {
		switch {
		case err == nil:
			won = i
		case errors.Is(err, store.ErrConflict):
			lost = i
		default:
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	if won < 0 || lost < 0 {
		t.Fatalf("want one winner and one conflict, got %v", errs)
	}
	// The loser plans again from the view and gets the other node.
	node, _, err := place(ctx, st, a, rand.New(rand.NewPCG(1, 2)), fmt.Sprintf("racer-%d", lost))
	if err != nil || node != "spare" {
		t.Fatalf("re-plan: %q, %v; want spare", node, err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	full, spare := storedNode(t, st, "full-but-one"), storedNode(t, st, "spare")
	if full.Reserved != 3 || len(full.Reservations) != 3 || full.Reservations[fmt.Sprintf("racer-%d", won)] != 1 {
		t.Fatalf("full-but-one as stored: %+v", full)
	}
	if spare.Reserved != 1 || spare.Reservations[fmt.Sprintf("racer-%d", lost)] != 1 {
		t.Fatalf("spare as stored: %+v", spare)
	}
}

// An accepted decision is in the view as soon as its submitter is answered, before the
// materializer wrote it, and in its document after.
func TestFoldedBeforeMaterialized(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	seedNodes(t, st, 2, 4)
	seedOps(t, st, 1)
	a := openApplier(t, st, plans.WithoutMaterializer())
	if _, err := a.Submit(ctx, reservePlan("node-001", "k1", 2, placedOn)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Submit(ctx, claimPlan("op-0000", "runner-1")); err != nil {
		t.Fatal(err)
	}
	if !st.View().Enabled() {
		// Reads go to the store: a decision is answered only once its document holds it.
		if stored := storedNode(t, st, "node-001"); stored.Reserved != 2 {
			t.Fatalf("answered before materialized with the view off: %+v", stored)
		}
		return
	}
	var n testNode
	if err := st.View().Get(ctx, st.Collection(nodesColl), "node-001", &n); err != nil || n.Reserved != 2 || n.Reservations["k1"] != 2 {
		t.Fatalf("view before materializing: %+v, %v", n, err)
	}
	var found []testNode
	if err := st.View().Find(ctx, st.Collection(nodesColl), bson.D{{Key: "reserved", Value: 2}}, &found); err != nil || len(found) != 1 || found[0].ID != "node-001" {
		t.Fatalf("view find before materializing: %+v, %v", found, err)
	}
	var placed []struct {
		ID   string `bson:"_id"`
		Node string `bson:"node"`
	}
	if err := st.View().Find(ctx, st.Collection("test_placements"), nil, &placed); err != nil || len(placed) != 1 || placed[0].Node != "node-001" {
		t.Fatalf("a folded upsert is not found in the view: %+v, %v", placed, err)
	}
	if stored := storedNode(t, st, "node-001"); stored.Reserved != 0 {
		t.Fatalf("materialized too early: %+v", stored)
	}
	if err := a.Materialize(ctx); err != nil {
		t.Fatal(err)
	}
	if st.View().Folded() != 0 {
		t.Fatalf("%d documents still folded after materializing", st.View().Folded())
	}
	if stored := storedNode(t, st, "node-001"); stored.Reserved != 2 || stored.Reservations["k1"] != 2 {
		t.Fatalf("stored after materializing: %+v", stored)
	}
	var o testOp
	if err := st.View().Get(ctx, st.Collection(opsColl), "op-0000", &o); err != nil || o.Holder != "runner-1" {
		t.Fatalf("claim after materializing: %+v, %v", o, err)
	}
}

// A second applier takes over the log: the first one's next insert finds its sequence number
// taken, it is refused as deposed, and nothing it decided in that batch is anywhere.
func TestDeposedApplierIsRefused(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	seedNodes(t, st, 1, 10)
	seedOps(t, st, 2)
	old := openApplier(t, st)
	if _, err := old.Submit(ctx, claimPlan("op-0000", "old-1")); err != nil {
		t.Fatal(err)
	}
	taker := openApplier(t, st)
	if _, err := taker.Submit(ctx, claimPlan("op-0001", "new-1")); err != nil {
		t.Fatal(err)
	}
	_, err := old.Submit(ctx, reservePlan("node-000", "late", 1, placedOn))
	if !errors.Is(err, plans.ErrDeposed) {
		t.Fatalf("the deposed applier's plan: %v, want ErrDeposed", err)
	}
	if _, err := old.Submit(ctx, claimPlan("op-0001", "old-2")); !errors.Is(err, plans.ErrDeposed) {
		t.Fatalf("a plan after deposition: %v, want ErrDeposed", err)
	}
	if err := taker.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := storedNode(t, st, "node-000"); n.Reserved != 0 || len(n.Reservations) != 0 {
		t.Fatalf("the deposed applier's decision reached the store: %+v", n)
	}
	var o testOp
	if err := store.FindByID(ctx, st.Collection(opsColl), "op-0001", &o); err != nil || o.Holder != "new-1" {
		t.Fatalf("op-0001: %+v, %v", o, err)
	}
}

// Entries durable but never materialized (the applier stopped first) are replayed by the next
// applier's Open: their documents are written and the log goes on after them.
func TestReplayAfterRestart(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	seedNodes(t, st, 3, 5)
	seedOps(t, st, 3)
	first := openApplier(t, st, plans.WithoutMaterializer())
	var last int64
	for i := 0; i < 6; i++ {
		rc, err := first.Submit(ctx, reservePlan(fmt.Sprintf("node-%03d", i%3), fmt.Sprintf("k%d", i), 1, placedOn))
		if err != nil {
			t.Fatal(err)
		}
		last = rc.Seq
	}
	if _, err := first.Submit(ctx, claimPlan("op-0002", "r")); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := st.MaterializedPlan(ctx); err != nil || m != 0 {
		t.Fatalf("materialized mark before the replay: %d, %v", m, err)
	}
	if n := storedNode(t, st, "node-000"); n.Reserved != 0 {
		t.Fatalf("materialized before the replay: %+v", n)
	}
	st.View().Unfold(1 << 62) // what a restarted berthd's empty view holds
	second := openApplier(t, st)
	for i := 0; i < 3; i++ {
		if n := storedNode(t, st, fmt.Sprintf("node-%03d", i)); n.Reserved != 2 || len(n.Reservations) != 2 {
			t.Fatalf("node-%03d after the replay: %+v", i, n)
		}
	}
	var o testOp
	if err := store.FindByID(ctx, st.Collection(opsColl), "op-0002", &o); err != nil || o.Holder != "r" {
		t.Fatalf("op-0002 after the replay: %+v, %v", o, err)
	}
	rc, err := second.Submit(ctx, claimPlan("op-0000", "after"))
	if err != nil || rc.Seq <= last+1 {
		t.Fatalf("first entry after the replay: %+v, %v (the log went to %d)", rc, err, last+1)
	}
}
