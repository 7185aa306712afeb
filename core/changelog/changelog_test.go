package changelog

import (
	"context"
	"sync"
	"testing"

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
