package changelog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// thing is a document of a test collection that records its changes in an
// outbox, as services and policy decisions do.
type thing struct {
	ID     string    `bson:"_id"`
	N      int       `bson:"n"`
	Seq    int64     `bson:"seq,omitempty"`
	Outbox []Pending `bson:"log_outbox,omitempty"`
}

// cleared waits, bounded, for l's housekeeping of what it stored so far:
// outboxes are cleared after the waiters of a batch are told.
func cleared(t *testing.T, l *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Cleared(ctx); err != nil {
		t.Fatal(err)
	}
}

func prepare(t *testing.T, id string, n int) Pending {
	t.Helper()
	p, err := Prepare(Change{ActorType: "user", ActorID: "tok_1", EntityType: "thing", EntityID: id, Op: node.OpCreate, Payload: map[string]any{"n": n}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConcurrentWritersEveryChangeOnce: 64 writers, half of them through a
// second Log over the same store (a second berthd replica), each record a
// change; every one gets exactly one entry and the chain verifies. The first
// Log appends from its Run goroutine, the second from its callers in turn.
// Before changes were queued, writers raced for each seq and gave up with
// ErrContention.
func TestConcurrentWritersEveryChangeOnce(t *testing.T) {
	st := storetest.Open(t)
	logs := []*Log{New(st, 1, nil), New(st, 1, nil)}
	ctx := context.Background()
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); logs[0].Run(rctx) }()
	defer func() { stop(); <-ran }()
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	ids := make([]string, n)
	for i := range n {
		p := prepare(t, fmt.Sprintf("thing_%d", i), i)
		ids[i] = p.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := logs[i%2].Record(ctx, Ref{}, p)
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
	entries, err := New(st, 1, nil).Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != n || len(entries) != n {
		t.Fatalf("chain verified %d of %d entries (want %d): %v", got, len(entries), n, err)
	}
	per := map[string]int{}
	for _, e := range entries {
		per[e.EntityID]++
	}
	for i := range n {
		if c := per[fmt.Sprintf("thing_%d", i)]; c != 1 {
			t.Errorf("thing_%d has %d entries, want 1", i, c)
		}
	}
	var docs []doc
	cur, err := st.Collection(Collection).Find(ctx, bson.M{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range docs {
		seen[d.ChangeID] = true
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("change %s has no entry", id)
		}
	}
}

// TestRecordOutlivesCallerContext: a change whose caller's context is
// already over (a client that went away) is still appended and cleared from
// its outbox. Before, the append ran on the caller's context and failed.
func TestRecordOutlivesCallerContext(t *testing.T) {
	st := storetest.Open(t)
	l := New(st, 1, nil)
	l.TrackOutbox("things", "seq")
	bg := context.Background()
	p := prepare(t, "thing_1", 1)
	if _, err := st.Collection("things").InsertOne(bg, thing{ID: "thing_1", N: 1, Outbox: []Pending{p}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if e, err := l.Record(ctx, Ref{Collection: "things", ID: "thing_1", SeqField: "seq"}, p); err != nil || e.Seq != 1 {
		t.Fatalf("record on a cancelled context: seq %d, %v; want 1 (appended on its own context)", e.Seq, err)
	}
	entries, err := l.Range(bg, 1, 0)
	if err != nil || len(entries) != 1 || entries[0].EntityID != "thing_1" {
		t.Fatalf("entries %+v, %v; want the one change", entries, err)
	}
	cleared(t, l)
	var got thing
	if err := st.Collection("things").FindOne(bg, bson.M{"_id": "thing_1"}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Outbox) != 0 || got.Seq != 1 {
		t.Fatalf("document after append: outbox %d, seq %d; want empty and 1", len(got.Outbox), got.Seq)
	}
}

// TestRecoverAppendsLeftoversOnce: a berthd died after writing documents
// with pending changes, one of which it had appended but not cleared.
// Recover appends each other change once (in creation order), clears every
// outbox and sets the seq field; a second Recover appends nothing.
func TestRecoverAppendsLeftoversOnce(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	first := New(st, 1, nil)
	a, b, c := prepare(t, "thing_a", 1), prepare(t, "thing_b", 2), prepare(t, "thing_c", 3)
	// a was appended by the dead berthd, but its outbox was not cleared.
	ea, err := first.Record(ctx, Ref{}, a)
	if err != nil {
		t.Fatal(err)
	}
	things := st.Collection("things")
	if _, err := things.InsertMany(ctx, []any{
		thing{ID: "thing_a", N: 1, Outbox: []Pending{a}},
		thing{ID: "thing_bc", N: 2, Outbox: []Pending{b, c}},
		thing{ID: "thing_none", N: 4},
	}); err != nil {
		t.Fatal(err)
	}
	l := New(st, 1, nil)
	l.TrackOutbox("things", "seq")
	// Changes younger than the age asked for may still be in another
	// replica's queue: none is taken.
	if n, err := l.RecoverOlderThan(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("recover of changes older than an hour: %d, %v; want 0", n, err)
	}
	n, err := l.Recover(ctx)
	if err != nil || n != 2 {
		t.Fatalf("recover: %d appended, %v; want 2", n, err)
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := node.VerifyChain(0, "", entries); err != nil || got != 3 || len(entries) != 3 {
		t.Fatalf("chain verified %d of %d, want 3: %v", got, len(entries), err)
	}
	if entries[0].Hash != ea.Hash || entries[1].EntityID != "thing_b" || entries[2].EntityID != "thing_c" {
		t.Fatalf("entries %s %s %s; want thing_a, thing_b, thing_c", entries[0].EntityID, entries[1].EntityID, entries[2].EntityID)
	}
	var docs []thing
	cur, err := things.Find(ctx, bson.M{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"thing_a": 1, "thing_bc": 3, "thing_none": 0}
	for _, d := range docs {
		if len(d.Outbox) != 0 || d.Seq != want[d.ID] {
			t.Errorf("%s: outbox %d, seq %d; want empty, %d", d.ID, len(d.Outbox), d.Seq, want[d.ID])
		}
	}
	if n, err := New(st, 1, nil).WithLogger(nil).Recover(ctx); err != nil || n != 0 {
		t.Fatalf("second recover: %d, %v; want 0", n, err)
	}
}

// TestPrepareRefusesOversizedEntry: a change whose entry would not fit in one
// log_entries frame is refused with ErrEntryTooLarge; the largest that is
// accepted fits in a frame with its envelope.
func TestPrepareRefusesOversizedEntry(t *testing.T) {
	ch := func(n int) Change {
		return Change{ActorType: "user", ActorID: "tok_1", EntityType: "service", EntityID: "svc_1", Op: node.OpUpdate,
			Payload: map[string]string{"v": strings.Repeat("<", n)}} // '<' encodes as \u003c: six bytes each
	}
	if _, err := Prepare(ch(node.MaxMessageBytes / 6)); !errors.Is(err, ErrEntryTooLarge) {
		t.Fatalf("prepare of an entry over the frame limit: %v, want ErrEntryTooLarge", err)
	}
	// Find the largest accepted payload and check its frame.
	lo, hi := 0, node.MaxMessageBytes/6
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if _, err := Prepare(ch(mid)); err == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	p, err := Prepare(ch(lo))
	if err != nil {
		t.Fatal(err)
	}
	l := New(storetest.Open(t), 1, nil)
	e, err := l.Record(context.Background(), Ref{}, p)
	if err != nil {
		t.Fatal(err)
	}
	if size := frameSize(t, []node.LogEntry{e}); size > node.MaxMessageBytes {
		t.Fatalf("largest accepted entry makes a %d-byte frame, limit %d", size, node.MaxMessageBytes)
	}
}

// frameSize is the size of the log_entries frame the node session sends for
// entries (core/session: an envelope with a msg_ id around LogEntries).
func frameSize(t *testing.T, entries []node.LogEntry) int {
	t.Helper()
	body, err := json.Marshal(node.LogEntries{FromSeq: entries[0].Seq, Entries: entries})
	if err != nil {
		t.Fatal(err)
	}
	frame, err := json.Marshal(node.Envelope{V: node.Version, Type: node.TypeLogEntries, ID: "msg_" + strings.Repeat("Z", 26), Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return len(frame)
}

// TestRecordTwiceOneEntry: recording the same change again (a handler that
// hands over a change twice, or recovery meeting a change this Log just
// appended) returns its one entry instead of appending a second.
func TestRecordTwiceOneEntry(t *testing.T) {
	l := New(storetest.Open(t), 1, nil)
	ctx := context.Background()
	p := prepare(t, "thing_1", 1)
	first, err := l.Record(ctx, Ref{}, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Record(ctx, Ref{}, p)
	if err != nil || again.Seq != first.Seq || again.Hash != first.Hash {
		t.Fatalf("second record: seq %d, %v; want the first entry %d", again.Seq, err, first.Seq)
	}
	if entries, err := l.Range(ctx, 1, 0); err != nil || len(entries) != 1 {
		t.Fatalf("%d entries, %v; want 1", len(entries), err)
	}
}

// TestRecordOutboxKeepsWriteOrder: a document's outbox holds the change of
// an earlier write whose handler has not handed it over yet, then the
// change of the latest write. Handing over the latest appends the earlier
// first, so the document's entries follow the order of its writes; one
// already in the log (appended through another Log) is only cleared; the
// late handler then gets the entry already appended.
func TestRecordOutboxKeepsWriteOrder(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	done, x, y := prepare(t, "thing_1", 1), prepare(t, "thing_1", 2), prepare(t, "thing_1", 3)
	if _, err := New(st, 1, nil).Record(ctx, Ref{}, done); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collection("things").InsertOne(ctx, thing{ID: "thing_1", N: 3, Outbox: []Pending{done, x, y}}); err != nil {
		t.Fatal(err)
	}
	l := New(st, 1, nil)
	ref := Ref{Collection: "things", ID: "thing_1", SeqField: "seq"}
	ey, err := l.RecordOutbox(ctx, ref, []Pending{done, x, y})
	if err != nil || ey.Seq != 3 {
		t.Fatalf("record outbox: seq %d, %v; want 3", ey.Seq, err)
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range entries {
		order = append(order, string(e.Payload))
	}
	if fmt.Sprint(order) != `[{"n":1} {"n":2} {"n":3}]` {
		t.Fatalf("entries %v, want n 1, 2, 3 once each", order)
	}
	if ex, err := l.Record(ctx, ref, x); err != nil || ex.Seq != 2 {
		t.Fatalf("late hand-over of the earlier change: seq %d, %v; want 2", ex.Seq, err)
	}
	cleared(t, l)
	var got thing
	if err := st.Collection("things").FindOne(ctx, bson.M{"_id": "thing_1"}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Outbox) != 0 || got.Seq != 3 {
		t.Fatalf("document: outbox %d, seq %d; want empty, 3", len(got.Outbox), got.Seq)
	}
	if entries, _ := l.Range(ctx, 1, 0); len(entries) != 3 {
		t.Fatalf("%d entries after the late hand-over, want 3", len(entries))
	}
}

// TestRecordOutboxOfUnchangedWrite: a write that changed nothing may hand
// over the outbox as it found it, whose last change is old and already in
// the log (appended by another Log, not cleared): it is cleared, not
// appended again.
func TestRecordOutboxOfUnchangedWrite(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	old := prepare(t, "thing_1", 1)
	old.At = old.At.Add(-time.Minute)
	if _, err := New(st, 1, nil).Record(ctx, Ref{}, old); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collection("things").InsertOne(ctx, thing{ID: "thing_1", N: 1, Outbox: []Pending{old}}); err != nil {
		t.Fatal(err)
	}
	l := New(st, 1, nil)
	if _, err := l.RecordOutbox(ctx, Ref{Collection: "things", ID: "thing_1"}, []Pending{old}); err != nil {
		t.Fatal(err)
	}
	if entries, err := l.Range(ctx, 1, 0); err != nil || len(entries) != 1 {
		t.Fatalf("%d entries, %v; want the one", len(entries), err)
	}
	cleared(t, l)
	var got thing
	if err := st.Collection("things").FindOne(ctx, bson.M{"_id": "thing_1"}).Decode(&got); err != nil || len(got.Outbox) != 0 {
		t.Fatalf("outbox %d, %v; want cleared", len(got.Outbox), err)
	}
}
