package store

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestEmbeddedLookupsByIDUseAnIndex: after a collection is created, the
// embedded store's lookups by _id are answered through an index (SQLite's
// plan says SEARCH ... USING INDEX), not by scanning the table, and results
// are unchanged by it.
func TestEmbeddedLookupsByIDUseAnIndex(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unlock, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	ctx := context.Background()
	s, err := Open(ctx, Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	c := s.Collection("lookups")
	docs := make([]any, 0, 500)
	for i := range 500 {
		docs = append(docs, bson.M{"_id": fmt.Sprintf("doc_%03d", i), "n": i})
	}
	if _, err := c.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	x, err := openIDIndexer(s.server.dir, DefaultDatabase, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer x.close()
	if _, err := x.ensure(ctx); err != nil { // what the indexer's next tick does
		t.Fatal(err)
	}
	var table string
	if err := x.db.QueryRowContext(ctx, `SELECT table_name FROM _ferretdb_collections WHERE name = 'lookups'`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	plan := queryPlan(t, x.db, fmt.Sprintf(`SELECT _ferretdb_sjson FROM %q WHERE _ferretdb_sjson->'$._id' = ?`, table), `"doc_250"`)
	if !strings.Contains(plan, "USING INDEX "+table+idIndexSuffix) {
		t.Fatalf("lookup by _id plan: %s; want the _id index", plan)
	}
	var got struct {
		N int `bson:"n"`
	}
	if err := FindByID(ctx, c, "doc_250", &got); err != nil || got.N != 250 {
		t.Fatalf("find by _id through the index: %+v %v", got, err)
	}
	if _, err := s.UpdateIfRevision(ctx, c, "doc_250", 0, bson.M{"$set": bson.M{"n": 1}}); err != nil {
		t.Fatalf("compare-and-set through the index: %v", err)
	}
	// A second pass creates nothing.
	if n, err := x.ensure(ctx); err != nil || n != 0 {
		t.Fatalf("second pass created %d indexes, %v", n, err)
	}
}

func queryPlan(t *testing.T, db *sql.DB, q string, arg any) string {
	t.Helper()
	rows, err := db.Query("EXPLAIN QUERY PLAN "+q, arg)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		b.WriteString(detail + "; ")
	}
	return b.String()
}
