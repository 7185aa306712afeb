package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
)

// BulkStatements is how many statements each multi-statement write of the bulk tests carries:
// well above the size at which FerretDB v1 stalls on one update command (docs/store.md section
// 2.1), so the store must split them there and a real MongoDB takes them as they are.
const BulkStatements = 200

// bulkTimeout bounds each bulk write: a store that stalls fails the test instead of hanging it.
const bulkTimeout = time.Minute

func bulkID(prefix string, i int) string { return fmt.Sprintf("%s%04d", prefix, i) }

// testBulkWrites sends BulkStatements inserts (InsertMany), updates, upserts (half of them
// matching, half new) and deletes (BulkWrite), each as one driver call, and checks the driver's
// result counts and what the collection holds after each.
func testBulkWrites(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	c := freshCollection(ctx, t, s, "storetest_bulk")
	const n = BulkStatements

	call := func(what string, f func(ctx context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, bulkTimeout)
		defer cancel()
		if err := f(cctx); err != nil {
			t.Fatalf("%s of %d statements: %v", what, n, err)
		}
	}
	count := func(filter bson.M) int64 {
		t.Helper()
		got, err := c.CountDocuments(ctx, filter)
		if err != nil {
			t.Fatalf("count %v: %v", filter, err)
		}
		return got
	}

	docs := make([]any, n)
	for i := range n {
		docs[i] = bson.M{"_id": bulkID("d", i), "v": 0}
	}
	call("InsertMany", func(ctx context.Context) error {
		res, err := c.InsertMany(ctx, docs)
		if err == nil && len(res.InsertedIDs) != n {
			err = fmt.Errorf("InsertedIDs has %d ids, want %d", len(res.InsertedIDs), n)
		}
		return err
	})
	if got := count(bson.M{}); got != n {
		t.Fatalf("after InsertMany: %d documents, want %d", got, n)
	}

	updates := make([]mongo.WriteModel, n)
	for i := range n {
		updates[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": bulkID("d", i)}).SetUpdate(bson.M{"$set": bson.M{"v": 1}})
	}
	call("BulkWrite of updates", func(ctx context.Context) error {
		res, err := c.BulkWrite(ctx, updates)
		if err == nil && (res.MatchedCount != n || res.ModifiedCount != n) {
			err = fmt.Errorf("matched %d, modified %d, want %d each", res.MatchedCount, res.ModifiedCount, n)
		}
		return err
	})
	if got := count(bson.M{"v": 1}); got != n {
		t.Fatalf("after the updates: %d documents with v=1, want %d", got, n)
	}

	// Upserts over d0250..d0749: the first half match, the second half are new.
	upserts := make([]mongo.WriteModel, n)
	for i := range n {
		upserts[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": bulkID("d", n/2+i)}).
			SetUpdate(bson.M{"$set": bson.M{"v": 2}}).SetUpsert(true)
	}
	call("BulkWrite of upserts", func(ctx context.Context) error {
		res, err := c.BulkWrite(ctx, upserts)
		if err == nil && (res.MatchedCount != n/2 || res.ModifiedCount != n/2 || res.UpsertedCount != n/2 || len(res.UpsertedIDs) != n/2) {
			err = fmt.Errorf("matched %d, modified %d, upserted %d (%d ids), want %d each",
				res.MatchedCount, res.ModifiedCount, res.UpsertedCount, len(res.UpsertedIDs), n/2)
		}
		if err != nil {
			return err
		}
		// UpsertedIDs is keyed by the statement's index in the whole call. FerretDB v1 numbers
		// them by their rank among the upserts of one command instead (statement 250 of a
		// command whose first upsert it is comes back as index 0), so there only the ids are
		// checked; nothing in Berth reads the keys.
		ids := map[any]bool{}
		for i, id := range res.UpsertedIDs {
			ids[id] = true
			if !s.FerretDB() && id != bulkID("d", n/2+int(i)) {
				return fmt.Errorf("UpsertedIDs[%d] = %v, want %s", i, id, bulkID("d", n/2+int(i)))
			}
		}
		for i := n / 2; i < n; i++ {
			if !ids[bulkID("d", n/2+i)] {
				return fmt.Errorf("UpsertedIDs lacks %s", bulkID("d", n/2+i))
			}
		}
		return nil
	})
	if got := count(bson.M{"v": 2}); got != n {
		t.Fatalf("after the upserts: %d documents with v=2, want %d", got, n)
	}

	deletes := make([]mongo.WriteModel, n)
	for i := range n {
		deletes[i] = mongo.NewDeleteOneModel().SetFilter(bson.M{"_id": bulkID("d", i)})
	}
	call("BulkWrite of deletes", func(ctx context.Context) error {
		res, err := c.BulkWrite(ctx, deletes)
		if err == nil && res.DeletedCount != n {
			err = fmt.Errorf("deleted %d, want %d", res.DeletedCount, n)
		}
		return err
	})
	if got := count(bson.M{}); got != n/2 {
		t.Fatalf("after the deletes: %d documents, want %d", got, n/2)
	}
}

// testBulkWriteErrors checks that an ordered write of BulkStatements statements whose statement
// failAt fails (a duplicate _id) stops there: the statements before it are applied, none after
// it, and the error names its index in the whole call; and that an unordered one goes on past it.
func testBulkWriteErrors(t *testing.T, open func(t *testing.T) *store.Store) {
	ctx := testContext(t)
	s := open(t)
	const n, failAt = BulkStatements, 130

	for _, ordered := range []bool{true, false} {
		for _, api := range []string{"InsertMany", "BulkWrite"} {
			name := fmt.Sprintf("%s ordered=%v", api, ordered)
			c := freshCollection(ctx, t, s, "storetest_bulk_errors")
			if _, err := c.InsertOne(ctx, bson.M{"_id": bulkID("e", failAt), "v": "there before"}); err != nil {
				t.Fatalf("%s: insert the conflicting document: %v", name, err)
			}
			docs := make([]any, n)
			models := make([]mongo.WriteModel, n)
			for i := range n {
				docs[i] = bson.M{"_id": bulkID("e", i), "v": i}
				models[i] = mongo.NewInsertOneModel().SetDocument(docs[i])
			}
			cctx, cancel := context.WithTimeout(ctx, bulkTimeout)
			var err error
			var inserted int64 = -1
			if api == "InsertMany" {
				_, err = c.InsertMany(cctx, docs, options.InsertMany().SetOrdered(ordered))
			} else {
				var res *mongo.BulkWriteResult
				res, err = c.BulkWrite(cctx, models, options.BulkWrite().SetOrdered(ordered))
				if res != nil {
					inserted = res.InsertedCount
				}
			}
			cancel()

			var bwe mongo.BulkWriteException
			if !errors.As(err, &bwe) {
				t.Fatalf("%s: err = %v (%T), want a mongo.BulkWriteException", name, err, err)
			}
			if len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != failAt || !mongo.IsDuplicateKeyError(bwe.WriteErrors[0]) {
				t.Fatalf("%s: write errors %+v, want one duplicate key at index %d", name, bwe.WriteErrors, failAt)
			}
			want := int64(n - 1) // every statement but the failed one
			if ordered {
				want = failAt
			}
			if api == "BulkWrite" && inserted != want {
				t.Errorf("%s: BulkWriteResult.InsertedCount = %d, want %d", name, inserted, want)
			}
			got, err := c.CountDocuments(ctx, bson.M{"v": bson.M{"$type": "number"}})
			if err != nil {
				t.Fatalf("%s: count: %v", name, err)
			}
			if got != want {
				t.Errorf("%s: %d statements applied, want %d", name, got, want)
			}
			if ordered {
				n, err := c.CountDocuments(ctx, bson.M{"_id": bson.M{"$gt": bulkID("e", failAt)}})
				if err != nil {
					t.Fatalf("%s: count: %v", name, err)
				}
				if n != 0 {
					t.Errorf("%s: %d statements after the failed one were applied, want none", name, n)
				}
			}
		}
	}
}
