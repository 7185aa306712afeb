package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Folded plan entries (docs/store.md section 2.2): the writes of plan entries that are durable in
// the plan log but not yet written to their documents, laid over the view's copies. Every read of
// the view ([View.Get], [View.Find]) answers with them applied, so a decision is visible the moment
// its entry is durable; the materializer unfolds them once their documents hold them. Because
// every [PlanWrite] is idempotent, a read that meets a document the materializer has written
// already, with the fold still in place, answers the same.

// folds are the folded writes: collection -> document key ([idKey]) -> writes in order.
type folds struct {
	mu sync.RWMutex
	by map[string]map[string][]foldedWrite
}

type foldedWrite struct {
	seq int64
	w   PlanWrite
}

// Fold lays the writes of the durable plan entry seq over the view. Entries must be folded in
// sequence order.
func (v *View) Fold(seq int64, writes []PlanWrite) {
	v.folds.mu.Lock()
	if v.folds.by == nil {
		v.folds.by = map[string]map[string][]foldedWrite{}
	}
	for _, w := range writes {
		m := v.folds.by[w.Coll]
		if m == nil {
			m = map[string][]foldedWrite{}
			v.folds.by[w.Coll] = m
		}
		k := stringKey(w.ID)
		m[k] = append(m[k], foldedWrite{seq: seq, w: w})
	}
	v.folds.mu.Unlock()
	for _, w := range writes {
		v.notify(touch{coll: w.Coll, ids: []bson.RawValue{stringID(w.ID)}})
	}
}

// Unfold removes the folded writes of every entry up to and including through: the materializer
// wrote their documents and the view's marks bring its copies up to them.
func (v *View) Unfold(through int64) {
	v.folds.mu.Lock()
	defer v.folds.mu.Unlock()
	for c, m := range v.folds.by {
		for k, ws := range m {
			ws = slices.DeleteFunc(ws, func(f foldedWrite) bool { return f.seq <= through })
			if len(ws) == 0 {
				delete(m, k)
			} else {
				m[k] = ws
			}
		}
		if len(m) == 0 {
			delete(v.folds.by, c)
		}
	}
}

// Folded returns how many documents have folded writes (tests and metrics).
func (v *View) Folded() int {
	v.folds.mu.RLock()
	defer v.folds.mu.RUnlock()
	n := 0
	for _, m := range v.folds.by {
		n += len(m)
	}
	return n
}

// foldedFor returns the folded writes of document k of coll (nil when none).
func (v *View) foldedFor(coll, k string) []PlanWrite {
	v.folds.mu.RLock()
	defer v.folds.mu.RUnlock()
	fs := v.folds.by[coll][k]
	if len(fs) == 0 {
		return nil
	}
	out := make([]PlanWrite, len(fs))
	for i, f := range fs {
		out[i] = f.w
	}
	return out
}

// foldedKeys returns the keys of coll's documents that have folded writes.
func (v *View) foldedKeys(coll string) map[string]string {
	v.folds.mu.RLock()
	defer v.folds.mu.RUnlock()
	m := v.folds.by[coll]
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, fs := range m {
		out[k] = fs[0].w.ID
	}
	return out
}

// overlay returns raw (nil: absent) of document k (string id id) of coll with its folded writes
// and then extra applied.
func (v *View) overlay(coll, k, id string, raw bson.Raw, extra []PlanWrite) (bson.Raw, error) {
	ws := v.foldedFor(coll, k)
	if len(ws) == 0 && len(extra) == 0 {
		return raw, nil
	}
	return applyWrites(raw, id, append(ws, extra...))
}

func stringKey(id string) string { return "\x02" + id }

func stringID(id string) bson.RawValue {
	t, data, _ := bson.MarshalValue(id)
	return bson.RawValue{Type: t, Value: data}
}

// Layer reads documents as the view holds them, folded entries included, with writes not yet
// durable laid on top: the plan applier decides each plan of a batch against the decisions it
// accepted before it in the same batch. Not safe for concurrent use.
type Layer struct {
	st     *Store
	writes map[string]map[string][]PlanWrite
}

// NewLayer returns an empty [Layer] over the view of s.
func (s *Store) NewLayer() *Layer { return &Layer{st: s, writes: map[string]map[string][]PlanWrite{}} }

// Add lays ws over the layer.
func (l *Layer) Add(ws []PlanWrite) {
	for _, w := range ws {
		m := l.writes[w.Coll]
		if m == nil {
			m = map[string][]PlanWrite{}
			l.writes[w.Coll] = m
		}
		m[w.ID] = append(m[w.ID], w)
	}
}

// Reset empties the layer.
func (l *Layer) Reset() { clear(l.writes) }

// Get decodes document id of collection coll, as the view holds it with the folded entries and
// the layer's writes applied, into out. Errors: wrapping [ErrNotFound].
func (l *Layer) Get(ctx context.Context, coll, id string, out any) error {
	raw, err := l.st.view.getRaw(ctx, l.st.Collection(coll), id, l.writes[coll][id])
	if err != nil {
		return err
	}
	if raw == nil {
		return fmt.Errorf("store: find %s %v: %w", coll, id, ErrNotFound)
	}
	if err := bson.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("store: decode %s %v: %w", coll, id, err)
	}
	return nil
}

// getRaw returns document id (a string) of coll from the view (from the store when the view is
// off), folded writes and then extra applied; nil when absent.
func (v *View) getRaw(ctx context.Context, coll *mongo.Collection, id string, extra []PlanWrite) (bson.Raw, error) {
	k := stringKey(id)
	var raw bson.Raw
	ok := false
	if v.Enabled() {
		var err error
		raw, ok, err = v.fresh(ctx, coll.Name(), stringID(id))
		if err != nil {
			return nil, err
		}
	}
	if !ok || !v.Enabled() {
		r, err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			raw = nil
		case err != nil:
			return nil, fmt.Errorf("store: find %s %v: %w", coll.Name(), id, err)
		default:
			raw = slices.Clone(r)
		}
	}
	return v.overlay(coll.Name(), k, id, raw, extra)
}
