// Package changelog owns the cluster's change log: every change of cluster
// state as a gap-free, hash-chained entry (docs/node-protocol.md section 7).
package changelog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// HeadCollection holds one document, the newest seq and hash known to be
// stored. It is a hint that lets appends and readers find the head with one
// read by _id: entries are the truth, and a head that lags (a writer died
// between its insert and the head update) is rolled forward by reading the
// next entries by seq.
const HeadCollection = "changelog_head"

// headID is the _id of the one head document.
const headID = "head"

// maxAppendAttempts bounds the retries of Append when writers race for a seq.
const maxAppendAttempts = 32

// tailSize is how many of the newest entries a Log keeps in memory. Entries
// never change once stored, so followers that are close to the head read
// them without touching the store.
const tailSize = 2048

// ErrContention is returned by [Log.Append] when other berthd replicas took
// the next seq maxAppendAttempts times in a row; retryable.
var ErrContention = errors.New("berth: change log is contended; retry")

// Change is what a caller appends; the log fills seq, term, time and hashes.
// Payload is the full new document for create and update, nil (stored as {})
// for delete. Secret values in it must already be ciphertext.
type Change struct {
	ActorType, ActorID   string
	EntityType, EntityID string
	// IdempotencyKey is the Idempotency-Key of the request that made the change; may be empty.
	IdempotencyKey string
	Op             string // node.OpCreate, node.OpUpdate or node.OpDelete
	Payload        any
}

// doc stores the entry's exact JSON, so its hash recomputes byte for byte
// whatever the store does to times and numbers.
type doc struct {
	Seq  int64  `bson:"_id"`
	Hash string `bson:"hash"`
	Body string `bson:"body"`
	// ChangeID is the [Pending] id the entry was appended for: it makes
	// the append of a change found pending twice happen once.
	ChangeID string `bson:"change_id,omitempty"`
}

// headDoc is the one document of HeadCollection.
type headDoc struct {
	ID   string `bson:"_id"`
	Seq  int64  `bson:"seq"`
	Hash string `bson:"hash"`
}

// Log appends and reads entries. Within one berthd, changes queue and one
// goroutine at a time (the first caller that finds no append under way)
// appends everything queued as consecutive entries, so writers do not race
// each other for seqs. Appends from several berthd replicas stay gap-free:
// each batch claims seq = head + 1 onwards by inserting the documents keyed
// by them, and the loser of a race retries on the new head. Every hot-path
// store access is by _id, so the embedded store never scans the log.
type Log struct {
	st    *store.Store
	coll  *mongo.Collection
	heads *mongo.Collection
	term  int64
	now   func() time.Time
	log   *slog.Logger

	// qmu guards the queue of changes waiting for their entry.
	qmu      sync.Mutex
	queue    []*item
	flushing bool              // one goroutine appends at a time; qmu guards it
	running  bool              // Run is the appender; qmu guards it
	kick     chan struct{}     // wakes Run when a change is queued
	inflight int               // items taken by that goroutine; qmu guards it
	outboxes map[string]string // tracked outbox collections to their seq field; qmu guards it
	queued   map[string]*item  // queued or in-flight items by change id; qmu guards it
	recent   map[string]int64  // seq of the newest recentSize appended change ids; qmu guards it
	// recentIDs orders recent, oldest first; qmu guards it.
	recentIDs []string

	// cmu guards the housekeeping that follows stored batches (tidy.go).
	cmu          sync.Mutex
	chores       []chore       // queued, oldest first; cmu guards it
	cleaning     bool          // the cleaner goroutine runs; cmu guards it
	choresQueued int           // chores ever queued; cmu guards it
	choresDone   int           // chores ever finished; cmu guards it
	cleaned      chan struct{} // closed and replaced after every cleaner pass; cmu guards it
	// hintOwed is the newest stored entry whose hint move a cleaner pass
	// left for later (zero: none); cmu guards it.
	hintOwed node.LogEntry
	// hintSeq and hintAt are the seq this Log last moved the hint to, and
	// when; hintTimer reports whether a timer will queue the owed move.
	// cmu guards them.
	hintSeq   int64
	hintAt    time.Time
	hintTimer bool
	// cleanGateForTest, when not nil, is received from before each
	// cleaner pass: a test holds the housekeeping back with it (as a
	// berthd that dies before it would). cmu guards it.
	cleanGateForTest chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced after every append; mu guards it
	// tail holds the newest entries this Log stored or read, by seq; mu guards it.
	tail map[int64]node.LogEntry
	// tailMax is the highest seq in tail.
	tailMax int64
	// head is the newest seq this Log knows to be stored with nothing newer
	// known: 0 until it learned one. mu guards it.
	head int64
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
	return &Log{st: s, coll: s.Collection(Collection), heads: s.Collection(HeadCollection), term: term, now: now,
		log: slog.New(slog.DiscardHandler), changed: make(chan struct{}), tail: make(map[int64]node.LogEntry), outboxes: map[string]string{},
		queued: map[string]*item{}, recent: map[string]int64{}, kick: make(chan struct{}, 1), cleaned: make(chan struct{})}
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
// It reads the stored hint and starts from the newer of it and the newest
// entry this Log stored or read (the hint is moved after the waiters of a
// batch are told, so it may lag this Log's own appends), then rolls forward
// over entries stored after that.
func (l *Log) Head(ctx context.Context) (int64, string, error) {
	h, err := l.hint(ctx)
	if err != nil {
		return 0, "", err
	}
	l.mu.Lock()
	if e, ok := l.tail[l.head]; ok && e.Seq > h.Seq {
		h.Seq, h.Hash = e.Seq, e.Hash
	}
	l.mu.Unlock()
	// Roll a lagging hint forward over entries stored after it: one range
	// read per MaxLogBatch entries (the embedded store scans for an
	// integer-keyed entry, so reading them one by one cost a scan each and,
	// after a crash left the hint 256 entries behind, outlasted a batch).
	rolled := false
	for range maxAppendAttempts {
		for range tailSize { // what the tail holds costs nothing
			e, ok := l.tailAt(h.Seq + 1)
			if !ok {
				break
			}
			h.Seq, h.Hash, rolled = e.Seq, e.Hash, true
		}
		page, err := l.readRange(ctx, h.Seq+1, node.MaxLogBatch)
		if err != nil {
			return 0, "", err
		}
		for _, e := range page {
			if e.Seq != h.Seq+1 {
				break
			}
			h.Seq, h.Hash, rolled = e.Seq, e.Hash, true
		}
		if len(page) < node.MaxLogBatch {
			break
		}
	}
	if rolled {
		l.advanceHead(ctx, node.LogEntry{Seq: h.Seq, Hash: h.Hash})
	}
	l.sawHead(h.Seq)
	return h.Seq, h.Hash, nil
}

// hint reads the head hint document (creating it for a log written before
// it existed). It may lag the entries: see [Log.Head].
func (l *Log) hint(ctx context.Context) (headDoc, error) {
	var h headDoc
	err := l.heads.FindOne(ctx, bson.M{"_id": headID}).Decode(&h)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		// A log written before the head document existed: find its head
		// once by sorting, then keep the hint.
		var d doc
		err := l.coll.FindOne(ctx, bson.M{}, options.FindOne().SetSort(bson.D{{Key: "_id", Value: -1}})).Decode(&d)
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			return headDoc{}, fmt.Errorf("changelog: read head: %w", err)
		}
		h = headDoc{ID: headID, Seq: d.Seq, Hash: d.Hash}
		if _, err := l.heads.InsertOne(ctx, h); err != nil && !store.IsDuplicateKey(err) {
			return headDoc{}, fmt.Errorf("changelog: store head: %w", err)
		}
	case err != nil:
		return headDoc{}, fmt.Errorf("changelog: read head: %w", err)
	}
	return h, nil
}

// advanceHead moves the head hint forward to e with one compare-and-set
// that matches only a hint behind e, so it never moves back; losing to
// another writer is fine, a failure only leaves the hint behind.
func (l *Log) advanceHead(ctx context.Context, e node.LogEntry) {
	_, _ = l.heads.UpdateOne(ctx, bson.M{"_id": headID, "seq": bson.M{"$lt": e.Seq}}, bson.M{"$set": bson.M{"seq": e.Seq, "hash": e.Hash}})
}

// HashAt returns the hash of entry seq, and false when it does not exist.
func (l *Log) HashAt(ctx context.Context, seq int64) (string, bool, error) {
	e, ok, err := l.entry(ctx, seq)
	return e.Hash, ok, err
}

// entry returns entry seq from the in-memory tail or by _id from the store.
func (l *Log) entry(ctx context.Context, seq int64) (node.LogEntry, bool, error) {
	l.mu.Lock()
	e, ok := l.tail[seq]
	l.mu.Unlock()
	if ok {
		return e, true, nil
	}
	var d doc
	err := l.coll.FindOne(ctx, bson.M{"_id": seq}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return node.LogEntry{}, false, nil
	}
	if err != nil {
		return node.LogEntry{}, false, fmt.Errorf("changelog: read entry %d: %w", seq, err)
	}
	if err := json.Unmarshal([]byte(d.Body), &e); err != nil {
		return node.LogEntry{}, false, fmt.Errorf("changelog: decode entry %d: %w", d.Seq, err)
	}
	l.remember(e)
	return e, true, nil
}

// remember keeps e in the tail when it is among the newest tailSize seen.
func (l *Log) remember(e node.LogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Seq <= l.tailMax-tailSize {
		return
	}
	l.tail[e.Seq] = e
	if e.Seq > l.tailMax {
		old := l.tailMax
		l.tailMax = e.Seq
		if e.Seq-old >= tailSize { // a jump: everything held may have fallen out
			for seq := range l.tail {
				if seq <= l.tailMax-tailSize {
					delete(l.tail, seq)
				}
			}
			return
		}
		for seq := old - tailSize + 1; seq <= l.tailMax-tailSize; seq++ {
			delete(l.tail, seq) // only the entries this move pushed out
		}
	}
}

// Range returns up to limit entries from fromSeq (at least 1) in order;
// limit <= 0 or above node.MaxLogBatch means node.MaxLogBatch. Followers
// near the head are answered from memory; a follower further behind costs
// one range query.
//
// Entries another berthd replica appended are seen once this Log reads them
// (a Head, an Append, or a query for older entries); until then a follower
// at this Log's head gets none, as it gets no Changed signal for them either.
func (l *Log) Range(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, error) {
	if fromSeq < 1 {
		fromSeq = 1
	}
	if limit <= 0 || limit > node.MaxLogBatch {
		limit = node.MaxLogBatch
	}
	if out, ok := l.fromTail(fromSeq, limit); ok {
		return out, nil
	}
	out, err := l.readRange(ctx, fromSeq, limit)
	if err != nil {
		return nil, err
	}
	switch {
	case len(out) == 0:
		// Learn the head, so that followers waiting at it are answered from
		// memory from now on.
		if _, _, err := l.Head(ctx); err != nil {
			return nil, err
		}
	case len(out) < limit:
		l.sawHead(out[len(out)-1].Seq)
	}
	return out, nil
}

// readRange reads up to limit stored entries from fromSeq, in order, with one
// query, and keeps them in the tail.
func (l *Log) readRange(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, error) {
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
		l.remember(e)
	}
	return out, nil
}

// tailAt returns entry seq when the tail holds it.
func (l *Log) tailAt(seq int64) (node.LogEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.tail[seq]
	return e, ok
}

// fromTail answers Range from memory when the head is known and every
// entry from fromSeq up to it (or up to limit) is in the tail.
func (l *Log) fromTail(fromSeq int64, limit int) ([]node.LogEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head == 0 {
		return nil, false
	}
	if fromSeq > l.head {
		return nil, true
	}
	last := min(l.head, fromSeq+int64(limit)-1)
	out := make([]node.LogEntry, 0, last-fromSeq+1)
	for seq := fromSeq; seq <= last; seq++ {
		e, ok := l.tail[seq]
		if !ok {
			return nil, false
		}
		out = append(out, e)
	}
	return out, true
}

// sawHead records that seq was the newest entry when it was read or written.
func (l *Log) sawHead(seq int64) {
	l.mu.Lock()
	l.head = max(l.head, seq)
	l.mu.Unlock()
}
