package changelog

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestFind appends 1,200 entries (every third a node's, every tenth by actor tok_b) and reads
// them as an auditor does: unfiltered ascending is Range; a filter keeps only its entries in
// either order, across batches; Limit stops the scan and NextSeq goes on where it stopped;
// MaxScan bounds the reads; a range upside down is refused.
func TestFind(t *testing.T) {
	l := New(storetest.Open(t), 1, nil)
	ctx := context.Background()
	const n = 1200
	for i := 1; i <= n; i++ {
		typ, actor := "service", "tok_a"
		if i%3 == 0 {
			typ = "node"
		}
		if i%10 == 0 {
			actor = "tok_b"
		}
		if _, err := l.Append(ctx, Change{ActorType: "machine", ActorID: actor, EntityType: typ, EntityID: fmt.Sprintf("e%d", i%7), Op: node.OpUpdate,
			Payload: map[string]any{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	seqs := func(es []node.LogEntry) []int64 {
		out := []int64{}
		for _, e := range es {
			out = append(out, e.Seq)
		}
		return out
	}
	want := func(from, to, step int64, keep func(int64) bool, limit int) []int64 {
		out := []int64{}
		for s := from; (step > 0 && s <= to) || (step < 0 && s >= to); s += step {
			if keep(s) && len(out) < limit {
				out = append(out, s)
			}
		}
		return out
	}
	all := func(int64) bool { return true }
	nodes := func(s int64) bool { return s%3 == 0 }

	plain, err := l.Find(ctx, Query{FromSeq: 101, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	ranged, _ := l.Range(ctx, 101, 50)
	if d := cmp.Diff(seqs(ranged), seqs(plain.Entries)); d != "" || plain.Head != n || plain.NextSeq != 151 {
		t.Fatalf("unfiltered Find is not Range (head %d, next %d): %s", plain.Head, plain.NextSeq, d)
	}

	for _, c := range []struct {
		name    string
		q       Query
		want    []int64
		nextSeq int64
		scanned int
	}{
		{"nodes ascending", Query{EntityType: "node", Limit: 300}, want(1, n, 1, nodes, 300), 901, 900},
		{"nodes descending", Query{EntityType: "node", Desc: true, Limit: 300}, want(n, 1, -1, nodes, 300), 302, 898},
		{"actor and type newest first", Query{ActorID: "tok_b", EntityType: "node", Desc: true, Limit: 500},
			want(n, 1, -1, func(s int64) bool { return s%30 == 0 }, 500), 0, n},
		{"until and from", Query{FromSeq: 200, UntilSeq: 700, EntityType: "node", Desc: true, Limit: 500},
			want(700, 200, -1, nodes, 500), 0, 501},
		{"bounded scan", Query{EntityID: "no-such", MaxScan: 500, Desc: true}, []int64{}, 700, 500},
		{"bounded scan ascending", Query{EntityID: "no-such", MaxScan: 500}, []int64{}, 501, 500},
		{"everything descending", Query{Desc: true, Limit: 10}, want(n, 1, -1, all, 10), n - 10, 10},
	} {
		res, err := l.Find(ctx, c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d := cmp.Diff(c.want, seqs(res.Entries)); d != "" {
			t.Errorf("%s: entries (-want +got):\n%s", c.name, d)
		}
		if res.NextSeq != c.nextSeq || res.Scanned != c.scanned {
			t.Errorf("%s: next %d scanned %d, want %d and %d", c.name, res.NextSeq, res.Scanned, c.nextSeq, c.scanned)
		}
	}
	if _, err := l.Find(ctx, Query{FromSeq: 10, UntilSeq: 5}); err != ErrBadQuery {
		t.Fatalf("from 10 until 5: %v, want ErrBadQuery", err)
	}
}
