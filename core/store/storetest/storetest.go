// Package storetest is the conformance suite for Berth's state store: it proves, against any
// MongoDB-wire server, the single-document atomicity that Berth's design relies on (DESIGN.md section 4).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
)

// Sizes of the concurrency checks.
const (
	// Workers is the number of goroutines that race in each concurrent check.
	Workers = 8
	// CASRounds is the number of compare-and-set rounds; each must have exactly one winner.
	CASRounds = 50
	// IncsPerWorker is the number of $inc each worker applies to one counter.
	IncsPerWorker = 250
	// SequencePerWorker is the number of NextSequence calls each worker makes.
	SequencePerWorker = 50
)

// testTimeout bounds each subtest's store calls so a hung server fails the test instead of the run.
const testTimeout = 2 * time.Minute

// Run runs the store conformance subtests. open returns an open store for the calling test; the
// suite calls it once per subtest, and a second time within the same test to check that data
// survives a reopen, so:
//
//  1. every call with the same t must reach the same data (same directory or database);
//  2. calls with different t should reach separate data (the suite also uses distinct names);
//  3. open should register the store's Close (and any cleanup of the data) with t.Cleanup;
//     the suite itself closes a store before reopening it, and Close is idempotent.
//
// Subtests do not run in parallel with each other.
func Run(t *testing.T, open func(t *testing.T) *store.Store) {
	t.Helper()
	t.Run("Ping", func(t *testing.T) { testPing(t, open) })
	t.Run("CompareAndSetOneWinner", func(t *testing.T) { testCompareAndSet(t, open, false) })
	t.Run("StoreCompareAndSetOneWinner", func(t *testing.T) { testCompareAndSet(t, open, true) })
	t.Run("CompareAndSetErrors", func(t *testing.T) { testCompareAndSetErrors(t, open) })
	t.Run("UpdateIfOneWinner", func(t *testing.T) { testUpdateIf(t, open) })
	t.Run("DeleteIfOneWinner", func(t *testing.T) { testDeleteIf(t, open) })
	t.Run("IncExact", func(t *testing.T) { testInc(t, open) })
	t.Run("NextSequenceNoGaps", func(t *testing.T) { testNextSequence(t, open) })
	t.Run("UniqueIndex", func(t *testing.T) { testUniqueIndex(t, open) })
	t.Run("ReopenKeepsData", func(t *testing.T) { testReopen(t, open) })
	t.Run("BulkWrites", func(t *testing.T) { testBulkWrites(t, open) })
	t.Run("BulkWriteErrors", func(t *testing.T) { testBulkWriteErrors(t, open) })
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// freshCollection returns a collection dropped of any previous content.
func freshCollection(ctx context.Context, t *testing.T, s *store.Store, name string) *mongo.Collection {
	t.Helper()
	c := s.Collection(name)
	if err := c.Drop(ctx); err != nil {
		t.Fatalf("drop %s: %v", name, err)
	}
	return c
}

func testPing(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if s.Embedded() && !s.FerretDB() {
		t.Errorf("Embedded() is true but FerretDB() is false")
	}
}

// testCompareAndSet: in each round, Workers goroutines try to move one document from revision 0
// to 1; exactly one must succeed and all others must get ErrConflict. method selects
// [store.Store.UpdateIfRevision] over the package-level [store.UpdateIfRevision].
func testCompareAndSet(t *testing.T, open func(t *testing.T) *store.Store, method bool) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_cas")

	for round := range CASRounds {
		if _, err := c.InsertOne(ctx, bson.M{"_id": round, store.RevisionField: int64(0), "holder": -1}); err != nil {
			t.Fatalf("round %d: insert: %v", round, err)
		}
		start := make(chan struct{})
		results := make([]error, Workers)
		var wg sync.WaitGroup
		for w := range Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if method {
					_, results[w] = s.UpdateIfRevision(ctx, c, round, 0, bson.M{"$set": bson.M{"holder": w}})
				} else {
					_, results[w] = store.UpdateIfRevision(ctx, c, round, 0, bson.M{"$set": bson.M{"holder": w}})
				}
			}()
		}
		close(start)
		wg.Wait()

		winner := -1
		for w, err := range results {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("round %d: workers %d and %d both won the compare-and-set", round, winner, w)
				}
				winner = w
			case errors.Is(err, store.ErrConflict):
			default:
				t.Fatalf("round %d: worker %d: unexpected error: %v", round, w, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no worker won the compare-and-set", round)
		}
		var doc struct {
			Revision int64 `bson:"revision"`
			Holder   int   `bson:"holder"`
		}
		if err := store.FindByID(ctx, c, round, &doc); err != nil {
			t.Fatalf("round %d: read back: %v", round, err)
		}
		if doc.Revision != 1 || doc.Holder != winner {
			t.Fatalf("round %d: document is revision %d held by %d; want revision 1 held by winner %d",
				round, doc.Revision, doc.Holder, winner)
		}
	}
}

// testUpdateIf: Workers goroutines each move a counter from the value they
// read to value+1 with [store.Store.UpdateIf], retrying on a miss; the final
// value equals the number of successful moves (no lost or doubled update),
// and conditions compare integers by value whatever their width.
func testUpdateIf(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_updateif")
	if _, err := c.InsertOne(ctx, bson.M{"_id": "ctr", "n": int32(0), "owner": "none"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.UpdateIf(ctx, c, "missing", bson.D{{Key: "n", Value: 0}}, bson.M{"$set": bson.M{"n": 1}}); ok || err != nil {
		t.Fatalf("UpdateIf on a missing document: matched %v, err %v; want a miss", ok, err)
	}
	const perWorker = 20
	var wg sync.WaitGroup
	wins := make([]int, Workers)
	errs := make(chan error, Workers)
	for w := range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for attempts := 0; wins[w] < perWorker && attempts < 100*perWorker; attempts++ {
				var doc struct {
					N int64 `bson:"n"`
				}
				if err := store.FindByID(ctx, c, "ctr", &doc); err != nil {
					errs <- err
					return
				}
				ok, err := s.UpdateIf(ctx, c, "ctr", bson.D{{Key: "n", Value: doc.N}, {Key: "owner", Value: "none"}},
					bson.M{"$set": bson.M{"n": doc.N + 1}})
				if err != nil {
					errs <- err
					return
				}
				if ok {
					wins[w]++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, n := range wins {
		total += n
	}
	var doc struct {
		N int64 `bson:"n"`
	}
	if err := store.FindByID(ctx, c, "ctr", &doc); err != nil {
		t.Fatal(err)
	}
	if doc.N != int64(total) {
		t.Fatalf("counter is %d after %d successful compare-and-sets", doc.N, total)
	}
	if ok, _ := s.UpdateIf(ctx, c, "ctr", bson.D{{Key: "owner", Value: "someone"}}, bson.M{"$set": bson.M{"n": 0}}); ok {
		t.Fatal("UpdateIf matched a document whose condition field differs")
	}
}

// testDeleteIf: [store.Store.DeleteIf] misses a missing document and one whose condition
// differs, and of Workers goroutines deleting one document under the same condition exactly one
// deletes it.
func testDeleteIf(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_deleteif")
	if _, err := c.InsertOne(ctx, bson.M{"_id": "doc", "claim": "a", "n": int32(1)}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.DeleteIf(ctx, c, "missing", bson.D{{Key: "claim", Value: "a"}}); ok || err != nil {
		t.Fatalf("DeleteIf on a missing document: deleted %v, err %v; want a miss", ok, err)
	}
	if ok, err := s.DeleteIf(ctx, c, "doc", bson.D{{Key: "claim", Value: "b"}}); ok || err != nil {
		t.Fatalf("DeleteIf with another condition: deleted %v, err %v; want a miss", ok, err)
	}
	var wg sync.WaitGroup
	var wins atomic.Int32
	errs := make(chan error, Workers)
	for range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := s.DeleteIf(ctx, c, "doc", bson.D{{Key: "claim", Value: "a"}, {Key: "n", Value: int64(1)}})
			if err != nil {
				errs <- err
			}
			if ok {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if wins.Load() != 1 {
		t.Fatalf("%d deleters won, want 1", wins.Load())
	}
	if err := store.FindByID(ctx, c, "doc", &bson.M{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after DeleteIf: %v, want not found", err)
	}
}

func testCompareAndSetErrors(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_cas_errors")

	if _, err := store.UpdateIfRevision(ctx, c, "absent", 0, bson.M{"$set": bson.M{"x": 1}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of a missing document: got %v, want ErrNotFound", err)
	}
	if _, err := c.InsertOne(ctx, bson.M{"_id": "doc", store.RevisionField: int64(3), "n": 0}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	if _, err := store.UpdateIfRevision(ctx, c, "doc", 2, bson.M{"$set": bson.M{"x": 1}}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update at a stale revision: got %v, want ErrConflict", err)
	}
	rev, err := store.UpdateIfRevision(ctx, c, "doc", 3, bson.M{"$set": bson.M{"x": 1}, "$inc": bson.M{"n": 2}})
	if err != nil || rev != 4 {
		t.Fatalf("update at the current revision: got (%d, %v), want (4, nil)", rev, err)
	}
	var doc struct {
		Revision int64 `bson:"revision"`
		X        int   `bson:"x"`
		N        int   `bson:"n"`
	}
	if err := store.FindByID(ctx, c, "doc", &doc); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if doc.Revision != 4 || doc.X != 1 || doc.N != 2 {
		t.Fatalf("document after update = %+v, want revision 4, x 1, n 2", doc)
	}
	if err := store.FindByID(ctx, c, "absent", &doc); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("FindByID of a missing document: got %v, want ErrNotFound", err)
	}
}

// testInc: Workers × IncsPerWorker concurrent $inc of one field must add up exactly.
func testInc(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_inc")
	if _, err := c.InsertOne(ctx, bson.M{"_id": "counter", "n": int64(0)}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	start := make(chan struct{})
	errs := make(chan error, Workers)
	var wg sync.WaitGroup
	for range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range IncsPerWorker {
				if _, err := c.UpdateOne(ctx, bson.M{"_id": "counter"}, bson.M{"$inc": bson.M{"n": int64(1)}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("$inc: %v", err)
	}
	var doc struct {
		N int64 `bson:"n"`
	}
	if err := store.FindByID(ctx, c, "counter", &doc); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if want := int64(Workers * IncsPerWorker); doc.N != want {
		t.Fatalf("counter = %d after %d×%d concurrent $inc, want %d", doc.N, Workers, IncsPerWorker, want)
	}
}

// testNextSequence: concurrent NextSequence calls hand out 1..N exactly once each, and each
// caller sees its own values strictly increase.
func testNextSequence(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	name := fmt.Sprintf("storetest-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		_, _ = s.Collection(store.SequencesCollection).DeleteOne(context.WithoutCancel(ctx), bson.M{"_id": name})
	})

	start := make(chan struct{})
	got := make([][]int64, Workers)
	errs := make(chan error, Workers)
	var wg sync.WaitGroup
	for w := range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range SequencePerWorker {
				v, err := store.NextSequence(ctx, s, name)
				if err != nil {
					errs <- err
					return
				}
				got[w] = append(got[w], v)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("NextSequence: %v", err)
	}
	var all []int64
	for w, vs := range got {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Fatalf("worker %d saw %d after %d: not strictly increasing", w, vs[i], vs[i-1])
			}
		}
		all = append(all, vs...)
	}
	slices.Sort(all)
	for i, v := range all {
		if v != int64(i+1) {
			t.Fatalf("sorted values from %d calls: position %d holds %d, want %d (gap or repeat)", len(all), i, v, i+1)
		}
	}
}

// testUniqueIndex: a unique index refuses a duplicate on insert and on update, and
// IsDuplicateKey recognises both refusals (FerretDB reports the update case differently).
func testUniqueIndex(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_unique")
	if _, err := c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "name", Value: 1}},
		Options: options.Index().SetUnique(true),
	}); err != nil {
		t.Fatalf("create unique index: %v", err)
	}
	for _, d := range []bson.M{
		{"_id": 1, "name": "a", store.RevisionField: int64(0)},
		{"_id": 2, "name": "b", store.RevisionField: int64(0)},
	} {
		if _, err := c.InsertOne(ctx, d); err != nil {
			t.Fatalf("insert %v: %v", d, err)
		}
	}

	_, err := c.InsertOne(ctx, bson.M{"_id": 3, "name": "a"})
	if err == nil || !store.IsDuplicateKey(err) {
		t.Fatalf("insert of a duplicate name: got %v, want a duplicate-key error", err)
	}
	_, err = c.UpdateOne(ctx, bson.M{"_id": 2}, bson.M{"$set": bson.M{"name": "a"}})
	if err == nil || !store.IsDuplicateKey(err) {
		t.Fatalf("update to a duplicate name: got %v, want a duplicate-key error", err)
	}
	_, err = store.UpdateIfRevision(ctx, c, 2, 0, bson.M{"$set": bson.M{"name": "a"}})
	if err == nil || !store.IsDuplicateKey(err) {
		t.Fatalf("compare-and-set to a duplicate name: got %v, want a duplicate-key error (wrapped)", err)
	}
	err = c.FindOneAndUpdate(ctx, bson.M{"_id": 2}, bson.M{"$set": bson.M{"name": "a"}}).Err()
	if err == nil || !store.IsDuplicateKey(err) {
		t.Fatalf("findAndModify to a duplicate name: got %v, want a duplicate-key error", err)
	}
	if store.IsDuplicateKey(nil) || store.IsDuplicateKey(errors.New("E11000 lookalike")) {
		t.Fatalf("IsDuplicateKey must be false for nil and for a non-server error")
	}
	var doc struct {
		Name string `bson:"name"`
	}
	if err := store.FindByID(ctx, c, 2, &doc); err != nil || doc.Name != "b" {
		t.Fatalf("document 2 after refused updates: name %q, err %v; want \"b\"", doc.Name, err)
	}
}

// testReopen: data written before Close is there after opening the same store again.
func testReopen(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_reopen")
	if _, err := c.InsertOne(ctx, bson.M{"_id": "kept", "v": "value"}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	name := fmt.Sprintf("storetest-reopen-%d", time.Now().UnixNano())
	for range 3 {
		if _, err := store.NextSequence(ctx, s, name); err != nil {
			t.Fatalf("NextSequence: %v", err)
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s2 := open(t)
	var doc struct {
		V string `bson:"v"`
	}
	if err := store.FindByID(ctx, s2.Collection("storetest_reopen"), "kept", &doc); err != nil || doc.V != "value" {
		t.Fatalf("after reopen: v %q, err %v; want \"value\"", doc.V, err)
	}
	if v, err := store.NextSequence(ctx, s2, name); err != nil || v != 4 {
		t.Fatalf("NextSequence after reopen: got (%d, %v), want (4, nil)", v, err)
	}
}
