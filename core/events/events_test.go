package events

import (
	"context"
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
