package store_test

import (
	"context"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// The materializer inserts the documents entries create (one insert command) and updates the
// others; materializing the same entries again (a replay after a crash) finds the inserted
// documents there, falls back to their updates and leaves every document as it was. An upsert of
// a document that exists already is an update.
func TestMaterializeInsertsCreatedDocumentsAndReplays(t *testing.T) {
	t.Parallel()
	st := storetest.Open(t)
	ctx := context.Background()
	if _, err := st.Collection("m_nodes").InsertOne(ctx, bson.M{"_id": "n1", "reserved": 0, "keep": "me"}); err != nil {
		t.Fatal(err)
	}
	entries := []store.PlanEntry{
		{Seq: 1, Writes: []store.PlanWrite{
			{Coll: "m_places", ID: "p1", Set: map[string]any{"node": "n1", "state.phase": "new"}, Upsert: true},
			{Coll: "m_nodes", ID: "n1", Set: map[string]any{"reserved": 1, "reservations.p1": 1}},
			{Coll: "m_nodes", ID: "n1", Set: map[string]any{"mode": "upserted"}, Upsert: true},
		}},
		{Seq: 2, Writes: []store.PlanWrite{
			{Coll: "m_places", ID: "p1", Set: map[string]any{"state.phase": "placed"}, Unset: []string{"node"}},
			{Coll: "m_places", ID: "p2", Set: map[string]any{"node": "n1"}, Upsert: true},
			{Coll: "m_places", ID: "gone", Set: map[string]any{"node": "n1"}, Upsert: true},
			{Coll: "m_places", ID: "gone", Delete: true},
		}},
	}
	want := map[string]bson.M{
		"p1": {"_id": "p1", "state": bson.M{"phase": "placed"}},
		"p2": {"_id": "p2", "node": "n1"},
		"n1": {"_id": "n1", "reserved": int32(1), "reservations": bson.M{"p1": int32(1)}, "keep": "me", "mode": "upserted"},
	}
	for round := range 2 {
		if _, err := st.MaterializePlans(ctx, entries); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for id, w := range want {
			coll := "m_places"
			if id == "n1" {
				coll = "m_nodes"
			}
			var got bson.M
			if err := store.FindByID(ctx, st.Collection(coll), id, &got); err != nil {
				t.Fatalf("round %d: %s: %v", round, id, err)
			}
			if g, e := bsonString(t, got), bsonString(t, w); g != e {
				t.Fatalf("round %d: %s = %s, want %s", round, id, g, e)
			}
		}
		if err := store.FindByID(ctx, st.Collection("m_places"), "gone", &bson.M{}); err == nil {
			t.Fatalf("round %d: a document created and deleted in the same entries exists", round)
		}
	}
}

// bsonString is m as canonical extended JSON with its keys in the order bson.M marshals them
// sorted, for comparing documents whatever their field order.
func bsonString(t *testing.T, m bson.M) string {
	t.Helper()
	raw, err := bson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := bson.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	out, err := bson.MarshalExtJSON(sortDoc(d), false, false)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func sortDoc(m map[string]any) bson.D {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := bson.D{}
	for _, k := range keys {
		v := m[k]
		switch x := v.(type) {
		case map[string]any:
			v = sortDoc(x)
		case bson.M:
			v = sortDoc(x)
		case bson.D:
			sub := map[string]any{}
			for _, e := range x {
				sub[e.Key] = e.Value
			}
			v = sortDoc(sub)
		}
		out = append(out, bson.E{Key: k, Value: v})
	}
	return out
}
