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
	t.Parallel()
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	w := f.placeWorkload(t, f.node.ID, 0)
	ev := node.Event{SchemaVersion: 1, ID: "evt_01JTEST", Type: "app.down", Time: time.Now().UTC(),
		Source:  node.EventSource{Kind: "node", NodeID: "nod_someone_else"},
		Subject: node.EventRef{Type: "workload", ID: w.ID}, Data: map[string]any{"failures": 3}}
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
	t.Parallel()
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

// placeWorkload records a workload of service "s" in project "p" at slot on nodeID.
func (f *fixture) placeWorkload(t *testing.T, nodeID string, slot int) *services.Workload {
	t.Helper()
	ctx := context.Background()
	prj, _, err := f.cat.EnsureProject(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := f.cat.GetService(ctx, prj, "s")
	if err != nil {
		svc, _, err = f.cat.PutService(ctx, prj, &services.Service{Name: "s", BundleDigest: "sha256:x", Command: []string{"x"}, Replicas: 4}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	w, err := f.cat.CreateWorkload(ctx, svc, slot, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestEventsAboutOtherNodesWorkloadsRefused: a node may send events only about
// workloads of its own desired state, or still placed on it while it removes
// them; an event about another node's workload, or an unknown one, is refused
// bad_message (non-fatal) and not stored (docs/node-protocol.md section 5.4).
func TestEventsAboutOtherNodesWorkloadsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")

	desired := f.placeWorkload(t, f.node.ID, 0)
	removing := f.placeWorkload(t, f.node.ID, 1)
	if _, err := f.cat.SetDesiredStatus(ctx, removing.ID, services.DesiredRemoved); err != nil {
		t.Fatal(err)
	}
	theirs := f.placeWorkload(t, "nod_other", 2)
	// Only desired is in the node's desired state; removing keeps its record on
	// the node until the node reports it deleted.
	n, err := f.reg.Get(ctx, f.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	spec := `{"workloads":[{"workload_id":"` + desired.ID + `","service":"s","desired_status":"running"}],"routes":[],"network":{"address":"127.0.0.1"}}`
	if _, _, err := f.reg.SetDesired(ctx, n, "h1", spec); err != nil {
		t.Fatal(err)
	}
	f.srv.Config.Handler.(*Server).Push(ctx, f.node.ID)
	if env := p.next(); env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want the pushed desired_state", env.Type)
	}

	event := func(id, wl string) node.Event {
		return node.Event{SchemaVersion: 1, ID: id, Type: "workload.crashed", Time: time.Now().UTC(),
			Subject: node.EventRef{Type: "workload", ID: wl}, Data: map[string]any{"exit_code": 1}}
	}
	p.send(1, node.TypeEvent, event("evt_DESIRED", desired.ID))
	p.send(1, node.TypeEvent, event("evt_REMOVING", removing.ID))
	p.send(1, node.TypeEvent, event("evt_THEIRS", theirs.ID))
	p.expectError("bad_message", false)
	p.send(1, node.TypeEvent, event("evt_UNKNOWN", "wl_nosuchworkload"))
	p.expectError("bad_message", false)
	p.send(1, node.TypeEvent, event("evt_NOID", ""))
	p.expectError("bad_message", false)
	p.barrier() // the session goes on after each refusal

	recs, err := f.events.List(ctx, 0, "workload.crashed", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Event.ID)
	}
	if len(got) != 2 || got[0] != "evt_DESIRED" || got[1] != "evt_REMOVING" {
		t.Fatalf("stored workload.crashed events %v; want exactly evt_DESIRED and evt_REMOVING", got)
	}
}

// TestEventWithoutSubjectRefused: an event must name what it is about
// (docs/node-protocol.md section 5.4): one with no subject, or a subject
// without a type or an id, is answered bad_message, non-fatal, and nothing
// is stored; the session goes on and a well-formed event is stored.
func TestEventWithoutSubjectRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	event := func(id string, subject node.EventRef) node.Event {
		return node.Event{SchemaVersion: 1, ID: id, Type: "host.disk_low", Time: time.Now().UTC(), Subject: subject}
	}
	for _, ev := range []node.Event{
		event("evt_NOSUBJECT", node.EventRef{}),
		event("evt_NOTYPE", node.EventRef{ID: "les_1"}),
		event("evt_NOREFID", node.EventRef{Type: "lease"}),
		event("evt_OTHERNODE", node.EventRef{Type: "node", ID: "nod_someone_else"}),
	} {
		p.send(1, node.TypeEvent, ev)
		p.expectError("bad_message", false)
	}
	p.send(1, node.TypeEvent, event("evt_OWN", node.EventRef{Type: "node", ID: f.node.ID}))
	p.barrier()
	recs, err := f.events.List(context.Background(), 0, "host.disk_low", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Event.ID != "evt_OWN" {
		t.Fatalf("stored host.disk_low events %+v; want evt_OWN alone", recs)
	}
}
