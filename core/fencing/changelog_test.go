package fencing_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
)

// recoverOnRestart is the next start of a berthd that died after its writes
// and before handing their changes to the log: Recover over the tracked
// collections. It returns the log's entries; a second Recover must append
// nothing.
func (f *fixture) recoverOnRestart(t *testing.T, want int) []node.LogEntry {
	t.Helper()
	ctx := context.Background()
	l := changelog.New(f.st, 1, nil)
	l.TrackOutbox(fencing.Collection, "")
	l.TrackOutbox("nodes", "")
	n, err := l.Recover(ctx)
	if err != nil || n != want {
		t.Fatalf("recover: %d, %v; want %d", n, err, want)
	}
	if n, err := l.Recover(ctx); err != nil || n != 0 {
		t.Fatalf("second recover: %d, %v; want 0", n, err)
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != len(entries) {
		t.Fatalf("chain verified %d of %d: %v", got, len(entries), err)
	}
	return entries
}

// TestLostSurvivesDeathBeforeAppend: declaring a node lost commits one
// compare-and-set per lease it holds, each carrying its node_lost change;
// berthd dies before any append. The next start appends exactly one entry
// per superseded lease, and a repeated declaration (which changes nothing)
// adds none. Before, the entry was appended after the writes, so a kill in
// between lost it.
func TestLostSurvivesDeathBeforeAppend(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1 := f.enroll(t, "n1")
	for _, svc := range []string{"svc_01A", "svc_01B"} {
		if _, _, err := f.auth.Grant(ctx, fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: svc, NodeID: n1,
			Mode: node.LeaseExpiring, Duration: 15 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	actx := changelog.WithActor(ctx, changelog.Actor{Type: "user", ID: "usr_1"})
	changed, err := f.auth.Lost(actx, n1)
	if err != nil || len(changed) != 2 {
		t.Fatalf("lost: %d leases, %v; want 2", len(changed), err)
	}
	for _, l := range changed {
		if len(l.LogOutbox) != 1 {
			t.Fatalf("lease %s outbox %d; want its change", l.ID, len(l.LogOutbox))
		}
	}
	if again, err := f.auth.Lost(actx, n1); err != nil || len(again) != 0 {
		t.Fatalf("lost again: %d, %v; want nothing changed", len(again), err)
	}
	entries := f.recoverOnRestart(t, 2)
	if len(entries) != 2 {
		t.Fatalf("%d entries; want 2", len(entries))
	}
	for i, e := range entries {
		var p fencing.LostChange
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		if e.EntityType != fencing.LostEntityType || e.EntityID != n1 || e.ActorID != "usr_1" || len(p.Leases) != 1 ||
			p.Leases[0].ID != changed[i].ID || p.Leases[0].Holder != "" || p.Leases[0].FencingToken != changed[i].FencingToken {
			t.Fatalf("entry %d: %s %s by %s, payload %+v; want lease %s freed at token %d", i, e.EntityType, e.EntityID, e.ActorID, p, changed[i].ID, changed[i].FencingToken)
		}
	}
	var l fencing.Lease
	if err := f.st.Collection(fencing.Collection).FindOne(ctx, bson.M{"_id": changed[0].ID}).Decode(&l); err != nil || len(l.LogOutbox) != 0 {
		t.Fatalf("lease after recovery: outbox %d, %v; want empty", len(l.LogOutbox), err)
	}
}

// TestFenceAckSurvivesDeathBeforeAppend: an acknowledgement that does not
// match is refused and records nothing; one that matches commits with its
// node_fence_ack change in the node's outbox, and berthd dies before the
// append. The next start appends exactly one entry. Before, the entry was
// appended after the writes, so a kill in between lost it.
func TestFenceAckSurvivesDeathBeforeAppend(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	n1 := f.enroll(t, "n1")
	l, _, err := f.auth.Grant(ctx, grant(node.LeaseExpiring, 15*time.Second, n1))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.auth.RecordFenceFailure(ctx, n1, nodes.FenceFailure{LeaseID: l.ID, ResourceID: l.ResourceID, FencingToken: 1}); err != nil {
		t.Fatal(err)
	}
	actx := changelog.WithActor(ctx, changelog.Actor{Type: "user", ID: "usr_1"})
	if _, err := f.auth.FenceAck(actx, n1, []string{"lse_other"}); !errors.Is(err, fencing.ErrAckMismatch) {
		t.Fatalf("mismatched ack: %v", err)
	}
	if n, err := f.reg.Get(ctx, n1); err != nil || len(n.LogOutbox) != 0 {
		t.Fatalf("node after a refused ack: outbox %d, %v; want none", len(n.LogOutbox), err)
	}
	if _, err := f.auth.FenceAck(actx, n1, []string{l.ID}); err != nil {
		t.Fatal(err)
	}
	entries := f.recoverOnRestart(t, 1)
	var p fencing.FenceAckChange
	if len(entries) != 1 {
		t.Fatalf("%d entries; want 1", len(entries))
	}
	if err := json.Unmarshal(entries[0].Payload, &p); err != nil {
		t.Fatal(err)
	}
	if e := entries[0]; e.EntityType != fencing.FenceAckEntityType || e.EntityID != n1 || e.ActorID != "usr_1" || p.NodeID != n1 || len(p.LeaseIDs) != 1 || p.LeaseIDs[0] != l.ID {
		t.Fatalf("entry %s %s by %s, payload %+v", e.EntityType, e.EntityID, e.ActorID, p)
	}
	if n, err := f.reg.Get(ctx, n1); err != nil || len(n.LogOutbox) != 0 {
		t.Fatalf("node after recovery: outbox %d, %v; want empty", len(n.LogOutbox), err)
	}
}
