package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// changelogBacklog is how many entries the log holds before measuring.
const changelogBacklog = 2000

// changelogWriters is how many goroutines write at once in the concurrent
// figures.
const changelogWriters = 64

// BenchmarkChangelog measures the change log on the embedded store with
// changelogBacklog entries already in it: appends per second, and the reads
// a node follower makes per append (one Range of the new entry, one HashAt
// for its ack), appends per second with 64 concurrent writers, and durable
// writes (document with outbox, then entry) per second with 64 writers.
func BenchmarkChangelog(b *testing.B) {
	ctx := context.Background()
	st := openStore(b)
	l := changelog.New(st, 1, nil)
	ch := func(i int) changelog.Change {
		return changelog.Change{ActorType: "user", ActorID: "tok_bench", EntityType: "service",
			EntityID: fmt.Sprintf("svc_%d", i), Op: node.OpUpdate, Payload: map[string]any{"replicas": i, "env": map[string]string{"A": "b"}}}
	}
	for i := range changelogBacklog {
		if _, err := l.Append(ctx, ch(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("append", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := l.Append(ctx, ch(i)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	})
	// 64 writers at once, as 64 concurrent API writes: changes queue and
	// are appended in batches by the Log's Run goroutine, as in berthd.
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); l.Run(rctx) }()
	defer func() { stop(); <-ran }()
	b.Run("append_64_writers", func(b *testing.B) {
		var n atomic.Int64
		b.SetParallelism(max(1, changelogWriters/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := l.Append(ctx, ch(int(n.Add(1)))); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	})
	// The durable path of a write: the document stored with its change in
	// its outbox, then the entry appended and the outbox cleared.
	var docs atomic.Int64 // across the runs of the sub-benchmark: ids stay unique
	b.Run("outbox_write_64_writers", func(b *testing.B) {
		coll := st.Collection("bench_outbox")
		b.SetParallelism(max(1, changelogWriters/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := int(docs.Add(1))
				p, err := changelog.Prepare(ch(i))
				if err != nil {
					b.Error(err)
					return
				}
				id := fmt.Sprintf("doc_%d", i)
				if _, err := coll.InsertOne(ctx, bson.M{"_id": id, changelog.OutboxField: []changelog.Pending{p}}); err != nil {
					b.Error(err)
					return
				}
				if _, err := l.Record(ctx, changelog.Ref{Collection: "bench_outbox", ID: id}, p); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	})
	b.Run("follow", func(b *testing.B) {
		head, _, err := l.Head(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			es, err := l.Range(ctx, head, 1)
			if err != nil || len(es) != 1 {
				b.Fatalf("range: %d entries, %v", len(es), err)
			}
			if _, ok, err := l.HashAt(ctx, head); err != nil || !ok {
				b.Fatalf("hash at %d: %v %v", head, ok, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "follows/s")
	})
}
