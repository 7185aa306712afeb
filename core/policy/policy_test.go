package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestDeployDecisionsInChangelog: the reconciler's deploy questions are
// change-log entries by the system actor, a repeated identical question is
// answered from memory and recorded once, and the index points at the
// entries (docs/wasm-abi.md section 5.5).
func TestDeployDecisionsInChangelog(t *testing.T) {
	ctx := context.Background()
	st, blobs, rt := newTestDeps(t)
	clog := changelog.New(st, 1, nil)
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Changelog: clog})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "no-deploys", Answer: `{"decision":"deny","reasons":["not today"]}`})))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Bind(ctx, Binding{Hook: "deploy", ModuleDigest: m.Digest})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Bind(ctx, Binding{Hook: "routes.compile", ModuleDigest: m.Digest}); err == nil {
		t.Fatal("a policy module was bound to routes.compile")
	}
	svc := &services.Service{Project: "default", Name: "web", Replicas: 1}
	n := &nodes.Node{ID: "nod_1", Hostname: "h", Address: "127.0.0.1"}
	for range 2 {
		ok, reasons, err := Deploy{Engine: e}.AdmitDeploy(ctx, svc, 0, n)
		if err != nil || ok || len(reasons) != 1 || reasons[0] != "not today" {
			t.Fatalf("admit: %v %v %v", ok, reasons, err)
		}
	}
	entries, err := clog.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("%d entries, want the one decision: %+v", len(entries), entries)
	}
	got := entries[0]
	if got.EntityType != DecisionEntityType || got.Op != node.OpCreate || got.ActorType != "system" || got.ActorID != "berthd" {
		t.Fatalf("entry %+v", got)
	}
	var d Decision
	if err := json.Unmarshal(got.Payload, &d); err != nil {
		t.Fatal(err)
	}
	if d.ID != got.EntityID || d.BindingID != b.ID || d.ModuleDigest != m.Digest || d.Result != "deny" || len(d.InputSHA256) != 64 {
		t.Fatalf("payload %+v", d)
	}
	ds, err := e.Decisions(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].ID != d.ID || ds[0].Seq != got.Seq {
		t.Fatalf("index %+v, entry seq %d", ds, got.Seq)
	}
}
