package policy

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestBindingChangesSurviveDeathBeforeAppend: binds and an unbind commit,
// and berthd "dies" before handing any change to the log (nothing is
// recorded). An unbound binding is gone for readers at once; at the next
// start Recover appends exactly one entry per committed change, in order,
// removes the unbound document, and a second Recover appends nothing. A
// bind or unbind that failed leaves no entry. Before, these changes were
// appended only after the write, so a kill in between lost them.
func TestBindingChangesSurviveDeathBeforeAppend(t *testing.T) {
	ctx := context.Background()
	st, blobs, rt := newTestDeps(t)
	// The engine of the berthd that dies has a log it never hands anything to.
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Changelog: changelog.New(st, 1, nil)})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "allow", Answer: `{"decision":"allow"}`})))
	if err != nil {
		t.Fatal(err)
	}
	actx := changelog.WithActor(ctx, changelog.Actor{Type: "user", ID: "usr_1"})
	a, err := e.Bind(actx, Binding{Hook: "deploy", ModuleDigest: m.Digest})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Bind(actx, Binding{Hook: "deploy", ModuleDigest: m.Digest, Project: "web"})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := e.Unbind(actx, b.ID)
	if err != nil || gone.RemoveOn == "" || len(gone.LogOutbox) != 2 {
		t.Fatalf("unbind: %+v %v; want the binding marked with its create and delete pending", gone, err)
	}
	// Failed writes: nothing committed, nothing may be recorded.
	if _, err := e.Unbind(actx, b.ID); !errors.Is(err, ErrBindingNotFound) {
		t.Fatalf("second unbind: %v; want ErrBindingNotFound", err)
	}
	if _, err := e.Unbind(actx, "pbn_unknown"); !errors.Is(err, ErrBindingNotFound) {
		t.Fatalf("unbind unknown: %v", err)
	}
	if _, err := e.Bind(actx, Binding{Hook: "deploy", ModuleDigest: "sha256:unknown"}); !errors.Is(err, ErrModuleNotFound) {
		t.Fatalf("bind unknown module: %v", err)
	}
	bs, err := e.Bindings(ctx)
	if err != nil || len(bs) != 1 || bs[0].ID != a.ID {
		t.Fatalf("bindings before recovery: %+v %v; want only %s (the unbound one is gone)", bs, err, a.ID)
	}

	// The next start.
	l := changelog.New(st, 1, nil)
	l.TrackOutbox(BindingsCollection, "")
	n, err := l.Recover(ctx)
	if err != nil || n != 3 {
		t.Fatalf("recover: %d, %v; want 3 entries", n, err)
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != 3 {
		t.Fatalf("chain verified %d: %v", got, err)
	}
	want := [][3]string{{a.ID, node.OpCreate}, {b.ID, node.OpCreate}, {b.ID, node.OpDelete}}
	for i, e := range entries {
		if e.EntityType != BindingEntityType || e.EntityID != want[i][0] || e.Op != want[i][1] || e.ActorID != "usr_1" {
			t.Fatalf("entry %d: %s %s %s by %s; want %s %s %s", i, e.EntityType, e.EntityID, e.Op, e.ActorID, BindingEntityType, want[i][0], want[i][1])
		}
	}
	if c, err := st.Collection(BindingsCollection).CountDocuments(ctx, bson.M{"_id": b.ID}); err != nil || c != 0 {
		t.Fatalf("unbound document after recovery: %d, %v; want removed", c, err)
	}
	var left Binding
	if err := st.Collection(BindingsCollection).FindOne(ctx, bson.M{"_id": a.ID}).Decode(&left); err != nil || len(left.LogOutbox) != 0 {
		t.Fatalf("bound document after recovery: outbox %d, %v; want empty", len(left.LogOutbox), err)
	}
	if n, err := l.Recover(ctx); err != nil || n != 0 {
		t.Fatalf("recover again: %d, %v; want 0", n, err)
	}
}
