package policy

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/wasmtest"
)

// refuseMemoryOnly is the real change log, except that it refuses the
// first n changes handed over without an outbox, as a log whose batches
// keep failing (a store that refuses the insert) answers them.
type refuseMemoryOnly struct {
	*changelog.Log
	n atomic.Int32
}

var _ ChangeAppender = (*refuseMemoryOnly)(nil)

func (r *refuseMemoryOnly) Record(ctx context.Context, ref changelog.Ref, p changelog.Pending) (node.LogEntry, error) {
	if ref.Collection == "" && r.n.Add(-1) >= 0 {
		return node.LogEntry{}, errors.New("refused for the test")
	}
	return r.Log.Record(ctx, ref, p)
}

// TestDecisionIndexedOnceWithItsSeq: a decision is appended, then indexed
// once with its seq and no outbox: the index document is written once,
// never again for its entry. A decision whose append fails is indexed with
// its entry pending in its outbox and handed to the log again, so it gets
// exactly one entry, and a later recovery appends nothing.
func TestDecisionIndexedOnceWithItsSeq(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, blobs, rt := newTestDeps(t)
	clog := changelog.New(st, 1, nil)
	app := &refuseMemoryOnly{Log: clog}
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Changelog: app})
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
	n := &nodes.Node{ID: "nod_1", Hostname: "h", Address: "127.0.0.1"}
	admit := func(name string) {
		t.Helper()
		svc := &services.Service{ID: "svc_" + name, Project: "default", Name: name, Replicas: 1}
		if ok, _, err := (Deploy{Engine: e}).AdmitDeploy(ctx, svc, 0, n); err != nil || !ok {
			t.Fatalf("admit %s: %v, %v", name, ok, err)
		}
	}
	admit("web")
	var doc struct {
		Seq    int64               `bson:"seq"`
		Outbox []changelog.Pending `bson:"log_outbox"`
	}
	ds, err := e.Decisions(ctx, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("decisions %+v, %v; want 1", ds, err)
	}
	if err := st.Collection(DecisionsCollection).FindOne(ctx, bson.M{"_id": ds[0].ID}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Seq != 1 || len(doc.Outbox) != 0 {
		t.Fatalf("decision right after its admission: seq %d, outbox %d; want 1 and none (nothing left to write)", doc.Seq, len(doc.Outbox))
	}

	app.n.Store(1) // the next append fails
	admit("api")
	if err := clog.Cleared(ctx); err != nil {
		t.Fatal(err)
	}
	ds, err = e.Decisions(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("decisions %+v, %v; want 2", ds, err)
	}
	entries, err := clog.Range(ctx, 1, 0)
	if err != nil || len(entries) != 2 {
		t.Fatalf("%d entries, %v; want 2", len(entries), err)
	}
	for _, d := range ds {
		if err := st.Collection(DecisionsCollection).FindOne(ctx, bson.M{"_id": d.ID}).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, en := range entries {
			if en.EntityID == d.ID {
				want = en.Seq
			}
		}
		if want == 0 || doc.Seq != want || len(doc.Outbox) != 0 {
			t.Errorf("decision %s: seq %d, outbox %d; want its entry %d and none", d.ID, doc.Seq, len(doc.Outbox), want)
		}
	}
	next := changelog.New(st, 1, nil)
	next.TrackOutbox(DecisionsCollection, "seq")
	if got, err := next.Recover(ctx); err != nil || got != 0 {
		t.Fatalf("recover: %d, %v; want 0", got, err)
	}
}
