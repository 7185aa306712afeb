package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// awaitReady waits at most 10 s for sub to signal.
func awaitReady(t *testing.T, sub *store.Subscription) {
	t.Helper()
	select {
	case <-sub.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription did not signal a write within 10 s")
	}
}

// TestSubscriptionNamesWrittenDocuments: every write of the subscribed collection, whatever its
// shape, is named (by _id, or as "all" when it named no _id or overflowed the bound), writes of
// other collections are not, signals coalesce, and a closed subscription collects nothing.
func TestSubscriptionNamesWrittenDocuments(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	coll, other := st.Collection("subscribed"), st.Collection("other")
	sub := st.View().Subscribe("subscribed", 3)
	defer sub.Close()

	if _, err := coll.InsertOne(ctx, viewDoc{ID: "a", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateIfRevision(ctx, coll, "a", 1, bson.M{"$set": bson.M{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, viewDoc{ID: "b", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.InsertOne(ctx, viewDoc{ID: "x", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	awaitReady(t, sub)
	ids, all := sub.Take()
	slices.Sort(ids)
	if all || !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("Take = %v, all %v; want [a b] only", ids, all)
	}
	if ids, all := sub.Take(); len(ids) != 0 || all {
		t.Fatalf("a second Take = %v, %v; want nothing", ids, all)
	}

	// A write that names no _id may have changed any document.
	if _, err := coll.UpdateMany(ctx, bson.M{"n": 1}, bson.M{"$set": bson.M{"tag": "t"}}); err != nil {
		t.Fatal(err)
	}
	awaitReady(t, sub)
	if _, all := sub.Take(); !all {
		t.Fatal("an update by filter was not reported as all")
	}

	// More distinct ids than the bound: all, never a silent drop.
	for _, id := range []string{"c", "d", "e", "f"} {
		if _, err := coll.InsertOne(ctx, viewDoc{ID: id, Revision: 1}); err != nil {
			t.Fatal(err)
		}
	}
	awaitReady(t, sub)
	if ids, all := sub.Take(); !all || len(ids) > 3 {
		t.Fatalf("4 writes over a bound of 3: %v, all %v; want all", ids, all)
	}

	sub.Close()
	if _, err := coll.InsertOne(ctx, viewDoc{ID: "g", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if ids, all := sub.Take(); len(ids) != 0 || all {
		t.Fatalf("a closed subscription collected %v, %v", ids, all)
	}
}

// TestSubscriptionSeesTheWriteItNames: a subscriber woken by a write and reading the named
// document through the view, on its own goroutine, reads that write (the view is marked before
// subscribers are told, so no read can slip in between and return the older state).
func TestSubscriptionSeesTheWriteItNames(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	coll := st.Collection("seen")
	if _, err := coll.InsertOne(ctx, viewDoc{ID: "a", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	var d viewDoc
	if err := st.View().Get(ctx, coll, "a", &d); err != nil { // loaded into the view
		t.Fatal(err)
	}
	sub := st.View().Subscribe("seen", 0)
	defer sub.Close()
	const writes = 50
	seen := make(chan int64)
	go func() {
		defer close(seen)
		for range writes {
			select {
			case <-sub.Ready():
			case <-ctx.Done():
				return
			}
			sub.Take()
			var got viewDoc
			if err := st.View().Get(ctx, coll, "a", &got); err != nil {
				return
			}
			seen <- got.N
		}
	}()
	for n := int64(1); n <= writes; n++ {
		if _, err := st.UpdateIfRevision(ctx, coll, "a", n, bson.M{"$set": bson.M{"n": n}}); err != nil {
			t.Fatal(err)
		}
		got, ok := <-seen
		if !ok {
			t.Fatalf("the subscriber stopped before write %d", n)
		}
		if got != n {
			t.Fatalf("woken by write %d, the subscriber read n=%d", n, got)
		}
	}
}

// TestNotifyFollowsItsCollections: Notify receives after a write to any collection it follows,
// and not after a write to another.
func TestNotifyFollowsItsCollections(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	nctx, cancel := context.WithCancel(ctx)
	feed := st.View().Notify(nctx, "followed-a", "followed-b")
	wait := func(what string) {
		t.Helper()
		select {
		case <-feed:
		case <-time.After(30 * time.Second):
			t.Fatalf("no notice after %s in 30 s", what)
		}
	}
	if _, err := st.Collection("unfollowed").InsertOne(ctx, viewDoc{ID: "x", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collection("followed-b").InsertOne(ctx, viewDoc{ID: "b", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	wait("a write to followed-b")
	select {
	case <-feed:
		t.Fatal("a second notice for one write (or one for the unfollowed collection)")
	default:
	}
	if _, err := st.Collection("followed-a").InsertOne(ctx, viewDoc{ID: "a", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	wait("a write to followed-a")
	cancel()
}
