package events

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestAppendDeduplicatesByID: the core assigns seq and a resent event id
// stores nothing new (docs/node-protocol.md section 5.4).
func TestAppendDeduplicatesByID(t *testing.T) {
	l := New(storetest.Open(t), nil)
	ctx := context.Background()
	if err := l.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	ev := node.Event{ID: "evt_01", Type: "app.down", Time: time.Now().UTC(),
		Source: node.EventSource{Kind: "node", NodeID: "nod_1"}, Subject: node.EventRef{Type: "workload", ID: "wl_1"},
		Data: map[string]any{"failures": 3.0}}
	seq1, dup, err := l.Append(ctx, ev)
	if err != nil || dup || seq1 != 1 {
		t.Fatalf("first append: seq %d dup %v err %v", seq1, dup, err)
	}
	seq2, dup, err := l.Append(ctx, ev)
	if err != nil || !dup || seq2 != seq1 {
		t.Fatalf("resent event: seq %d dup %v err %v; want seq %d, duplicate", seq2, dup, err, seq1)
	}
	seq3, _, err := l.Append(ctx, Core(TypeNodeConnected, "nod_1", nil, time.Now()))
	if err != nil || seq3 <= seq1 {
		t.Fatalf("core event: seq %d err %v", seq3, err)
	}
	got, err := l.List(ctx, 0, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Event.ID != "evt_01" || got[0].Event.Data["failures"] != 3.0 || got[1].Event.Type != TypeNodeConnected {
		t.Fatalf("list: %+v", got)
	}
	only, err := l.List(ctx, 0, "app.down", 0)
	if err != nil || len(only) != 1 {
		t.Fatalf("list by type: %+v %v", only, err)
	}
}

// TestConcurrentAppendsBatch: many callers at once, on the real embedded
// store, each answered only once its event is stored: every event is in the
// log with the seq its caller was given, seqs are unique, a resent id in the
// same burst stores one row and answers every caller with its seq
// (docs/store.md section 2.2).
func TestConcurrentAppendsBatch(t *testing.T) {
	l := New(storetest.Open(t), nil)
	ctx := context.Background()
	if err := l.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	const callers, each = 48, 10
	type answer struct {
		id  string
		seq int64
		dup bool
	}
	answers := make(chan answer, callers*each+callers)
	errs := make(chan error, callers*each+callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("evt_c%02d_%02d", c, i)
				if i == each-1 {
					id = "evt_shared" // every caller's last event has one id
				}
				seq, dup, err := l.Append(ctx, node.Event{ID: id, Type: "test.batch", Time: time.Now().UTC(),
					Source: node.EventSource{Kind: "core"}})
				if err != nil {
					errs <- err
					return
				}
				answers <- answer{id, seq, dup}
			}
		}()
	}
	wg.Wait()
	close(answers)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seqOf := map[string]int64{}
	fresh := 0
	for a := range answers {
		if prev, ok := seqOf[a.id]; ok && prev != a.seq {
			t.Fatalf("%s answered with seq %d and %d", a.id, prev, a.seq)
		}
		seqOf[a.id] = a.seq
		if !a.dup {
			fresh++
		}
	}
	wantRows := callers*(each-1) + 1
	if fresh != wantRows {
		t.Fatalf("%d appends reported as new, want %d (one per distinct id)", fresh, wantRows)
	}
	stored, err := l.List(ctx, 0, "", wantRows+10)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != wantRows {
		t.Fatalf("%d events stored, want %d", len(stored), wantRows)
	}
	seen := map[int64]bool{}
	for _, r := range stored {
		if seen[r.Seq] {
			t.Fatalf("seq %d stored twice", r.Seq)
		}
		seen[r.Seq] = true
		if seqOf[r.Event.ID] != r.Seq {
			t.Fatalf("%s stored at seq %d, its caller was told %d", r.Event.ID, r.Seq, seqOf[r.Event.ID])
		}
	}
}
