package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

type viewDoc struct {
	ID       string `bson:"_id"`
	Revision int64  `bson:"revision"`
	N        int64  `bson:"n"`
	Tag      string `bson:"tag"`
}

func viewCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// storeDocs reads coll from the store itself, in _id order.
func storeDocs(t *testing.T, ctx context.Context, coll *mongo.Collection) []viewDoc {
	t.Helper()
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	out := []viewDoc{}
	if err := cur.All(ctx, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func viewDocs(t *testing.T, ctx context.Context, v *store.View, coll *mongo.Collection, eq bson.D) []viewDoc {
	t.Helper()
	out := []viewDoc{}
	if err := v.Find(ctx, coll, eq, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestViewFollowsRandomWrites runs a seeded random sequence of writes of every shape berthd's
// packages send (driver calls by _id and by other filters, upserts, bulk writes, the store's own
// compare-and-set helpers, drops) and checks after each step that the view equals the store, and
// that a filtered read from the view equals the same filter on the store.
func TestViewFollowsRandomWrites(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	if !v.Enabled() {
		t.Fatal("the read view is off on a fresh embedded store")
	}
	a, b := st.Collection("view_a"), st.Collection("view_b")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 22))
	id := func() string { return fmt.Sprintf("d%02d", r.IntN(24)) }
	tag := func() string { return []string{"red", "green", "blue"}[r.IntN(3)] }
	// Load both collections before the first write, and once more after a drop below.
	_ = viewDocs(t, ctx, v, a, nil)
	_ = viewDocs(t, ctx, v, b, nil)

	const steps = 300
	for i := 0; i < steps; i++ {
		coll := a
		if r.IntN(3) == 0 {
			coll = b
		}
		var what string
		var err error
		switch op := r.IntN(13); op {
		case 0:
			what = "insertOne"
			_, err = coll.InsertOne(ctx, viewDoc{ID: id(), N: int64(i), Tag: tag()})
		case 1:
			what = "insertMany"
			_, err = coll.InsertMany(ctx, []any{viewDoc{ID: id(), N: 1, Tag: tag()}, viewDoc{ID: id(), N: 2, Tag: tag()}},
				options.InsertMany().SetOrdered(false))
		case 2:
			what = "updateOne by _id"
			_, err = coll.UpdateOne(ctx, bson.M{"_id": id()}, bson.M{"$inc": bson.M{"n": int64(1)}})
		case 3:
			what = "updateMany by tag"
			_, err = coll.UpdateMany(ctx, bson.M{"tag": tag()}, bson.M{"$set": bson.M{"tag": tag()}})
		case 4:
			what = "upsert by _id"
			_, err = coll.UpdateOne(ctx, bson.M{"_id": id()}, bson.M{"$set": bson.M{"tag": tag()}}, options.UpdateOne().SetUpsert(true))
		case 5:
			what = "deleteOne by _id"
			_, err = coll.DeleteOne(ctx, bson.M{"_id": id()})
		case 6:
			what = "deleteMany by tag"
			_, err = coll.DeleteMany(ctx, bson.M{"tag": tag()})
		case 7:
			what = "replaceOne"
			d := id()
			_, err = coll.ReplaceOne(ctx, bson.M{"_id": d}, viewDoc{ID: d, N: 100, Tag: tag()})
		case 8:
			what = "findOneAndUpdate upsert"
			err = coll.FindOneAndUpdate(ctx, bson.M{"_id": id()}, bson.M{"$inc": bson.M{"n": int64(5)}},
				options.FindOneAndUpdate().SetUpsert(true)).Err()
		case 9:
			what = "store.UpdateIfRevision"
			d := id()
			var cur viewDoc
			if err = v.Get(ctx, coll, d, &cur); err == nil {
				_, err = st.UpdateIfRevision(ctx, coll, d, cur.Revision, bson.M{"$set": bson.M{"tag": tag()}})
			}
		case 10:
			what = "store.UpdateIf"
			_, err = st.UpdateIf(ctx, coll, id(), bson.D{{Key: "tag", Value: tag()}}, bson.M{"$inc": bson.M{"n": int64(10)}})
		case 11:
			what = "bulkWrite"
			_, err = coll.BulkWrite(ctx, []mongo.WriteModel{
				mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id()}).SetUpdate(bson.M{"$set": bson.M{"n": int64(7)}}),
				mongo.NewDeleteOneModel().SetFilter(bson.M{"_id": id()}),
				mongo.NewInsertOneModel().SetDocument(viewDoc{ID: id(), Tag: tag()}),
			}, options.BulkWrite().SetOrdered(false))
		case 12:
			if r.IntN(8) != 0 {
				continue
			}
			what = "drop"
			err = coll.Drop(ctx)
		}
		// Duplicate keys, missing documents and conflicts are outcomes of a random workload, not
		// failures; the view must follow the store through them all.
		if err != nil && !mongo.IsDuplicateKeyError(err) && !store.IsDuplicateKey(err) &&
			!errors.Is(err, mongo.ErrNoDocuments) && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
			t.Fatalf("step %d (%s): %v", i, what, err)
		}
		for _, c := range []*mongo.Collection{a, b} {
			if diff := cmp.Diff(storeDocs(t, ctx, c), viewDocs(t, ctx, v, c, nil)); diff != "" {
				t.Fatalf("step %d (%s): view of %s differs from the store (-store +view):\n%s", i, what, c.Name(), diff)
			}
		}
		want := tag()
		cur, err := a.Find(ctx, bson.M{"tag": want}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		filtered := []viewDoc{}
		if err := cur.All(ctx, &filtered); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(filtered, viewDocs(t, ctx, v, a, bson.D{{Key: "tag", Value: want}})); diff != "" {
			t.Fatalf("step %d (%s): filtered view differs (-store +view):\n%s", i, what, diff)
		}
	}
	if v.Rereads() == 0 {
		t.Fatal("the view re-read no document: it was not fed by the writes")
	}
}

// TestViewRevisionsOnlyMoveForward has concurrent writers race compare-and-sets on a few
// documents while each checks that the revision it reads from the view never goes back (the
// re-read of one write racing a later write must not install the older state), and that the view
// equals the store at the end.
func TestViewRevisionsOnlyMoveForward(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_race")
	for i := 0; i < 3; i++ {
		if _, err := coll.InsertOne(ctx, viewDoc{ID: fmt.Sprintf("r%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	const writers, rounds = 4, 60
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			seen := map[string]int64{}
			for i := 0; i < rounds; i++ {
				d := fmt.Sprintf("r%d", (w+i)%3)
				var cur viewDoc
				if err := v.Get(ctx, coll, d, &cur); err != nil {
					errs <- err
					return
				}
				if cur.Revision < seen[d] {
					errs <- fmt.Errorf("writer %d read %s at revision %d after %d", w, d, cur.Revision, seen[d])
					return
				}
				seen[d] = cur.Revision
				rev, err := store.UpdateIfRevision(ctx, coll, d, cur.Revision, bson.M{"$inc": bson.M{"n": int64(1)}})
				if errors.Is(err, store.ErrConflict) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				// Read-your-writes: the view shows at least the revision just written.
				if err := v.Get(ctx, coll, d, &cur); err != nil {
					errs <- err
					return
				}
				if cur.Revision < rev {
					errs <- fmt.Errorf("writer %d wrote %s revision %d and read back %d", w, d, rev, cur.Revision)
					return
				}
				seen[d] = cur.Revision
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if diff := cmp.Diff(storeDocs(t, ctx, coll), viewDocs(t, ctx, v, coll, nil)); diff != "" {
		t.Fatalf("view differs from the store (-store +view):\n%s", diff)
	}
}

// TestStaleViewCostsARetry makes the view stale on purpose (its copy of a document goes back one
// revision without the store changing) and shows that a decision taken on it is refused by the
// compare-and-set, and that the retry, reading the view again, succeeds: a stale view never
// causes a wrong write. Both compare-and-set paths are covered: the store's method (FerretDB's
// read-compare-write under its lock) and the package function (one filtered update).
func TestStaleViewCostsARetry(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_stale")
	cas := map[string]func(id string, expected int64) (int64, error){
		"method": func(id string, expected int64) (int64, error) {
			return st.UpdateIfRevision(ctx, coll, id, expected, bson.M{"$inc": bson.M{"n": int64(1)}})
		},
		"function": func(id string, expected int64) (int64, error) {
			return store.UpdateIfRevision(ctx, coll, id, expected, bson.M{"$inc": bson.M{"n": int64(1)}})
		},
	}
	for name, update := range cas {
		t.Run(name, func(t *testing.T) {
			id := "s_" + name
			if _, err := coll.InsertOne(ctx, viewDoc{ID: id, Revision: 5, N: 0}); err != nil {
				t.Fatal(err)
			}
			var cur viewDoc
			if err := v.Get(ctx, coll, id, &cur); err != nil || cur.Revision != 5 {
				t.Fatalf("view before: %+v, %v", cur, err)
			}
			stale, err := bson.Marshal(viewDoc{ID: id, Revision: 4, N: 0})
			if err != nil {
				t.Fatal(err)
			}
			v.CorruptForTest(coll.Name(), id, stale)

			var attempts []error
			for attempt := 0; attempt < 3; attempt++ {
				if err := v.Get(ctx, coll, id, &cur); err != nil {
					t.Fatal(err)
				}
				_, err := update(id, cur.Revision)
				attempts = append(attempts, err)
				if err == nil {
					break
				}
				if !errors.Is(err, store.ErrConflict) {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
			}
			if len(attempts) != 2 || !errors.Is(attempts[0], store.ErrConflict) || attempts[1] != nil {
				t.Fatalf("want a refused first attempt and a successful retry, got %v", attempts)
			}
			var got viewDoc
			if err := store.FindByID(ctx, coll, id, &got); err != nil {
				t.Fatal(err)
			}
			if want := (viewDoc{ID: id, Revision: 6, N: 1}); got != want {
				t.Fatalf("store after the retry: %+v, want %+v", got, want)
			}
		})
	}
}

// TestViewReloadsAfterALostFeed loses writes on purpose (the view's copies are changed and
// removed behind the feed's back, as if their events never arrived), then has the view reload as
// it does when a change stream's token is lost, and checks it equals the store again.
func TestViewReloadsAfterALostFeed(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_lost")
	for i := 0; i < 20; i++ {
		if _, err := coll.InsertOne(ctx, viewDoc{ID: fmt.Sprintf("l%02d", i), N: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	want := storeDocs(t, ctx, coll)
	if diff := cmp.Diff(want, viewDocs(t, ctx, v, coll, nil)); diff != "" {
		t.Fatalf("view differs before the loss:\n%s", diff)
	}
	bogus, _ := bson.Marshal(viewDoc{ID: "l03", N: -1})
	v.CorruptForTest(coll.Name(), "l03", bogus)
	v.CorruptForTest(coll.Name(), "l07", nil)
	ghost, _ := bson.Marshal(viewDoc{ID: "l99"})
	v.CorruptForTest(coll.Name(), "l99", ghost)
	if diff := cmp.Diff(want, viewDocs(t, ctx, v, coll, nil)); diff == "" {
		t.Fatal("the view did not go stale: the test proves nothing")
	}
	loads := v.Loads()
	if err := v.ResyncForTest(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, viewDocs(t, ctx, v, coll, nil)); diff != "" {
		t.Fatalf("view differs after the reload (-store +view):\n%s", diff)
	}
	if v.Loads() <= loads {
		t.Fatal("no collection was reloaded")
	}
}

// TestViewOffWhenOthersMayWrite: handing out the embedded store's URI turns its view off, and
// reads then see writes made by another client. (Embedded by construction, whatever
// BERTH_TEST_MONGO_URI says.)
func TestViewOffWhenOthersMayWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	st, err := store.Open(context.Background(), store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_off")
	if _, err := coll.InsertOne(ctx, viewDoc{ID: "o1"}); err != nil {
		t.Fatal(err)
	}
	_ = viewDocs(t, ctx, v, coll, nil)
	other, err := mongo.Connect(options.Client().ApplyURI(st.EmbeddedURI()).SetMaxPoolSize(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Disconnect(context.Background()) })
	if v.Enabled() {
		t.Fatal("the view stayed on after the embedded URI was handed out")
	}
	if _, err := other.Database(store.DefaultDatabase).Collection("view_off").InsertOne(ctx, viewDoc{ID: "o2"}); err != nil {
		t.Fatal(err)
	}
	if got := viewDocs(t, ctx, v, coll, nil); len(got) != 2 {
		t.Fatalf("reads with the view off: %+v, want both documents", got)
	}
}

// TestViewWholeMarkRereadsOneDocument: once a loaded collection is marked whole (a write that
// named no _id, a lost feed), a read of one document re-reads that document by _id instead of
// waiting for the collection to load again, and concurrent reads start at most one load between
// them; a scan afterwards sees the store. Before, each such read reloaded the whole collection.
func TestViewWholeMarkRereadsOneDocument(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_whole")
	docs := make([]any, 200)
	for i := range docs {
		docs[i] = viewDoc{ID: fmt.Sprintf("w%03d", i), N: int64(i)}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	_ = viewDocs(t, ctx, v, coll, nil)
	// The view's copy of w005 goes wrong behind its back, so only a read from the store answers
	// it right.
	bogus, _ := bson.Marshal(viewDoc{ID: "w005", N: -1})
	v.CorruptForTest(coll.Name(), "w005", bogus)
	if err := v.ResyncForTest(ctx); err != nil {
		t.Fatal(err)
	}
	loads, rereads := v.Loads(), v.Rereads()
	const readers = 40
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("w%03d", i%10)
			var got viewDoc
			if err := v.Get(ctx, coll, id, &got); err != nil {
				errs <- err
				return
			}
			if got.ID != id || got.N != int64(i%10) {
				errs <- fmt.Errorf("get %s: %+v", id, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := v.Rereads() - rereads; got < readers {
		t.Fatalf("%d documents re-read by _id for %d reads of a whole-marked collection, want one each", got, readers)
	}
	if got := v.Loads() - loads; got > 1 {
		t.Fatalf("%d loads of one collection for %d concurrent reads, want at most one", got, readers)
	}
	if diff := cmp.Diff(storeDocs(t, ctx, coll), viewDocs(t, ctx, v, coll, nil)); diff != "" {
		t.Fatalf("view differs from the store after the background load (-store +view):\n%s", diff)
	}
}

// TestViewSharesOneLoad: scans that need a collection loaded at the same moment share one load.
func TestViewSharesOneLoad(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := viewCtx(t)
	v := st.View()
	coll := st.Collection("view_shared")
	docs := make([]any, 500)
	for i := range docs {
		docs[i] = viewDoc{ID: fmt.Sprintf("s%03d", i), N: int64(i), Tag: "red"}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	loads := v.Loads()
	const readers = 32
	start := make(chan struct{})
	var wg sync.WaitGroup
	counts := make(chan int, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var out []viewDoc
			if err := v.Find(ctx, coll, bson.D{{Key: "tag", Value: "red"}}, &out); err != nil {
				t.Error(err)
			}
			counts <- len(out)
		}()
	}
	close(start)
	wg.Wait()
	close(counts)
	for n := range counts {
		if n != len(docs) {
			t.Fatalf("a scan found %d documents, want %d", n, len(docs))
		}
	}
	if got := v.Loads() - loads; got != 1 {
		t.Fatalf("%d loads for %d concurrent first scans of one collection, want 1", got, readers)
	}
}
