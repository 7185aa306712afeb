package changelog

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestRemoveOnDeletesAfterEntry: a document deleted in two steps (marked
// with RemoveOnField, its delete change in the outbox) is removed once that
// change is appended, by Record and by Recover alike, and its entry is not
// appended twice when the removal itself was interrupted (the entry in,
// the document still there).
func TestRemoveOnDeletesAfterEntry(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	l := New(st, 1, nil)
	l.TrackOutbox("things", "")
	things := st.Collection("things")
	del := func(id string) Pending {
		p, err := Prepare(Change{ActorType: "user", ActorID: "tok_1", EntityType: "thing", EntityID: id, Op: node.OpDelete})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Live: Record removes the document after appending.
	a := del("thing_a")
	if _, err := things.InsertOne(ctx, bson.M{"_id": "thing_a", OutboxField: []Pending{a}, RemoveOnField: a.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(ctx, Ref{Collection: "things", ID: "thing_a", RemoveOn: a.ID}, a); err != nil {
		t.Fatal(err)
	}
	// Interrupted: b's entry is in the log, its document was not removed.
	b := del("thing_b")
	if _, err := l.Record(ctx, Ref{}, b); err != nil {
		t.Fatal(err)
	}
	// Dead before the append: c is only in its outbox, after an earlier
	// create that is pending too.
	c0, c := prepare(t, "thing_c", 1), del("thing_c")
	if _, err := things.InsertMany(ctx, []any{
		bson.M{"_id": "thing_b", OutboxField: []Pending{b}, RemoveOnField: b.ID},
		bson.M{"_id": "thing_c", OutboxField: []Pending{c0, c}, RemoveOnField: c.ID},
	}); err != nil {
		t.Fatal(err)
	}
	n, err := New(st, 1, nil).WithLogger(nil).recoverTracked(ctx, "things")
	if err != nil || n != 2 {
		t.Fatalf("recover: %d, %v; want 2 (thing_c's create and delete)", n, err)
	}
	if left, err := things.CountDocuments(ctx, bson.M{}); err != nil || left != 0 {
		t.Fatalf("%d documents left, %v; want every removed one gone", left, err)
	}
	entries, err := New(st, 1, nil).Range(ctx, 1, 0)
	if err != nil || len(entries) != 4 {
		t.Fatalf("%d entries, %v; want 4", len(entries), err)
	}
	want := []string{"thing_a delete", "thing_b delete", "thing_c create", "thing_c delete"}
	for i, e := range entries {
		if got := e.EntityID + " " + e.Op; got != want[i] {
			t.Fatalf("entry %d is %s; want %s", i, got, want[i])
		}
	}
}

// recoverTracked is Recover on l tracking collection coll.
func (l *Log) recoverTracked(ctx context.Context, coll string) (int, error) {
	l.TrackOutbox(coll, "")
	return l.Recover(ctx)
}
