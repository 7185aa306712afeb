package policy

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestConcurrentDecisionsEachGetOneEntry: 64 deploy questions asked at once
// (distinct services, so none is answered from memory) leave 64 decisions,
// each with exactly one change-log entry and its seq in the index. Before,
// decisions raced for seqs and many were indexed without one.
func TestConcurrentDecisionsEachGetOneEntry(t *testing.T) {
	ctx := context.Background()
	st, blobs, rt := newTestDeps(t)
	clog := changelog.New(st, 1, nil)
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Changelog: clog})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "allow", Answer: `{"decision":"allow"}`})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Bind(ctx, Binding{Hook: "deploy", ModuleDigest: m.Digest}); err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			svc := &services.Service{ID: fmt.Sprintf("svc_%d", i), Project: "default", Name: fmt.Sprintf("w%d", i), Replicas: 1}
			ok, _, err := Deploy{Engine: e}.AdmitDeploy(ctx, svc, 0, &nodes.Node{ID: "nod_1", Hostname: "h", Address: "127.0.0.1"})
			if err == nil && !ok {
				err = fmt.Errorf("w%d denied", i)
			}
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
	entries, err := clog.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	seqOf := map[string]int64{}
	for _, en := range entries {
		if en.EntityType == DecisionEntityType {
			if _, dup := seqOf[en.EntityID]; dup {
				t.Errorf("decision %s has two entries", en.EntityID)
			}
			seqOf[en.EntityID] = en.Seq
		}
	}
	ds, err := e.Decisions(ctx, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != n || len(seqOf) != n {
		t.Fatalf("%d decisions indexed, %d in the log; want %d each", len(ds), len(seqOf), n)
	}
	for _, d := range ds {
		if d.Seq == 0 || d.Seq != seqOf[d.ID] {
			t.Errorf("decision %s indexed with seq %d, its entry is %d", d.ID, d.Seq, seqOf[d.ID])
		}
	}
}
