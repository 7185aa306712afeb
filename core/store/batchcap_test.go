package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/core/store"
)

// TestEmbeddedStoreSplitsWriteCommands checks that 500-statement writes reach the embedded store
// as commands of at most store.FerretWriteBatch statements each, counted by the store's own
// command metrics.
func TestEmbeddedStoreSplitsWriteCommands(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := openStore(t, store.Config{DataDir: t.TempDir(), Logger: testLogger(t), Metrics: reg})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := s.Collection("bulk")
	const n = 500
	commands := float64((n + store.FerretWriteBatch - 1) / store.FerretWriteBatch)

	docs := make([]any, n)
	models := make([]mongo.WriteModel, n)
	for i := range n {
		id := fmt.Sprintf("d%04d", i)
		docs[i] = bson.M{"_id": id}
		models[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id}).SetUpdate(bson.M{"$set": bson.M{"v": 1}}).SetUpsert(true)
	}
	if _, err := c.InsertMany(ctx, docs); err != nil {
		t.Fatalf("InsertMany of %d: %v", n, err)
	}
	if got, _ := storeOps(t, reg, "insert", "bulk", "ok"); got != commands {
		t.Errorf("InsertMany of %d sent %v insert commands, want %v", n, got, commands)
	}
	res, err := c.BulkWrite(ctx, models)
	if err != nil {
		t.Fatalf("BulkWrite of %d upserts: %v", n, err)
	}
	if res.MatchedCount != n || res.ModifiedCount != n {
		t.Errorf("BulkWrite matched %d, modified %d, want %d", res.MatchedCount, res.ModifiedCount, n)
	}
	if got, _ := storeOps(t, reg, "update", "bulk", "ok"); got != commands {
		t.Errorf("BulkWrite of %d upserts sent %v update commands, want %v", n, got, commands)
	}
}

// TestFerretDBStallsOnLargeUpdateCommand pins down why the store splits writes, on a client that
// bypasses the split: FerretDB v1.24 takes store.FerretWriteBatch update statements in one
// command, and never finishes one of 100. When this test fails because the 100 finish, the
// FerretDB in use no longer needs the split (docs/store.md section 2.1).
func TestFerretDBStallsOnLargeUpdateCommand(t *testing.T) {
	s, err := store.Open(t.Context(), store.Config{DataDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		// The stalled command holds FerretDB's connections for good: stopping is bounded and
		// its error expected.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	raw, err := mongo.Connect(options.Client().ApplyURI(s.EmbeddedURI()).SetMaxPoolSize(1))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = raw.Disconnect(ctx)
	})
	c := raw.Database(store.DefaultDatabase).Collection("stall")

	update := func(ctx context.Context, n int) error {
		docs := make([]any, n)
		models := make([]mongo.WriteModel, n)
		for i := range n {
			id := fmt.Sprintf("s%d_%04d", n, i)
			docs[i] = bson.M{"_id": id}
			models[i] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id}).SetUpdate(bson.M{"$set": bson.M{"v": 1}})
		}
		for i := 0; i < n; i += 16 { // inserts never stall; small commands anyway
			if _, err := c.InsertMany(ctx, docs[i:min(i+16, n)]); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
		}
		_, err := c.BulkWrite(ctx, models)
		return err
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := update(ctx, store.FerretWriteBatch); err != nil {
		t.Fatalf("one update command of %d statements: %v", store.FerretWriteBatch, err)
	}
	sctx, scancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer scancel()
	err = update(sctx, 100)
	if err == nil {
		t.Fatal("one update command of 100 statements finished: FerretDB no longer stalls on it; revisit store.FerretWriteBatch")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("one update command of 100 statements: %v, want it to stall until the deadline", err)
	}
}

// TestEmbeddedStoreRefusesLargeHandBuiltWrite sends an update command of 100 statements with
// RunCommand, which the driver does not split: the store refuses it without sending it, says so
// with ErrWriteBatchTooLarge, and goes on serving (a command of store.FerretWriteBatch
// statements and a read after it succeed).
func TestEmbeddedStoreRefusesLargeHandBuiltWrite(t *testing.T) {
	s := openStore(t, store.Config{DataDir: t.TempDir(), Logger: testLogger(t)})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	updates := func(n int) bson.D {
		stmts := make(bson.A, n)
		for i := range n {
			stmts[i] = bson.M{"q": bson.M{"_id": fmt.Sprintf("h%04d", i)}, "u": bson.M{"$set": bson.M{"v": 1}}, "upsert": true}
		}
		return bson.D{{Key: "update", Value: "handbuilt"}, {Key: "updates", Value: stmts}}
	}
	err := s.DB().RunCommand(ctx, updates(100)).Err()
	if !errors.Is(err, store.ErrWriteBatchTooLarge) {
		t.Fatalf("update command of 100 statements: err = %v, want store.ErrWriteBatchTooLarge", err)
	}
	var res struct {
		N int `bson:"n"`
	}
	if err := s.DB().RunCommand(ctx, updates(store.FerretWriteBatch)).Decode(&res); err != nil {
		t.Fatalf("update command of %d statements after the refusal: %v", store.FerretWriteBatch, err)
	}
	if res.N != store.FerretWriteBatch {
		t.Errorf("update command of %d statements: n = %d", store.FerretWriteBatch, res.N)
	}
	if got, err := s.Collection("handbuilt").CountDocuments(ctx, bson.M{}); err != nil || got != int64(store.FerretWriteBatch) {
		t.Errorf("documents after the commands: %d (%v), want %d", got, err, store.FerretWriteBatch)
	}
}
