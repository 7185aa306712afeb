package changelog

import (
	"context"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestAppendGapFreeAndChained: concurrent appends give seq 1..n without gaps,
// and the stored chain verifies from an empty copy (docs/node-protocol.md section 7).
func TestAppendGapFreeAndChained(t *testing.T) {
	l := New(storetest.Open(t), 1, nil)
	ctx := context.Background()
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := l.Append(ctx, Change{ActorType: "user", ActorID: "tok_1", EntityType: "service", EntityID: "svc_1",
				Op: node.OpUpdate, Payload: map[string]any{"replicas": i, "ratio": 0.5}})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != n {
		t.Fatalf("%d entries, want %d", len(entries), n)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != n {
		t.Fatalf("chain verified %d of %d: %v", got, n, err)
	}
	seq, hash, err := l.Head(ctx)
	if err != nil || seq != n || hash != entries[n-1].Hash {
		t.Fatalf("head %d %s %v", seq, hash, err)
	}
	if _, err := l.Append(ctx, Change{EntityType: "service", EntityID: "svc_1", Op: node.OpDelete, Payload: map[string]any{"x": 1}}); err != nil {
		t.Fatal(err)
	}
	last, _ := l.Range(ctx, n+1, 10)
	if len(last) != 1 || string(last[0].Payload) != "{}" {
		t.Fatalf("delete entry %+v, want payload {}", last)
	}
	// Tampering with any entry breaks verification at that entry.
	entries[5].Payload = []byte(`{"replicas":99}`)
	if got, err := node.VerifyChain(0, "", entries); err == nil || got != 5 {
		t.Fatalf("tampered chain: verified %d, err %v; want stop at 5", got, err)
	}
}

// TestHeadHintLagging: a writer that died between storing its entry and
// moving the head hint leaves the hint behind; the next append rolls it
// forward instead of reusing a seq, and a log without the hint (written
// before it existed) finds its head once.
func TestHeadHintLagging(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	l := New(st, 1, nil)
	for i := range 3 {
		if _, err := l.Append(ctx, Change{EntityType: "service", EntityID: "svc_1", Op: node.OpUpdate, Payload: map[string]any{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	cleared(t, l) // the hint moves after the waiters are told
	// Put the hint back to seq 1, as if the writers of 2 and 3 died before moving it.
	if _, err := st.Collection(HeadCollection).UpdateOne(ctx, bson.M{"_id": headID}, bson.M{"$set": bson.M{"seq": 1}}); err != nil {
		t.Fatal(err)
	}
	fresh := New(st, 1, nil) // no in-memory tail
	e, err := fresh.Append(ctx, Change{EntityType: "service", EntityID: "svc_1", Op: node.OpDelete})
	if err != nil || e.Seq != 4 {
		t.Fatalf("append after a lagging hint: seq %d, %v; want 4", e.Seq, err)
	}
	// No hint at all: the head is found by the entries themselves.
	if _, err := st.Collection(HeadCollection).DeleteMany(ctx, bson.M{}); err != nil {
		t.Fatal(err)
	}
	seq, hash, err := New(st, 1, nil).Head(ctx)
	if err != nil || seq != 4 || hash != e.Hash {
		t.Fatalf("head without hint: %d %q %v; want 4 %q", seq, hash, err, e.Hash)
	}
	entries, err := New(st, 1, nil).Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != 4 {
		t.Fatalf("chain verified %d of 4: %v", got, err)
	}
}
