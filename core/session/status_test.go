package session

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// TestStatusWriterFolds drives the status writer's passes by hand over the real store: what a
// node's sessions did between two passes is folded into the writes that leave its document as
// the newest session left it, and an old session's end never marks a newer session's node
// disconnected.
func TestStatusWriterFolds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := viewCtx(t)
	type wake struct{ connected, disconnected, applied bool }
	var wakes []wake
	w := &statusWriter{nodes: f.reg, log: slog.New(slog.DiscardHandler), pending: map[string]*nodeStatus{}, kick: make(chan struct{}, 1),
		written: func(_ string, c, d, a bool) { wakes = append(wakes, wake{c, d, a}) }}
	id := f.node.ID
	pass := func() {
		t.Helper()
		if more, failed := w.pass(ctx); more || failed {
			t.Fatalf("pass: more %v failed %v", more, failed)
		}
	}
	// s1 starts and ends, s2 starts and reports applied revision 5: one start written.
	w.started(id, started{session: "ses_1", agentVersion: "a1"})
	w.ended(id, "ses_1")
	w.started(id, started{session: "ses_2", agentVersion: "a2"})
	rev := int64(5)
	w.seen(id, &rev)
	pass()
	n, _ := f.reg.Get(ctx, id)
	if n.Status != "connected" || n.SessionID != "ses_2" || n.AgentVersion != "a2" || n.AppliedRev != 5 || n.LastSeenAt == nil {
		t.Fatalf("after the first pass: %s %s %s applied %d seen %v", n.Status, n.SessionID, n.AgentVersion, n.AppliedRev, n.LastSeenAt)
	}
	if len(wakes) != 1 || !wakes[0].connected {
		t.Fatalf("wakes %+v, want one for the connection", wakes)
	}
	// s3 replaces s2 (s2's end arrives after s3's start, as when the newest wins): connected
	// under s3.
	w.started(id, started{session: "ses_3", agentVersion: "a3"})
	w.ended(id, "ses_2")
	pass()
	if n, _ = f.reg.Get(ctx, id); n.Status != "connected" || n.SessionID != "ses_3" {
		t.Fatalf("after s3 replaced s2: %s %s", n.Status, n.SessionID)
	}
	// An end of a session that is not the node's current one changes nothing.
	w.ended(id, "ses_1")
	pass()
	if n, _ = f.reg.Get(ctx, id); n.Status != "connected" || n.SessionID != "ses_3" {
		t.Fatalf("after a stale end: %s %s", n.Status, n.SessionID)
	}
	// s3 ends: disconnected.
	w.ended(id, "ses_3")
	pass()
	if n, _ = f.reg.Get(ctx, id); n.Status != "disconnected" {
		t.Fatalf("after s3 ended: %s", n.Status)
	}
	if last := wakes[len(wakes)-1]; !last.disconnected {
		t.Fatalf("last wake %+v, want the disconnection", last)
	}
}

func viewCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
