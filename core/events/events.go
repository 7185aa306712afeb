// Package events owns the cluster's event log: events emitted by the core and
// by nodes, numbered by the core and deduplicated by id (docs/node-protocol.md section 5.4).
package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// Collection and sequence names in the store.
const (
	Collection = "events"
	sequence   = "events"
)

// Event types the core emits itself (docs/node-protocol.md section 4.4).
const (
	TypeNodeConnected    = "node.connected"
	TypeNodeDisconnected = "node.disconnected"
	TypeNodeRemoved      = "node.removed"
)

// Record is a stored event: the node body plus the seq the core assigned and
// when it received it.
type Record struct {
	Seq        int64      `json:"seq"`
	ReceivedAt time.Time  `json:"received_at"`
	Event      node.Event `json:"event"`
}

type doc struct {
	ID         string    `bson:"_id"`
	Seq        int64     `bson:"seq"`
	ReceivedAt time.Time `bson:"received_at"`
	Type       string    `bson:"type"`
	NodeID     string    `bson:"node_id,omitempty"`
	// Body is the event's JSON as received or built, kept verbatim.
	Body string `bson:"body"`
}

// Log appends and reads events. It is safe for concurrent use: concurrent
// [Log.Append] calls are written together, one sequence reservation and one
// insert command per batch (docs/store.md section 2.2).
type Log struct {
	st    *store.Store
	now   func() time.Time
	batch *store.Batcher[node.Event, appended]
}

// appended is one event's outcome in a batch.
type appended struct {
	seq       int64
	duplicate bool
}

// New returns a Log over s; now nil means time.Now.
func New(s *store.Store, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	l := &Log{st: s, now: now}
	l.batch = store.NewBatcher(store.BatchConfig{}, l.write)
	return l
}

// EnsureIndexes creates the seq index; idempotent.
func (l *Log) EnsureIndexes(ctx context.Context) error {
	if err := l.st.EnsureIndex(ctx, Collection, "seq"); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return nil
}

// Append stores ev unless an event with its id is stored already, and returns
// the seq of the stored event and whether it was a duplicate. An empty id is
// given a fresh "evt_" id. The id is the document key, so two concurrent
// appends of one id store one row; the loser reports a duplicate (its seq
// number is then unused: seqs increase but may skip).
//
// Appends made at once share one batch: one reservation of their seqs and one
// unordered insert of their documents, so an append costs two store commands
// shared by up to [store.DefaultBatchSize] callers. Append returns once its
// batch is stored; when ctx ends first it returns ctx's error and the event is
// stored anyway.
func (l *Log) Append(ctx context.Context, ev node.Event) (int64, bool, error) {
	if ev.ID == "" {
		ev.ID = identity.NewID("evt_")
	}
	if ev.SchemaVersion == 0 {
		ev.SchemaVersion = 1
	}
	r, err := l.batch.Do(ctx, ev)
	return r.seq, r.duplicate, err
}

// write stores one batch of events: it reserves one seq per event with one
// update and inserts them all with one unordered insert. An event whose id is
// stored already (an earlier batch, or twice in this one) reports that
// event's seq as a duplicate.
func (l *Log) write(ctx context.Context, evs []node.Event) ([]appended, []error) {
	out := make([]appended, len(evs))
	errs := make([]error, len(evs))
	fail := func(err error) ([]appended, []error) {
		for i := range errs {
			errs[i] = err
		}
		return out, errs
	}
	first := map[string]int{} // id -> index of its first event in this batch
	var docs []any
	var at []int // docs[k] is evs[at[k]]
	for i, ev := range evs {
		if _, ok := first[ev.ID]; ok {
			continue
		}
		first[ev.ID] = i
		at = append(at, i)
	}
	last, err := store.NextSequenceN(ctx, l.st, sequence, int64(len(at)))
	if err != nil {
		return fail(fmt.Errorf("events: %w", err))
	}
	seq := last - int64(len(at))
	received := l.now().UTC()
	for _, i := range at {
		ev := evs[i]
		raw, err := marshal(ev)
		if err != nil {
			errs[i] = err
			continue
		}
		seq++
		out[i].seq = seq
		docs = append(docs, doc{ID: ev.ID, Seq: seq, ReceivedAt: received, Type: ev.Type, NodeID: ev.Source.NodeID, Body: raw})
	}
	// docs holds the events that encoded, in the order of at.
	var stored []int
	for _, i := range at {
		if errs[i] == nil {
			stored = append(stored, i)
		}
	}
	for k, err := range l.st.InsertEach(ctx, Collection, docs) {
		i := stored[k]
		switch {
		case store.IsDuplicateKey(err):
			seq, _, err := l.seqOf(ctx, evs[i].ID)
			out[i], errs[i] = appended{seq: seq, duplicate: true}, err
		case err != nil:
			out[i], errs[i] = appended{}, fmt.Errorf("events: store %s: %w", evs[i].ID, err)
		}
	}
	for i, ev := range evs {
		if j := first[ev.ID]; j != i {
			out[i], errs[i] = appended{seq: out[j].seq, duplicate: true}, errs[j]
		}
	}
	return out, errs
}

func (l *Log) seqOf(ctx context.Context, id string) (int64, bool, error) {
	var d doc
	err := l.st.Get(ctx, Collection, id, &d)
	if errors.Is(err, store.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("events: look up %s: %w", id, err)
	}
	return d.Seq, true, nil
}

// List returns up to limit events with seq greater than afterSeq, oldest
// first; typ, when not empty, keeps only that type. limit <= 0 means 100.
func (l *Log) List(ctx context.Context, afterSeq int64, typ string, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = 100
	}
	match := store.Fields{}
	if typ != "" {
		match["type"] = typ
	}
	var docs []doc
	if err := l.st.FindAfter(ctx, Collection, "seq", afterSeq, match, limit, &docs); err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	out := make([]Record, 0, len(docs))
	for _, d := range docs {
		r := Record{Seq: d.Seq, ReceivedAt: d.ReceivedAt}
		if err := unmarshal(d.Body, &r.Event); err != nil {
			return nil, fmt.Errorf("events: decode %s: %w", d.ID, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Core returns an event the core emits about a node, e.g.
// Core(TypeNodeDisconnected, nodeID, map[string]any{"reason": "heartbeat_timeout"}).
func Core(typ, nodeID string, data map[string]any, now time.Time) node.Event {
	return node.Event{
		SchemaVersion: 1, ID: identity.NewID("evt_"), Type: typ, Time: now.UTC(),
		Source:  node.EventSource{Kind: "core"},
		Subject: node.EventRef{Type: "node", ID: nodeID},
		Actor:   node.EventRef{Type: "system", ID: "berthd"},
		Data:    data,
	}
}
