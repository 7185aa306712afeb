package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

// changelogBacklog is how many entries the log holds before measuring.
const changelogBacklog = 2000

// BenchmarkChangelog measures the change log on the embedded store with
// changelogBacklog entries already in it: appends per second, and the reads
// a node follower makes per append (one Range of the new entry, one HashAt
// for its ack).
func BenchmarkChangelog(b *testing.B) {
	ctx := context.Background()
	l := changelog.New(openStore(b), 1, nil)
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
