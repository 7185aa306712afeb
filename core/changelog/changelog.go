// Package changelog owns the cluster's change log: every change of cluster
// state as a gap-free, hash-chained entry (docs/node-protocol.md section 7).
package changelog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per entry, keyed by seq.
const Collection = "changelog"

// maxAppendAttempts bounds the retries of Append when writers race for a seq.
const maxAppendAttempts = 32

// ErrContention is returned by [Log.Append] when other writers took the next
// seq maxAppendAttempts times in a row; retryable.
var ErrContention = errors.New("berth: change log is contended; retry")

// Change is what a caller appends; the log fills seq, term, time and hashes.
// Payload is the full new document for create and update, nil (stored as {})
// for delete. Secret values in it must already be ciphertext.
type Change struct {
	ActorType, ActorID   string
	EntityType, EntityID string
	Op                   string // node.OpCreate, node.OpUpdate or node.OpDelete
	Payload              any
}

// doc stores the entry's exact JSON, so its hash recomputes byte for byte
// whatever the store does to times and numbers.
type doc struct {
	Seq  int64  `bson:"_id"`
	Hash string `bson:"hash"`
	Body string `bson:"body"`
}

// Log appends and reads entries. Appends from any number of goroutines or
// berthd replicas stay gap-free: each claims seq = head + 1 by inserting the
// document keyed by it, and the loser of a race retries on the new head.
type Log struct {
	coll *mongo.Collection
	term int64
	now  func() time.Time

	mu      sync.Mutex
	changed chan struct{} // closed and replaced after every append; mu guards it
}

// New returns a Log over s; term is written into every entry (1 until
// promotion exists); now nil means time.Now.
func New(s *store.Store, term int64, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	if term <= 0 {
		term = 1
	}
	return &Log{coll: s.Collection(Collection), term: term, now: now, changed: make(chan struct{})}
}

// Changed returns a channel that is closed after the next entry appended
// through this Log. Followers (the node sessions of this berthd) wait on it
// instead of polling; a follower that sees it closed calls Changed again
// before reading, so no append is missed. Appends by another berthd replica
// do not close it.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *Log) notify() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// Head returns the newest entry's seq and hash: 0 and "" for an empty log.
func (l *Log) Head(ctx context.Context) (int64, string, error) {
	var d doc
	err := l.coll.FindOne(ctx, bson.M{}, options.FindOne().SetSort(bson.D{{Key: "_id", Value: -1}})).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("changelog: read head: %w", err)
	}
	return d.Seq, d.Hash, nil
}

// HashAt returns the hash of entry seq, and false when it does not exist.
func (l *Log) HashAt(ctx context.Context, seq int64) (string, bool, error) {
	var d doc
	err := l.coll.FindOne(ctx, bson.M{"_id": seq}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("changelog: read entry %d: %w", seq, err)
	}
	return d.Hash, true, nil
}

// Append adds ch as the next entry and returns it. Errors: a payload that
// does not encode; [ErrContention] after repeated lost races; store errors.
func (l *Log) Append(ctx context.Context, ch Change) (node.LogEntry, error) {
	payload := json.RawMessage("{}")
	if ch.Payload != nil && ch.Op != node.OpDelete {
		raw, err := json.Marshal(ch.Payload)
		if err != nil {
			return node.LogEntry{}, fmt.Errorf("changelog: encode payload of %s %s: %w", ch.EntityType, ch.EntityID, err)
		}
		payload = raw
	}
	for range maxAppendAttempts {
		seq, prev, err := l.Head(ctx)
		if err != nil {
			return node.LogEntry{}, err
		}
		if prev == "" {
			prev = node.ZeroHash
		}
		e := node.LogEntry{
			Seq: seq + 1, Term: l.term, Time: l.now().UTC(),
			ActorType: ch.ActorType, ActorID: ch.ActorID, EntityType: ch.EntityType, EntityID: ch.EntityID,
			Op: ch.Op, Payload: payload, PrevHash: prev,
		}
		if e.Hash, err = e.ComputeHash(); err != nil {
			return node.LogEntry{}, fmt.Errorf("changelog: %w", err)
		}
		body, err := json.Marshal(e)
		if err != nil {
			return node.LogEntry{}, fmt.Errorf("changelog: encode entry: %w", err)
		}
		_, err = l.coll.InsertOne(ctx, doc{Seq: e.Seq, Hash: e.Hash, Body: string(body)})
		if store.IsDuplicateKey(err) {
			continue // another writer took this seq
		}
		if err != nil {
			return node.LogEntry{}, fmt.Errorf("changelog: store entry %d: %w", e.Seq, err)
		}
		l.notify()
		return e, nil
	}
	return node.LogEntry{}, ErrContention
}

// Range returns up to limit entries from fromSeq (at least 1) in order;
// limit <= 0 or above node.MaxLogBatch means node.MaxLogBatch.
func (l *Log) Range(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, error) {
	if fromSeq < 1 {
		fromSeq = 1
	}
	if limit <= 0 || limit > node.MaxLogBatch {
		limit = node.MaxLogBatch
	}
	cur, err := l.coll.Find(ctx, bson.M{"_id": bson.M{"$gte": fromSeq, "$lt": fromSeq + int64(limit)}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("changelog: read from %d: %w", fromSeq, err)
	}
	var docs []doc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("changelog: read from %d: %w", fromSeq, err)
	}
	out := make([]node.LogEntry, 0, len(docs))
	for _, d := range docs {
		var e node.LogEntry
		if err := json.Unmarshal([]byte(d.Body), &e); err != nil {
			return nil, fmt.Errorf("changelog: decode entry %d: %w", d.Seq, err)
		}
		out = append(out, e)
	}
	return out, nil
}
