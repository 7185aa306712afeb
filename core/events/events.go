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

// Log appends and reads events. It is safe for concurrent use.
type Log struct {
	st  *store.Store
	now func() time.Time
}

// New returns a Log over s; now nil means time.Now.
func New(s *store.Store, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{st: s, now: now}
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
func (l *Log) Append(ctx context.Context, ev node.Event) (int64, bool, error) {
	if ev.ID == "" {
		ev.ID = identity.NewID("evt_")
	}
	if ev.SchemaVersion == 0 {
		ev.SchemaVersion = 1
	}
	if seq, ok, err := l.seqOf(ctx, ev.ID); err != nil || ok {
		return seq, ok, err
	}
	seq, err := store.NextSequence(ctx, l.st, sequence)
	if err != nil {
		return 0, false, fmt.Errorf("events: %w", err)
	}
	raw, err := marshal(ev)
	if err != nil {
		return 0, false, err
	}
	err = l.st.Insert(ctx, Collection, doc{ID: ev.ID, Seq: seq, ReceivedAt: l.now().UTC(), Type: ev.Type, NodeID: ev.Source.NodeID, Body: raw})
	if store.IsDuplicateKey(err) {
		seq, _, err := l.seqOf(ctx, ev.ID)
		return seq, true, err
	}
	if err != nil {
		return 0, false, fmt.Errorf("events: store %s: %w", ev.ID, err)
	}
	return seq, false, nil
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
