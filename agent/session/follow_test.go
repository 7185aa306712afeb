package session

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
)

// chain builds n consecutive, correctly hashed entries after (seq, hash).
func chain(t *testing.T, seq int64, hash string, n int, tag string) []node.LogEntry {
	t.Helper()
	if hash == "" {
		hash = node.ZeroHash
	}
	out := make([]node.LogEntry, 0, n)
	for i := range n {
		e := node.LogEntry{Seq: seq + 1, Term: 1, Time: time.Unix(1700000000+int64(i), 0).UTC(), ActorType: "token", ActorID: "tok_1",
			EntityType: "service", EntityID: "svc_" + tag, Op: node.OpUpdate, Payload: json.RawMessage(`{"n":` + string(rune('0'+i%10)) + `}`), PrevHash: hash}
		h, err := e.ComputeHash()
		if err != nil {
			t.Fatal(err)
		}
		e.Hash = h
		out = append(out, e)
		seq, hash = e.Seq, h
	}
	return out
}

func TestLogFollowVerifiesStoresAndAcks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, func(c *Config) { c.Log = c.Store.(*localstore.Store) })
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)

	entries := chain(t, 0, "", 3, "a")
	c.send(ctx, node.TypeLogEntries, "msg_log1", node.LogEntries{FromSeq: 1, Entries: entries})
	env := c.await(ctx, node.TypeLogAck)
	var ack node.LogAck
	_ = json.Unmarshal(env.Body, &ack)
	if ack.Seq != 3 || ack.Hash != entries[2].Hash || env.Re != "msg_log1" {
		t.Fatalf("ack %+v re %q, want seq 3 hash of entry 3", ack, env.Re)
	}
	if seq, hash, _ := a.store.LogHead(ctx); seq != 3 || hash != entries[2].Hash {
		t.Fatalf("stored head %d %s", seq, hash)
	}

	// A batch with a broken link: the good prefix is stored and acked, the
	// rest refused with a non-fatal bad_message.
	more := chain(t, 3, entries[2].Hash, 3, "b")
	more[2].PrevHash = node.ZeroHash
	c.send(ctx, node.TypeLogEntries, "msg_log2", node.LogEntries{FromSeq: 4, Entries: more})
	env = c.await(ctx, node.TypeLogAck)
	_ = json.Unmarshal(env.Body, &ack)
	if ack.Seq != 5 {
		t.Fatalf("ack after a broken link %+v, want 5", ack)
	}
	env = c.await(ctx, node.TypeError)
	var eb node.ErrorBody
	_ = json.Unmarshal(env.Body, &eb)
	if eb.Code != "bad_message" || eb.Fatal {
		t.Fatalf("error %+v, want non-fatal bad_message", eb)
	}

	// log_diverged: the copy is moved aside, never deleted, and entries
	// from seq 1 of another chain are accepted.
	c.send(ctx, node.TypeError, "msg_div", node.ErrorBody{Code: "log_diverged", Message: "x", Fatal: false})
	other := chain(t, 0, "", 2, "c")
	c.send(ctx, node.TypeLogEntries, "msg_log3", node.LogEntries{FromSeq: 1, Entries: other})
	env = c.await(ctx, node.TypeLogAck)
	_ = json.Unmarshal(env.Body, &ack)
	if ack.Seq != 2 || ack.Hash != other[1].Hash {
		t.Fatalf("ack after refollow %+v", ack)
	}
	kept, err := a.store.QuarantinedLogs(ctx)
	if err != nil || len(kept) != 1 {
		t.Fatalf("quarantined copies %v %v, want one", kept, err)
	}
	select {
	case err := <-a.done:
		t.Fatalf("session stopped on log_diverged: %v", err)
	default:
	}
}
