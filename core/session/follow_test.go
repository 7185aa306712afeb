package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
)

func (f *fixture) appendN(t *testing.T, n int) []node.LogEntry {
	t.Helper()
	out := make([]node.LogEntry, 0, n)
	for i := range n {
		e, err := f.clog.Append(context.Background(), changelog.Change{ActorType: "token", ActorID: "tok_t",
			EntityType: "project", EntityID: "prj_" + string(rune('a'+i%26)), Op: node.OpCreate, Payload: map[string]int{"i": i}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// awaitLog skips messages until log_entries and checks it verifies after (seq, hash).
func (p *peer) awaitLog(seq int64, hash string) node.LogEntries {
	p.t.Helper()
	for {
		env := p.next()
		if env.Type != node.TypeLogEntries {
			continue
		}
		var b node.LogEntries
		if err := json.Unmarshal(env.Body, &b); err != nil {
			p.t.Fatal(err)
		}
		if b.FromSeq != seq+1 {
			p.t.Fatalf("log_entries from %d, want %d", b.FromSeq, seq+1)
		}
		if n, err := node.VerifyChain(seq, hash, b.Entries); err != nil || n != len(b.Entries) || n == 0 || n > node.MaxLogBatch {
			p.t.Fatalf("batch of %d does not verify after %d: %d %v", len(b.Entries), seq, n, err)
		}
		return b
	}
}

func TestLogFollowAfterDesiredState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	first := f.appendN(t, 3)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	b := p.awaitLog(0, "")
	if len(b.Entries) != 3 {
		t.Fatalf("first batch %d entries, want 3", len(b.Entries))
	}
	// While the batch is unacknowledged nothing more is sent; acks that skip
	// past the batch, or carry another hash, are ignored.
	f.appendN(t, 1)
	p.send(1, node.TypeLogAck, node.LogAck{Seq: 4, Hash: first[2].Hash})
	p.send(1, node.TypeLogAck, node.LogAck{Seq: 3, Hash: node.ZeroHash})
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("got %s before the batch was acknowledged, want pong", env.Type)
	}
	p.send(1, node.TypeLogAck, node.LogAck{Seq: 3, Hash: first[2].Hash})
	b = p.awaitLog(3, first[2].Hash)
	if len(b.Entries) != 1 {
		t.Fatalf("second batch %d entries, want 1", len(b.Entries))
	}
	if seq, ok := f.srv.Config.Handler.(*Server).LogPosition(f.node.ID); !ok || seq != 3 {
		t.Fatalf("log position %d %v, want 3", seq, ok)
	}
	// An append after the ack is pushed at once.
	p.send(1, node.TypeLogAck, node.LogAck{Seq: 4, Hash: b.Entries[0].Hash})
	fifth := f.appendN(t, 1)
	b = p.awaitLog(4, b.Entries[0].Hash)
	if b.Entries[0].Hash != fifth[0].Hash {
		t.Fatalf("pushed entry %+v", b.Entries[0])
	}
}

func TestLogFollowResumesAndDiverges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	es := f.appendN(t, 3)
	t.Run("matching position resumes after it", func(t *testing.T) {
		p, _, err := f.dial(t, f.cred)
		if err != nil {
			t.Fatal(err)
		}
		p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, LogSeq: 2, LogHash: es[1].Hash})
		b := p.awaitLog(2, es[1].Hash)
		if len(b.Entries) != 1 {
			t.Fatalf("resumed with %d entries, want 1", len(b.Entries))
		}
	})
	for name, h := range map[string]node.Hello{
		"other hash":      {NodeID: f.node.ID, LogSeq: 2, LogHash: es[0].Hash},
		"beyond the head": {NodeID: f.node.ID, LogSeq: 9, LogHash: es[2].Hash},
	} {
		t.Run(name, func(t *testing.T) {
			p, _, err := f.dial(t, f.cred)
			if err != nil {
				t.Fatal(err)
			}
			p.send(1, node.TypeHello, h)
			var order []node.Type
			for len(order) < 3 {
				env := p.next()
				order = append(order, env.Type)
				if env.Type == node.TypeError {
					var e node.ErrorBody
					_ = json.Unmarshal(env.Body, &e)
					if e.Code != "log_diverged" || e.Fatal || env.Re != "msg_test" {
						t.Fatalf("error %+v re %q, want non-fatal log_diverged answering hello", e, env.Re)
					}
				}
			}
			if order[0] != node.TypeWelcome || order[1] != node.TypeDesiredState || order[2] != node.TypeError {
				t.Fatalf("order %v, want welcome, desired_state, error", order)
			}
			b := p.awaitLog(0, "")
			if len(b.Entries) != 3 {
				t.Fatalf("refollow with %d entries, want 3", len(b.Entries))
			}
		})
	}
}

func TestLogFollowBatchesOf500(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// 502 appends through the log take over a minute on the embedded store,
	// so the entries are written in one batch, in the log's own document
	// shape (core/changelog: _id seq, hash, body the entry's exact JSON).
	docs := make([]any, 0, node.MaxLogBatch+2)
	prev := node.ZeroHash
	for i := range node.MaxLogBatch + 2 {
		e := node.LogEntry{Seq: int64(i + 1), Term: 1, Time: time.Unix(1700000000, 0).UTC(), ActorType: "token", ActorID: "tok_t",
			EntityType: "project", EntityID: "prj_x", Op: node.OpCreate, Payload: json.RawMessage(`{}`), PrevHash: prev}
		h, err := e.ComputeHash()
		if err != nil {
			t.Fatal(err)
		}
		e.Hash, prev = h, h
		body, _ := json.Marshal(e)
		docs = append(docs, bson.M{"_id": e.Seq, "hash": h, "body": string(body)})
	}
	if _, err := f.st.Collection(changelog.Collection).InsertMany(context.Background(), docs); err != nil {
		t.Fatal(err)
	}
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	b := p.awaitLog(0, "")
	if len(b.Entries) != node.MaxLogBatch {
		t.Fatalf("first batch %d, want %d", len(b.Entries), node.MaxLogBatch)
	}
	last := b.Entries[len(b.Entries)-1]
	p.send(1, node.TypeLogAck, node.LogAck{Seq: last.Seq, Hash: last.Hash})
	if b = p.awaitLog(last.Seq, last.Hash); len(b.Entries) != 2 {
		t.Fatalf("second batch %d, want 2", len(b.Entries))
	}
}

func TestRemovedNodeGetsFatalNodeRemoved(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	ctx := context.Background()
	if _, changed, err := f.reg.Remove(ctx, f.node.ID); err != nil || !changed {
		t.Fatalf("remove: %v %v", changed, err)
	}
	f.srv.Config.Handler.(*Server).Remove(ctx, f.node.ID)
	for {
		env := p.next()
		if env.Type == node.TypeError {
			var e node.ErrorBody
			_ = json.Unmarshal(env.Body, &e)
			if e.Code != "node_removed" || !e.Fatal {
				t.Fatalf("error %+v, want fatal node_removed", e)
			}
			break
		}
	}
	// A redial with the old credential is told the same, answering its hello.
	again, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatalf("redial of a removed node refused before the upgrade: %v", err)
	}
	again.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID})
	env := again.next()
	var e node.ErrorBody
	_ = json.Unmarshal(env.Body, &e)
	if env.Type != node.TypeError || e.Code != "node_removed" || !e.Fatal || env.Re != "msg_test" {
		t.Fatalf("redial got %s %+v, want fatal node_removed", env.Type, e)
	}
	n, _ := f.reg.Get(ctx, f.node.ID)
	if n.Status != "removed" {
		t.Fatalf("status %s", n.Status)
	}
	if _, err := f.reg.Authenticate(ctx, f.cred); err == nil {
		t.Fatal("a removed node still authenticates")
	}
}

// TestLogFollowCutsBatchesToTheFrameLimit: entries that are legal one by one
// (each under changelog.MaxEntryBytes) but together larger than a frame go
// out in several log_entries frames, each within node.MaxMessageBytes, and
// all of them reach the node. Before batches were cut by size, the three
// went out as one frame over the limit, which every agent refused.
func TestLogFollowCutsBatchesToTheFrameLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 3
	big := strings.Repeat("<", changelog.MaxEntryBytes/6-200) // '<' encodes as six bytes
	for i := range n {
		if _, err := f.clog.Append(context.Background(), changelog.Change{ActorType: "token", ActorID: "tok_t",
			EntityType: "service", EntityID: fmt.Sprintf("svc_%d", i), Op: node.OpCreate, Payload: map[string]string{"env": big}}); err != nil {
			t.Fatal(err)
		}
	}
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	var seq int64
	var hash string
	for frames := 0; seq < n; frames++ {
		if frames == n+2 {
			t.Fatalf("%d frames delivered only %d entries", frames, seq)
		}
		ctx, cancel := context.WithTimeout(context.Background(), peerReadBound)
		_, raw, err := p.ws.Read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var env node.Envelope
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatal(err)
		}
		if env.Type != node.TypeLogEntries {
			continue
		}
		if len(raw) > node.MaxMessageBytes {
			t.Fatalf("log_entries frame of %d bytes, limit %d", len(raw), node.MaxMessageBytes)
		}
		var b node.LogEntries
		if err := json.Unmarshal(env.Body, &b); err != nil {
			t.Fatal(err)
		}
		if got, err := node.VerifyChain(seq, hash, b.Entries); err != nil || got != len(b.Entries) || got == 0 {
			t.Fatalf("batch after %d: verified %d of %d: %v", seq, got, len(b.Entries), err)
		}
		last := b.Entries[len(b.Entries)-1]
		seq, hash = last.Seq, last.Hash
		p.send(1, node.TypeLogAck, node.LogAck{Seq: seq, Hash: hash})
	}
}

// TestLogFollowCoalescesBursts: a follower at the head is not sent each
// append of a burst as a batch of its own to acknowledge: what is appended
// within the follow delay reaches it as one log_entries batch (one ack), and
// a follower with a batch in flight is sent nothing more until it acks.
func TestLogFollowCoalescesBursts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *Config) { c.LogFollowDelay = 5 * time.Second })
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	const burst = 5
	got := f.appendN(t, burst) // each Append returns once its entry is stored
	b := p.awaitLog(0, "")
	if len(b.Entries) != burst {
		t.Fatalf("the burst of %d appends came as a batch of %d; want one batch of all", burst, len(b.Entries))
	}
	// Nothing more was sent: the next message answers a ping.
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("got %s after the one batch, want pong", env.Type)
	}
	p.send(1, node.TypeLogAck, node.LogAck{Seq: got[burst-1].Seq, Hash: got[burst-1].Hash})
	if seq, ok := f.srv.Config.Handler.(*Server).LogPosition(f.node.ID); !ok || seq != got[burst-1].Seq {
		// The ack is handled on the session's reader; LogPosition may lag it by a frame.
		p.send(1, node.TypePing, struct{}{})
		if env := p.next(); env.Type != node.TypePong {
			t.Fatalf("got %s, want pong", env.Type)
		}
		if seq, ok := f.srv.Config.Handler.(*Server).LogPosition(f.node.ID); !ok || seq != got[burst-1].Seq {
			t.Fatalf("log position %d after the ack, want %d", seq, got[burst-1].Seq)
		}
	}
}
