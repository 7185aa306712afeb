package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Group-commit defaults of a [Batcher] (docs/store.md section 2.2).
const (
	// DefaultBatchSize bounds the items of one batch: one insert command on FerretDB
	// ([FerretWriteBatch]), so one SQLite transaction.
	DefaultBatchSize = FerretWriteBatch
	// DefaultBatchWait bounds how long the first item of a batch waits for others before the
	// batch is written. Zero would write the first caller alone; the callers that arrive while a
	// batch is being written form the next one anyway.
	DefaultBatchWait = 2 * time.Millisecond
	// DefaultBatchTimeout bounds one batch's store work. The batch runs detached from every
	// caller's context, so a caller that leaves does not cut the others' write.
	DefaultBatchTimeout = 30 * time.Second
)

// BatchConfig configures a [Batcher]. The zero value works.
type BatchConfig struct {
	// Size is the most items one flush gets; zero or negative means [DefaultBatchSize].
	Size int
	// Wait is how long the first item of a batch waits for more before the flush; zero means
	// [DefaultBatchWait], negative no wait.
	Wait time.Duration
	// Timeout bounds one flush; zero or negative means [DefaultBatchTimeout].
	Timeout time.Duration
}

// FlushFunc writes items as one batch and returns one result and one error per item, in the
// order of items (a nil errs means every item succeeded). It is called by one goroutine at a
// time, so batches are written in the order their items were submitted. It must return only
// once what it reports as written is durable.
type FlushFunc[T, R any] func(ctx context.Context, items []T) (results []R, errs []error)

// Batcher is a group-commit writer: many goroutines [Batcher.Do] an item each, and one goroutine
// (started by the first that finds no flush under way) writes what is queued with one [FlushFunc] call per
// batch of at most Size items, after waiting at most Wait for the batch to fill. Each caller is
// answered with its own item's result once its batch was flushed. It is the one mechanism for
// insert-shaped writes that many callers make at once (events, operation enqueues); the change
// log's appender follows the same scheme with its own recovery (docs/store.md section 2.2).
// Safe for concurrent use; it owns no goroutine while nothing is queued.
type Batcher[T, R any] struct {
	flush FlushFunc[T, R]
	cfg   BatchConfig

	mu       sync.Mutex
	queue    []*batchItem[T, R]
	flushing bool          // one goroutine flushes at a time; mu guards it
	full     chan struct{} // signalled when the queue reaches Size; mu guards sends
}

type batchItem[T, R any] struct {
	v    T
	res  R
	err  error
	done chan struct{}
}

// NewBatcher returns a Batcher that writes with flush.
func NewBatcher[T, R any](cfg BatchConfig, flush FlushFunc[T, R]) *Batcher[T, R] {
	if cfg.Size <= 0 {
		cfg.Size = DefaultBatchSize
	}
	if cfg.Wait == 0 {
		cfg.Wait = DefaultBatchWait
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultBatchTimeout
	}
	return &Batcher[T, R]{flush: flush, cfg: cfg, full: make(chan struct{}, 1)}
}

// Do queues v, gets it written in a batch and returns its result. The write runs on a context
// detached from ctx: when ctx ends first, Do returns ctx's error and the item is written anyway.
// Cost: one FlushFunc call shared with the items queued beside it, plus at most Wait.
func (b *Batcher[T, R]) Do(ctx context.Context, v T) (R, error) {
	it := &batchItem[T, R]{v: v, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, it)
	lead := !b.flushing
	b.flushing = true
	if len(b.queue) >= b.cfg.Size {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
	b.mu.Unlock()
	if lead {
		// On a goroutine of its own: a caller whose ctx ends stops waiting at once, even
		// while the store stalls its batch.
		go b.run(context.WithoutCancel(ctx))
	}
	select {
	case <-it.done: // done wins over a ctx that ended meanwhile
		return it.res, it.err
	default:
	}
	select {
	case <-it.done:
		return it.res, it.err
	case <-ctx.Done():
		var zero R
		return zero, fmt.Errorf("store: wait for a batched write: %w", ctx.Err())
	}
}

// run flushes batch after batch until the queue is empty; the caller set b.flushing.
func (b *Batcher[T, R]) run(ctx context.Context) {
	first := true
	for {
		if first && b.cfg.Wait > 0 {
			// Let the batch fill: the callers arriving meanwhile join it.
			t := time.NewTimer(b.cfg.Wait)
			select {
			case <-t.C:
			case <-b.full:
			}
			t.Stop()
		}
		first = false
		b.mu.Lock()
		n := min(len(b.queue), b.cfg.Size)
		if n == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = append([]*batchItem[T, R](nil), b.queue[n:]...)
		select { // a stale full signal must not cut the next first wait short
		case <-b.full:
		default:
		}
		b.mu.Unlock()
		items := make([]T, n)
		for i, it := range batch {
			items[i] = it.v
		}
		fctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		res, errs := b.flush(fctx, items)
		cancel()
		for i, it := range batch {
			if i < len(res) {
				it.res = res[i]
			}
			if i < len(errs) {
				it.err = errs[i]
			} else if len(res) < n {
				it.err = errors.New("store: batch flush returned fewer results than items")
			}
			close(it.done)
		}
	}
}

// InsertEach inserts docs into coll with one unordered InsertMany (one insert command per
// [FerretWriteBatch] documents on FerretDB, each one transaction) and returns each document's
// error by index: nil when stored, a duplicate key ([IsDuplicateKey]) when its _id or a unique
// index was taken, the command's error for every document when the command failed as a whole.
// Unordered: a document refused does not stop the others.
func (s *Store) InsertEach(ctx context.Context, coll string, docs []any) []error {
	errs := make([]error, len(docs))
	if len(docs) == 0 {
		return errs
	}
	_, err := s.Collection(coll).InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return errs
	}
	var bwe mongo.BulkWriteException
	if errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 {
		for _, we := range bwe.WriteErrors {
			if we.Index >= 0 && we.Index < len(docs) {
				errs[we.Index] = fmt.Errorf("store: insert into %s: %w", coll, mongo.WriteException{WriteErrors: []mongo.WriteError{we.WriteError}})
			}
		}
		return errs
	}
	for i := range errs {
		errs[i] = fmt.Errorf("store: insert into %s: %w", coll, err)
	}
	return errs
}
