package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	_ "modernc.org/sqlite"

	"github.com/berthhq/berth/core/store"
)

// storeDocs is how many documents the store benchmarks' collection holds.
const storeDocs = 1000

type benchDoc struct {
	ID       string            `bson:"_id"`
	Revision int64             `bson:"revision"`
	N        int64             `bson:"n"`
	Region   string            `bson:"region"`
	Labels   map[string]string `bson:"labels"`
}

func benchDocID(i int) string { return fmt.Sprintf("doc-%05d", i) }

// seedDocs opens the embedded store with storeDocs documents in one collection.
func seedDocs(b *testing.B) (*store.Store, *mongo.Collection) {
	b.Helper()
	st := openStore(b)
	coll := st.Collection("bench_docs")
	docs := make([]any, storeDocs)
	for i := range docs {
		docs[i] = benchDoc{ID: benchDocID(i), Region: fmt.Sprintf("r%d", i%4), Labels: map[string]string{"isolation": "docker"}}
	}
	if _, err := coll.InsertMany(context.Background(), docs); err != nil {
		b.Fatal(err)
	}
	// Let the store's _id lookup index cover the new collection before measuring.
	waitIndexed(b, st, coll)
	return st, coll
}

// waitIndexed returns once a find by _id in coll has been answered, after the embedded store's
// indexer has had its period to index the new table (bounded).
func waitIndexed(b *testing.B, st *store.Store, coll *mongo.Collection) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t := time.NewTimer(3 * time.Second) // the indexer runs every 2 s
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	var d benchDoc
	if err := store.FindByID(ctx, coll, benchDocID(0), &d); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStoreCASByID is one compare-and-set by _id and revision (the package function: one
// filtered update) on the embedded store, over storeDocs documents.
func BenchmarkStoreCASByID(b *testing.B) {
	_, coll := seedDocs(b)
	ctx := context.Background()
	revs := make([]int64, storeDocs)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		k := i % storeDocs
		rev, err := store.UpdateIfRevision(ctx, coll, benchDocID(k), revs[k], bson.M{"$set": bson.M{"n": int64(i)}})
		if err != nil {
			b.Fatal(err)
		}
		revs[k] = rev
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cas/s")
}

// BenchmarkStoreCASByIDLocked is the Store's compare-and-set method, which on FerretDB reads and
// writes by _id under the store's lock.
func BenchmarkStoreCASByIDLocked(b *testing.B) {
	st, coll := seedDocs(b)
	ctx := context.Background()
	revs := make([]int64, storeDocs)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		k := i % storeDocs
		rev, err := st.UpdateIfRevision(ctx, coll, benchDocID(k), revs[k], bson.M{"$set": bson.M{"n": int64(i)}})
		if err != nil {
			b.Fatal(err)
		}
		revs[k] = rev
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cas/s")
}

// BenchmarkStoreFindByID is one find by _id on the embedded store.
func BenchmarkStoreFindByID(b *testing.B) {
	_, coll := seedDocs(b)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		var d benchDoc
		if err := store.FindByID(ctx, coll, benchDocID(i%storeDocs), &d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "finds/s")
}

// BenchmarkStoreViewGet is one read by _id from the read view (no writes in between).
func BenchmarkStoreViewGet(b *testing.B) {
	st, coll := seedDocs(b)
	ctx := context.Background()
	v := st.View()
	var d benchDoc
	if err := v.Get(ctx, coll, benchDocID(0), &d); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := v.Get(ctx, coll, benchDocID(i%storeDocs), &d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reads/s")
}

// BenchmarkStoreViewFind is one filtered read from the view (region equality, a quarter of the
// storeDocs documents match and are decoded).
func BenchmarkStoreViewFind(b *testing.B) {
	st, coll := seedDocs(b)
	ctx := context.Background()
	v := st.View()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		var out []benchDoc
		if err := v.Find(ctx, coll, bson.D{{Key: "region", Value: "r1"}}, &out); err != nil || len(out) != storeDocs/4 {
			b.Fatalf("%d, %v", len(out), err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "finds/s")
}

// BenchmarkStoreFindFiltered is the same filtered read sent to the embedded store.
func BenchmarkStoreFindFiltered(b *testing.B) {
	_, coll := seedDocs(b)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		cur, err := coll.Find(ctx, bson.M{"region": "r1"})
		if err != nil {
			b.Fatal(err)
		}
		var out []benchDoc
		if err := cur.All(ctx, &out); err != nil || len(out) != storeDocs/4 {
			b.Fatalf("%d, %v", len(out), err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "finds/s")
}

// BenchmarkStoreWriteThenViewGet is a write by _id followed by a read of the same document from
// the view: the read waits for the view to re-read the write.
func BenchmarkStoreWriteThenViewGet(b *testing.B) {
	st, coll := seedDocs(b)
	ctx := context.Background()
	v := st.View()
	var d benchDoc
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		id := benchDocID(i % storeDocs)
		if _, err := coll.UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"n": int64(i)}}); err != nil {
			b.Fatal(err)
		}
		if err := v.Get(ctx, coll, id, &d); err != nil || d.N != int64(i) {
			b.Fatalf("%+v, %v", d, err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rounds/s")
}

// BenchmarkStoreInsert compares writing 100 documents that belong to one decision one by one,
// with InsertMany, and with an unordered BulkWrite, on the embedded store.
func BenchmarkStoreInsert(b *testing.B) {
	const batch = 100
	for _, mode := range []string{"one-by-one", "insert-many", "bulk-write"} {
		b.Run(mode, func(b *testing.B) {
			st := openStore(b)
			coll := st.Collection("bench_insert")
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				docs := make([]any, batch)
				for j := range docs {
					docs[j] = benchDoc{ID: fmt.Sprintf("%d-%d", i, j), Region: "r0"}
				}
				var err error
				switch mode {
				case "one-by-one":
					for _, d := range docs {
						if _, err = coll.InsertOne(ctx, d); err != nil {
							break
						}
					}
				case "insert-many":
					_, err = coll.InsertMany(ctx, docs)
				case "bulk-write":
					models := make([]mongo.WriteModel, len(docs))
					for j, d := range docs {
						models[j] = mongo.NewInsertOneModel().SetDocument(d)
					}
					_, err = coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "docs/s")
		})
	}
}

// BenchmarkStoreUpsertBatch compares 100 upserts by _id of new documents (the shape of
// desired-state documents written for many nodes at once) sent one by one and as one unordered
// BulkWrite; each round writes new ids. "bulk-write-existing" upserts the same 100 ids every
// round, so from the second round on every statement matches a document: one FerretDB v1.24
// command of that shape never finishes, and the store sends it as commands of at most
// store.FerretWriteBatch statements (docs/store.md section 2.1).
func BenchmarkStoreUpsertBatch(b *testing.B) {
	const batch = 100
	for _, mode := range []string{"one-by-one", "bulk-write", "bulk-write-existing"} {
		b.Run(mode, func(b *testing.B) {
			st := openStore(b)
			coll := st.Collection("bench_upsert")
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var err error
				models := make([]mongo.WriteModel, batch)
				for j := range models {
					id := fmt.Sprintf("n%d-%03d", i, j)
					if mode == "bulk-write-existing" {
						id = fmt.Sprintf("n-%03d", j)
					}
					models[j] = mongo.NewUpdateOneModel().SetFilter(bson.M{"_id": id}).
						SetUpdate(bson.M{"$set": bson.M{"n": int64(i)}}).SetUpsert(true)
				}
				if mode != "one-by-one" {
					_, err = coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
				} else {
					for j := 0; j < batch && err == nil; j++ {
						_, err = coll.UpdateOne(ctx, bson.M{"_id": fmt.Sprintf("n%d-%03d", i, j)}, bson.M{"$set": bson.M{"n": int64(i)}},
							options.UpdateOne().SetUpsert(true))
					}
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "docs/s")
		})
	}
}

// openRawSQLite opens a SQLite file with the embedded FerretDB's driver (modernc.org/sqlite) and
// pragmas, holding storeDocs rows of JSON like the benchmarks' documents: the peer that shows
// what the engine underneath costs without FerretDB.
func openRawSQLite(b *testing.B) *sql.DB {
	b.Helper()
	path := filepath.Join(b.TempDir(), "raw.sqlite")
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(wal)")
	q.Add("_pragma", "auto_vacuum(none)")
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}).String())
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	b.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec(`CREATE TABLE docs (id TEXT PRIMARY KEY, revision INTEGER NOT NULL, doc TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < storeDocs; i++ {
		if _, err := tx.Exec(`INSERT INTO docs VALUES (?, 0, ?)`, benchDocID(i),
			fmt.Sprintf(`{"_id":%q,"revision":0,"n":0,"region":"r%d","labels":{"isolation":"docker"}}`, benchDocID(i), i%4)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	return db
}

// BenchmarkStoreRawSQLiteCAS is the compare-and-set on raw SQLite: one UPDATE by primary key and
// revision, rewriting the JSON document.
func BenchmarkStoreRawSQLiteCAS(b *testing.B) {
	db := openRawSQLite(b)
	revs := make([]int64, storeDocs)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		k := i % storeDocs
		res, err := db.Exec(`UPDATE docs SET revision = revision + 1, doc = json_set(doc, '$.n', ?, '$.revision', revision + 1) WHERE id = ? AND revision = ?`,
			i, benchDocID(k), revs[k])
		if err != nil {
			b.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			b.Fatalf("cas %d matched %d rows", i, n)
		}
		revs[k]++
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cas/s")
}

// BenchmarkStoreRawSQLiteFindByID is a read by primary key on raw SQLite, the JSON decoded into
// the same Go type.
func BenchmarkStoreRawSQLiteFindByID(b *testing.B) {
	db := openRawSQLite(b)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		var doc string
		if err := db.QueryRow(`SELECT doc FROM docs WHERE id = ?`, benchDocID(i%storeDocs)).Scan(&doc); err != nil {
			b.Fatal(err)
		}
		var d benchDoc
		if err := bson.UnmarshalExtJSON([]byte(doc), false, &d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "finds/s")
}
