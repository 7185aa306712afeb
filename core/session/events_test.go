package session

import (
	"context"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/services"
)

// barrier sends a ping and waits for its pong: the core handles a session's
// frames in order, so everything sent before has been handled.
func (p *peer) barrier() {
	p.t.Helper()
	p.send(1, node.TypePing, struct{}{})
	for {
		if env := p.next(); env.Type == node.TypePong {
			return
		}
	}
}

// expectEvents checks the stored events of typ carry data.reason == reason, in order.
func expectEvents(t *testing.T, f *fixture, typ string, reasons ...string) {
	t.Helper()
	recs, err := f.events.List(context.Background(), 0, typ, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(reasons) {
		t.Fatalf("%d %s events, want %d: %+v", len(recs), typ, len(reasons), recs)
	}
	for i, r := range recs {
		got, _ := r.Event.Data["reason"].(string)
		if r.Event.Subject.ID != f.node.ID || got != reasons[i] {
			t.Errorf("%s event %d: %+v, want reason %q", typ, i, r.Event, reasons[i])
		}
	}
}

// TestNodeEventsDeduplicated: the core stores a node's event once however
// often it is resent, assigns seq, and never lets a node speak for another
// (docs/node-protocol.md section 5.4); a closed socket is session_closed (4.4).
func TestNodeEventsDeduplicated(t *testing.T) {
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	ev := node.Event{SchemaVersion: 1, ID: "evt_01JTEST", Type: "app.down", Time: time.Now().UTC(),
		Source:  node.EventSource{Kind: "node", NodeID: "nod_someone_else"},
		Subject: node.EventRef{Type: "workload", ID: "wl_1"}, Data: map[string]any{"failures": 3}}
	p.send(1, node.TypeEvent, ev)
	p.send(1, node.TypeEvent, ev)
	p.send(1, node.TypeEvent, node.Event{ID: "no-prefix", Type: "x"})
	p.expectError("bad_message", false)
	p.barrier()
	recs, err := f.events.List(context.Background(), 0, "app.down", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Seq == 0 || recs[0].Event.Source.NodeID != f.node.ID {
		t.Fatalf("stored app.down events: %+v; want one, from %s", recs, f.node.ID)
	}
	_ = p.ws.CloseNow()
	waitChange(t, f.changes, "node.disconnected")
	expectEvents(t, f, events.TypeNodeConnected, "")
	expectEvents(t, f, events.TypeNodeDisconnected, "session_closed")
}

// TestUnreportedWorkloadIsUnknown: a workload the core knows on this node and
// a status report leaves out becomes unknown, not gone (section 5.3).
func TestUnreportedWorkloadIsUnknown(t *testing.T) {
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	ctx := context.Background()
	prj, _, _ := f.cat.EnsureProject(ctx, "p")
	svc, _, err := f.cat.PutService(ctx, prj, &services.Service{Name: "s", BundleDigest: "sha256:x", Command: []string{"x"}, Replicas: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.cat.CreateWorkload(ctx, svc, 0, f.node.ID)
	b, _ := f.cat.CreateWorkload(ctx, svc, 1, f.node.ID)
	p.send(1, node.TypeStatusReport, node.StatusReport{Workloads: []node.WorkloadStatus{
		{WorkloadID: a.ID, ObservedStatus: "running", Health: "passing"},
		{WorkloadID: b.ID, ObservedStatus: "running", Health: "passing"},
	}})
	p.send(1, node.TypeStatusReport, node.StatusReport{Workloads: []node.WorkloadStatus{
		{WorkloadID: a.ID, ObservedStatus: "running", Health: "passing"},
	}})
	p.barrier()
	ws, err := f.cat.ListWorkloads(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, w := range ws {
		got[w.ID] = w.ObservedStatus + "/" + w.Health
	}
	if got[a.ID] != "running/passing" || got[b.ID] != "unknown/unknown" {
		t.Fatalf("after a report without %s: %v; want it unknown and still recorded", b.ID, got)
	}
}
