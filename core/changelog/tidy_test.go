package changelog

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// holdCleaner holds l's housekeeping back until the returned release is
// called (at the latest by the test's cleanup, which then waits for it).
func holdCleaner(t *testing.T, l *Log) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	l.cmu.Lock()
	l.cleanGateForTest = gate
	l.cmu.Unlock()
	open := false
	release = func() {
		if !open {
			open = true
			l.cmu.Lock()
			l.cleanGateForTest = nil
			l.cmu.Unlock()
			close(gate)
		}
	}
	t.Cleanup(func() { release(); cleared(t, l) })
	return release
}

// readThing returns document id of collection "things".
func readThing(t *testing.T, ctx context.Context, l *Log, id string) thing {
	t.Helper()
	var got thing
	if err := l.st.Collection("things").FindOne(ctx, bson.M{"_id": id}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestRecoverAfterDeathBeforeClear: a berthd stores its entries, tells the
// writers, and dies before its housekeeping ran (the head hint not moved,
// every outbox still holding its appended change). Record returned without
// waiting for that housekeeping. The next start's Recover appends nothing
// again: it only clears the outboxes and sets the seq field, and the head
// is found past the lagging hint.
func TestRecoverAfterDeathBeforeClear(t *testing.T) {
	st := storetest.Open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead := New(st, 1, nil)
	holdCleaner(t, dead)
	things := st.Collection("things")
	const n = 5
	for i := range n {
		id := "thing_" + string(rune('a'+i))
		p := prepare(t, id, i)
		if _, err := things.InsertOne(ctx, thing{ID: id, N: i, Outbox: []Pending{p}}); err != nil {
			t.Fatal(err)
		}
		// Bounded: Record must not wait for the held housekeeping.
		e, err := dead.Record(ctx, Ref{Collection: "things", ID: id, SeqField: "seq"}, p)
		if err != nil || e.Seq != int64(i+1) {
			t.Fatalf("record %s: seq %d, %v; want %d", id, e.Seq, err, i+1)
		}
	}
	if got := readThing(t, ctx, dead, "thing_a"); len(got.Outbox) != 1 || got.Seq != 0 {
		t.Fatalf("before the housekeeping: outbox %d, seq %d; want the change still there and no seq", len(got.Outbox), got.Seq)
	}

	// The next start: another Log over the same store.
	l := New(st, 1, nil)
	l.TrackOutbox("things", "seq")
	if got, err := l.Recover(ctx); err != nil || got != 0 {
		t.Fatalf("recover: %d appended, %v; want 0 (every change is in the log)", got, err)
	}
	entries, err := l.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := node.VerifyChain(0, "", entries); err != nil || v != n || len(entries) != n {
		t.Fatalf("chain verified %d of %d entries, %v; want %d", v, len(entries), err, n)
	}
	for i := range n {
		id := "thing_" + string(rune('a'+i))
		if got := readThing(t, ctx, l, id); len(got.Outbox) != 0 || got.Seq != int64(i+1) {
			t.Errorf("%s after recovery: outbox %d, seq %d; want empty, %d", id, len(got.Outbox), got.Seq, i+1)
		}
	}
	if seq, _, err := l.Head(ctx); err != nil || seq != n {
		t.Fatalf("head after recovery: %d, %v; want %d", seq, err, n)
	}
	e, err := l.Append(ctx, Change{EntityType: "thing", EntityID: "thing_z", Op: node.OpDelete})
	if err != nil || e.Seq != n+1 {
		t.Fatalf("append after recovery: seq %d, %v; want %d", e.Seq, err, n+1)
	}
	cleared(t, l)
}

// TestSecondWriteBeforeClear: a document is written again after its first
// change was appended but before that change was cleared from its outbox,
// by a write that read the document, then replaced it whole (as a
// compare-and-set on a revision does) after the clear ran: its outbox puts
// the first change back beside its own. Handing that outbox over appends
// only the second change, and the first is cleared again, so the outbox
// ends empty. The same through a Log that never saw the first change (the
// write handled by another berthd).
func TestSecondWriteBeforeClear(t *testing.T) {
	st := storetest.Open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	things := st.Collection("things")
	for _, other := range []bool{false, true} {
		id := "thing_same"
		if other {
			id = "thing_other"
		}
		first := New(st, 1, nil)
		release := holdCleaner(t, first)
		ref := Ref{Collection: "things", ID: id, SeqField: "seq"}
		p1 := prepare(t, id, 1)
		if _, err := things.InsertOne(ctx, thing{ID: id, N: 1, Outbox: []Pending{p1}}); err != nil {
			t.Fatal(err)
		}
		e1, err := first.Record(ctx, ref, p1)
		if err != nil {
			t.Fatal(err)
		}
		read := readThing(t, ctx, first, id) // the second write reads: p1 still pending
		release()
		cleared(t, first) // p1's clear runs between that read and the write
		p2 := prepare(t, id, 2)
		read.N, read.Outbox = 2, append(read.Outbox, p2)
		if _, err := things.ReplaceOne(ctx, bson.M{"_id": id}, read); err != nil {
			t.Fatal(err)
		}
		l := first
		if other {
			l = New(st, 1, nil)
		}
		e2, err := l.RecordOutbox(ctx, ref, read.Outbox)
		if err != nil || e2.Seq != e1.Seq+1 {
			t.Fatalf("other log %v: second write's entry %d, %v; want %d", other, e2.Seq, err, e1.Seq+1)
		}
		cleared(t, l)
		if got := readThing(t, ctx, l, id); len(got.Outbox) != 0 || got.Seq != e2.Seq {
			t.Fatalf("other log %v: outbox %d, seq %d; want empty, %d", other, len(got.Outbox), got.Seq, e2.Seq)
		}
	}
	entries, err := New(st, 1, nil).Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 4 {
		t.Fatalf("%d entries; want 4 (two per document, none twice)", len(entries))
	}
	per := map[string]int{}
	for _, e := range entries {
		per[e.EntityID+" "+string(e.Payload)]++
	}
	for k, c := range per {
		if c != 1 {
			t.Errorf("%s appended %d times", k, c)
		}
	}
}

// TestClearCoalescesPerDocument: the changes of one document appended while
// the housekeeping was busy are cleared by one update of that document (its
// whole outbox pulled, its seq field set to the newest entry), not one update
// per change; another document in the same pass gets its own one.
func TestClearCoalescesPerDocument(t *testing.T) {
	st := storetest.Open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := New(st, 1, nil)
	release := holdCleaner(t, l)
	things := st.Collection("things")
	const n = 6
	var outbox []Pending
	for i := range n {
		outbox = append(outbox, prepare(t, "thing_hot", i))
	}
	other := prepare(t, "thing_cold", 0)
	if _, err := things.InsertOne(ctx, thing{ID: "thing_hot", Outbox: outbox}); err != nil {
		t.Fatal(err)
	}
	if _, err := things.InsertOne(ctx, thing{ID: "thing_cold", Outbox: []Pending{other}}); err != nil {
		t.Fatal(err)
	}
	var last int64
	for _, p := range outbox {
		e, err := l.Record(ctx, Ref{Collection: "things", ID: "thing_hot", SeqField: "seq"}, p)
		if err != nil {
			t.Fatal(err)
		}
		last = e.Seq
	}
	if _, err := l.Record(ctx, Ref{Collection: "things", ID: "thing_cold", SeqField: "seq"}, other); err != nil {
		t.Fatal(err)
	}
	// What the held pass will write: one model per document.
	l.cmu.Lock()
	var all []clear
	for _, c := range l.chores {
		all = append(all, c.clears...)
	}
	l.cmu.Unlock()
	// (The held pass took the first batch's chore before it stopped at the
	// gate; the others queued behind it and go in the next pass.)
	if g := groupClears(all); len(all) < n || len(g) != 2 || len(g[0]) != len(all)-1 || len(g[1]) != 1 {
		t.Fatalf("%d queued clears grouped as %d documents; want one group of %d for the hot document and one for the cold", len(all), len(g), len(all)-1)
	}
	release()
	cleared(t, l)
	if got := readThing(t, ctx, l, "thing_hot"); len(got.Outbox) != 0 || got.Seq != last {
		t.Fatalf("hot document after the pass: outbox %d, seq %d; want empty and %d", len(got.Outbox), got.Seq, last)
	}
	if got := readThing(t, ctx, l, "thing_cold"); len(got.Outbox) != 0 || got.Seq == 0 {
		t.Fatalf("cold document after the pass: outbox %d, seq %d", len(got.Outbox), got.Seq)
	}
}
