package store

// The plan log (docs/store.md section 2.3): the store side of core/plans. An applier writes the
// decisions of many plans as one inserted document whose _id is the next sequence number, so a
// batch costs one insert (one SQLite transaction on the embedded store) however many documents
// it changes; a materializer writes the per-entity documents behind it later, in bulk.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// PlansCollection holds the plan log: one [PlanEntry] per committed batch, _id its sequence
// number. Entries up to the last materialized one are pruned, the last of them kept so the
// highest sequence number survives.
const PlansCollection = "plans"

// planMarkID is the _id, in [SequencesCollection], of the document {value: n} that records the
// last plan entry whose writes are all in their documents.
const planMarkID = "plans.materialized"

// ErrPlanSeqTaken is returned (wrapped) by [Store.AppendPlan] when an entry with that sequence
// number exists already: another applier wrote it, so the caller has been deposed.
var ErrPlanSeqTaken = errors.New("berth: plan sequence number already written by another applier")

// PlanWrite is one decided change of one document: its fields in Set (dotted paths allowed, values
// absolute, never increments) and Unset, applied to the document {_id: ID} of collection Coll.
// A write is idempotent: applying it to a document that has it already changes nothing, which is
// what lets the view lay it over a document the materializer may or may not have written yet.
// Upsert creates the document ({_id: ID} plus Set) when it is absent; without it a write to an
// absent document does nothing. Delete removes the document (Set and Unset are ignored).
type PlanWrite struct {
	Coll   string
	ID     string
	Set    map[string]any
	Unset  []string
	Upsert bool
	Delete bool
}

// PlanEntry is one document of [PlansCollection]: the accepted decisions of one batch of plans.
type PlanEntry struct {
	// Seq is the entry's sequence number and _id: one more than the entry before it.
	Seq int64
	// Applier names the applier that wrote it (a random id per applier start).
	Applier string
	// At is when the applier wrote it.
	At time.Time
	// Plans is how many plans the entry holds.
	Plans int
	// Writes are the entry's writes in the order they were decided.
	Writes []PlanWrite
}

// AppendPlan inserts e as one document, a compare-and-append on e.Seq: it fails, wrapping
// [ErrPlanSeqTaken], when an entry with that sequence number exists, on FerretDB and MongoDB
// alike. With the store's write concern (full sync on the embedded store, majority on a replica
// set) a nil error means the entry is durable. Any other error leaves the outcome unknown: the
// caller reads the entry back ([Store.PlanEntry]) before it answers anyone.
func (s *Store) AppendPlan(ctx context.Context, e PlanEntry) error {
	if _, err := s.Collection(PlansCollection).InsertOne(ctx, storedEntry(e)); err != nil {
		if IsDuplicateKey(err) {
			return fmt.Errorf("store: append plan %d: %w", e.Seq, ErrPlanSeqTaken)
		}
		return fmt.Errorf("store: append plan %d: %w", e.Seq, err)
	}
	return nil
}

// PlanEntry reads the entry with sequence number seq. Errors: wrapping [ErrNotFound].
func (s *Store) PlanEntry(ctx context.Context, seq int64) (*PlanEntry, error) {
	var e planEntryDoc
	if err := FindByID(ctx, s.Collection(PlansCollection), seq, &e); err != nil {
		return nil, err
	}
	out := e.entry()
	return &out, nil
}

// PlansAfter returns every entry whose sequence number is above seq, in order.
func (s *Store) PlansAfter(ctx context.Context, seq int64) ([]PlanEntry, error) {
	coll := s.Collection(PlansCollection)
	cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: seq}}}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("store: read plans after %d: %w", seq, err)
	}
	defer closeCursor(ctx, cur)
	var docs []planEntryDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("store: read plans after %d: %w", seq, err)
	}
	out := make([]PlanEntry, len(docs))
	for i := range docs {
		out[i] = docs[i].entry()
	}
	return out, nil
}

// planEntryDoc is a [PlanEntry] as stored: a field name may not hold a dot, so each write's Set
// is a list of path and value pairs.
type planEntryDoc struct {
	Seq     int64          `bson:"_id"`
	Applier string         `bson:"applier"`
	At      time.Time      `bson:"at"`
	Plans   int            `bson:"plans"`
	Writes  []planWriteDoc `bson:"writes"`
}

type planWriteDoc struct {
	Coll   string      `bson:"coll"`
	ID     string      `bson:"id"`
	Set    []planField `bson:"set,omitempty"`
	Unset  []string    `bson:"unset,omitempty"`
	Upsert bool        `bson:"upsert,omitempty"`
	Delete bool        `bson:"delete,omitempty"`
}

type planField struct {
	Path  string `bson:"p"`
	Value any    `bson:"v"`
}

func storedEntry(e PlanEntry) planEntryDoc {
	d := planEntryDoc{Seq: e.Seq, Applier: e.Applier, At: e.At, Plans: e.Plans, Writes: make([]planWriteDoc, len(e.Writes))}
	for i, w := range e.Writes {
		wd := planWriteDoc{Coll: w.Coll, ID: w.ID, Unset: w.Unset, Upsert: w.Upsert, Delete: w.Delete}
		for _, k := range slices.Sorted(mapKeys(w.Set)) {
			wd.Set = append(wd.Set, planField{Path: k, Value: w.Set[k]})
		}
		d.Writes[i] = wd
	}
	return d
}

func (d planEntryDoc) entry() PlanEntry {
	e := PlanEntry{Seq: d.Seq, Applier: d.Applier, At: d.At, Plans: d.Plans, Writes: make([]PlanWrite, len(d.Writes))}
	for i, wd := range d.Writes {
		w := PlanWrite{Coll: wd.Coll, ID: wd.ID, Unset: wd.Unset, Upsert: wd.Upsert, Delete: wd.Delete}
		if len(wd.Set) > 0 {
			w.Set = make(map[string]any, len(wd.Set))
			for _, f := range wd.Set {
				w.Set[f.Path] = f.Value
			}
		}
		e.Writes[i] = w
	}
	return e
}

// MaterializedPlan returns the sequence number of the last entry whose writes are all in their
// documents (0 when none is).
func (s *Store) MaterializedPlan(ctx context.Context) (int64, error) {
	var doc struct {
		Value int64 `bson:"value"`
	}
	err := FindByID(ctx, s.Collection(SequencesCollection), planMarkID, &doc)
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: read the materialized plan: %w", err)
	}
	return doc.Value, nil
}

// MaterializePlans writes the documents of entries (consecutive, in order) in bulk: the writes
// of one document are merged into as few updates as their paths allow, each collection's writes
// go as one ordered bulk write, and then the last entry's sequence number is recorded as
// materialized and the entries before it are pruned. Running it again over entries already
// materialized changes nothing (every write is idempotent), so a crash anywhere in it is repaired
// by replaying the entries after the recorded mark. It returns how many update, upsert and delete
// statements it sent.
func (s *Store) MaterializePlans(ctx context.Context, entries []PlanEntry) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	models := map[string][]mongo.WriteModel{}
	var colls []string
	for _, m := range mergeWrites(entries) {
		if _, ok := models[m.Coll]; !ok {
			colls = append(colls, m.Coll)
		}
		models[m.Coll] = append(models[m.Coll], writeModel(m))
	}
	sent := 0
	for _, c := range colls {
		if _, err := s.Collection(c).BulkWrite(ctx, models[c], options.BulkWrite().SetOrdered(true)); err != nil {
			return sent, fmt.Errorf("store: materialize plans %d-%d into %s: %w", entries[0].Seq, entries[len(entries)-1].Seq, c, err)
		}
		sent += len(models[c])
	}
	last := entries[len(entries)-1].Seq
	if _, err := s.Collection(SequencesCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: planMarkID}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: last}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
		return sent, fmt.Errorf("store: record plan %d as materialized: %w", last, err)
	}
	if _, err := s.Collection(PlansCollection).DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$lt", Value: last}}}}); err != nil {
		return sent, fmt.Errorf("store: prune plans before %d: %w", last, err)
	}
	return sent, nil
}

// LastPlan returns the highest sequence number written to the plan log (0 for an empty log).
func (s *Store) LastPlan(ctx context.Context) (int64, error) {
	var doc struct {
		Seq int64 `bson:"_id"`
	}
	err := s.Collection(PlansCollection).FindOne(ctx, bson.D{}, options.FindOne().SetSort(bson.D{{Key: "_id", Value: -1}}).SetProjection(bson.D{{Key: "_id", Value: 1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return s.MaterializedPlan(ctx)
	}
	if err != nil {
		return 0, fmt.Errorf("store: read the last plan: %w", err)
	}
	return doc.Seq, nil
}

// mergeWrites returns the writes of entries in order, consecutive writes of one document merged
// into one where their paths do not overlap (a later Set or Unset of a path replaces an earlier
// one of the same path; a path that is a prefix of another starts a new write).
func mergeWrites(entries []PlanEntry) []PlanWrite {
	var out []PlanWrite
	last := map[string]int{} // coll/id -> index in out of its open write
	for _, e := range entries {
		for _, w := range e.Writes {
			key := w.Coll + "\x00" + w.ID
			i, open := last[key]
			if open && !w.Delete && !out[i].Delete && !overlaps(out[i], w) {
				m := &out[i]
				if m.Set == nil && len(w.Set) > 0 {
					m.Set = map[string]any{}
				}
				for k, v := range w.Set {
					m.Set[k] = v
					m.Unset = slices.DeleteFunc(m.Unset, func(u string) bool { return u == k })
				}
				for _, u := range w.Unset {
					delete(m.Set, u)
					if !slices.Contains(m.Unset, u) {
						m.Unset = append(m.Unset, u)
					}
				}
				m.Upsert = m.Upsert || w.Upsert
				continue
			}
			c := w
			if w.Set != nil {
				c.Set = make(map[string]any, len(w.Set))
				for k, v := range w.Set {
					c.Set[k] = v
				}
			}
			c.Unset = slices.Clone(w.Unset)
			last[key] = len(out)
			out = append(out, c)
		}
	}
	return out
}

// overlaps reports whether a path of b is a strict prefix of a path of a or the other way
// round: two such updates cannot be one update.
func overlaps(a, b PlanWrite) bool {
	var pa, pb []string
	for k := range a.Set {
		pa = append(pa, k)
	}
	pa = append(pa, a.Unset...)
	for k := range b.Set {
		pb = append(pb, k)
	}
	pb = append(pb, b.Unset...)
	for _, x := range pa {
		for _, y := range pb {
			if x != y && (strings.HasPrefix(x, y+".") || strings.HasPrefix(y, x+".")) {
				return true
			}
		}
	}
	return false
}

// writeModel is the bulk-write statement of w.
func writeModel(w PlanWrite) mongo.WriteModel {
	filter := bson.D{{Key: "_id", Value: w.ID}}
	if w.Delete {
		return mongo.NewDeleteOneModel().SetFilter(filter)
	}
	update := bson.D{}
	if len(w.Set) > 0 {
		update = append(update, bson.E{Key: "$set", Value: sortedSet(w.Set)})
	}
	if len(w.Unset) > 0 {
		un := bson.D{}
		for _, u := range w.Unset {
			un = append(un, bson.E{Key: u, Value: ""})
		}
		update = append(update, bson.E{Key: "$unset", Value: un})
	}
	if len(update) == 0 {
		// Nothing to change but, with Upsert, the document's existence.
		update = bson.D{{Key: "$setOnInsert", Value: bson.D{{Key: "_id", Value: w.ID}}}}
	}
	return mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(w.Upsert)
}

// sortedSet is set as a document in key order (a stable statement for the same write).
func sortedSet(set map[string]any) bson.D {
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(bson.D, 0, len(keys))
	for _, k := range keys {
		out = append(out, bson.E{Key: k, Value: set[k]})
	}
	return out
}

// applyWrites returns raw (nil: absent) with ws applied in order, as the materializer would
// write them: the view's copy of a document with the decisions not yet materialized laid over it.
func applyWrites(raw bson.Raw, id string, ws []PlanWrite) (bson.Raw, error) {
	var doc bson.D
	if raw != nil {
		if err := bson.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("store: decode %s to lay plan writes over it: %w", id, err)
		}
	}
	exists := raw != nil
	for _, w := range ws {
		if w.Delete {
			doc, exists = nil, false
			continue
		}
		if !exists {
			if !w.Upsert {
				continue
			}
			doc, exists = bson.D{{Key: "_id", Value: id}}, true
		}
		for _, k := range slices.Sorted(mapKeys(w.Set)) {
			doc = setPath(doc, strings.Split(k, "."), w.Set[k])
		}
		for _, u := range w.Unset {
			doc = unsetPath(doc, strings.Split(u, "."))
		}
	}
	if !exists {
		return nil, nil
	}
	out, err := bson.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("store: encode %s with plan writes laid over it: %w", id, err)
	}
	return out, nil
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// setPath sets the dotted path in doc to v, making the documents on the way.
func setPath(doc bson.D, path []string, v any) bson.D {
	for i := range doc {
		if doc[i].Key != path[0] {
			continue
		}
		if len(path) == 1 {
			doc[i].Value = v
			return doc
		}
		sub, _ := doc[i].Value.(bson.D)
		doc[i].Value = setPath(sub, path[1:], v)
		return doc
	}
	if len(path) == 1 {
		return append(doc, bson.E{Key: path[0], Value: v})
	}
	return append(doc, bson.E{Key: path[0], Value: setPath(nil, path[1:], v)})
}

// unsetPath removes the dotted path from doc, if there.
func unsetPath(doc bson.D, path []string) bson.D {
	for i := range doc {
		if doc[i].Key != path[0] {
			continue
		}
		if len(path) == 1 {
			return slices.Delete(doc, i, i+1)
		}
		if sub, ok := doc[i].Value.(bson.D); ok {
			doc[i].Value = unsetPath(sub, path[1:])
		}
		return doc
	}
	return doc
}
