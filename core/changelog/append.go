package changelog

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
)

// freshChange is how old the last change of an outbox handed over by
// [Log.RecordOutbox] may be and still be taken as the write's own (made
// moments ago, so certainly not in the log yet).
const freshChange = 5 * time.Second

// recentSize is how many appended change ids a Log remembers, so that
// recording one of them again returns its entry instead of a second one.
const recentSize = 4096

// maxBatch bounds how many queued changes one insert appends.
const maxBatch = 256

// batchTimeout bounds one batch's store work; the batch runs on a context
// detached from the caller's, so a caller that leaves does not stop it.
const batchTimeout = 30 * time.Second

// flushRetries is how often a failed batch is tried again before its
// changes wait for [Log.Run]'s next round (outbox changes) or fail
// (changes without an outbox).
const flushRetries = 3

// RecoverInterval is how often [Log.Run] looks for changes left in
// outboxes; each look reads every tracked collection's documents that hold
// one, which the embedded store answers with a scan.
const RecoverInterval = 2 * time.Minute

// RecoverAge is how old a pending change must be before [Log.Run]'s
// recovery takes it: far longer than a live change waits for its entry.
const RecoverAge = time.Minute

// RunInterval is how often [Log.Run] appends changes a failed batch left
// queued.
const RunInterval = 5 * time.Second

// Ref names the document whose outbox ([OutboxField]) holds a pending
// change; the zero Ref is a change held nowhere but in memory.
type Ref struct {
	Collection string
	ID         any // the document's _id
	// SeqField, when not empty, is the document's field set to the
	// entry's seq once appended.
	SeqField string
	// RemoveOn, when not empty, is the id of the change whose append
	// removes the document (a delete committed as a mark plus its change in
	// the outbox; the document's [RemoveOnField] holds the same id).
	RemoveOn string
}

// RemoveOnField is the field of a document deleted in two steps: a delete
// commits as one write that sets this field to its change's id and puts the
// change in the outbox ([OutboxField]); readers treat the document as gone
// from then on, and the log removes it once that change is appended
// (docs/node-protocol.md section 7.2).
const RemoveOnField = "log_remove_on"

// item is one queued change and what its waiter learns.
type item struct {
	p    Pending
	ref  Ref
	done chan struct{} // closed once entry or err is set
	// entry and err are written by the appending goroutine before done
	// is closed.
	entry node.LogEntry
	err   error
}

// finish records it's outcome, forgets it as queued and, once appended,
// remembers its seq among the recent ones.
func (l *Log) finish(it *item, e node.LogEntry, err error) {
	it.entry, it.err = e, err
	l.qmu.Lock()
	delete(l.queued, it.p.ID)
	if err == nil {
		l.recent[it.p.ID] = e.Seq
		l.recentIDs = append(l.recentIDs, it.p.ID)
		if len(l.recentIDs) > recentSize {
			delete(l.recent, l.recentIDs[0])
			l.recentIDs = l.recentIDs[1:]
		}
	}
	l.qmu.Unlock()
	close(it.done)
}

// WithLogger sets where the log reports what it only logs (an outbox it
// could not clear, a batch it will retry) and returns l.
func (l *Log) WithLogger(log *slog.Logger) *Log {
	if log != nil {
		l.log = log
	}
	return l
}

// TrackOutbox names a collection whose documents carry outboxes, and the
// field of each that is set to the entry's seq once appended ("" for none).
// [Log.Recover] looks for pending changes only in tracked collections.
func (l *Log) TrackOutbox(collection, seqField string) {
	l.qmu.Lock()
	l.outboxes[collection] = seqField
	l.qmu.Unlock()
}

// Append adds ch as an entry and returns it: [Prepare] then [Log.Record]
// with no outbox. Errors: those of Prepare; ctx's error when ctx ends first
// (the entry is still appended); [ErrContention] and store errors.
func (l *Log) Append(ctx context.Context, ch Change) (node.LogEntry, error) {
	p, err := Prepare(ch)
	if err != nil {
		return node.LogEntry{}, err
	}
	return l.Record(ctx, Ref{}, p)
}

// Record queues p, already stored in ref's outbox in the same write as its
// change (or held only in memory for the zero Ref), and returns its entry
// once appended. The append runs on a context detached from ctx: when ctx
// ends first, Record returns ctx's error and the entry is appended anyway.
// An outbox change whose batch keeps failing stays queued for [Log.Run]; a
// change without an outbox fails with the batch's error.
// Recording the same change (by id) again while it is queued, or soon after
// its entry was appended by this Log, waits for or returns that one entry.
func (l *Log) Record(ctx context.Context, ref Ref, p Pending) (node.LogEntry, error) {
	l.qmu.Lock()
	it, seq, appended := l.enqueueLocked(ref, p)
	l.qmu.Unlock()
	if appended {
		e, _, err := l.entry(ctx, seq)
		return e, err
	}
	l.start(ctx)
	return l.wait(ctx, it)
}

// RecordOutbox hands every change of a document's outbox, as its write
// left it, to the log in order, and returns the entry of the last one (the
// write's own) like [Log.Record]. The earlier ones are changes of earlier
// writes of the same document that are still pending: queuing them first
// keeps the entries of one document in the order of its writes, even when
// the handler of an earlier write hands its change over late. An earlier
// change this Log has neither queued nor recently appended is looked up in
// the log by id first (a query that the embedded store answers with a scan,
// paid only when writes of one document overlap), so none is appended twice.
func (l *Log) RecordOutbox(ctx context.Context, ref Ref, outbox []Pending) (node.LogEntry, error) {
	if len(outbox) == 0 {
		return node.LogEntry{}, nil
	}
	last := outbox[len(outbox)-1]
	earlier := outbox[:len(outbox)-1]
	if l.now().Sub(last.At) > freshChange {
		// Not this write's own change (a write that changed nothing and
		// returned the outbox as it found it): check it like the others.
		earlier, last = outbox, Pending{}
	}
	var unknown []string
	recentSeq := map[string]int64{}
	l.qmu.Lock()
	for _, p := range earlier {
		_, queued := l.queued[p.ID]
		seq, recent := l.recent[p.ID]
		if recent {
			recentSeq[p.ID] = seq
		}
		if !queued && !recent {
			unknown = append(unknown, p.ID)
		}
	}
	l.qmu.Unlock()
	var landed map[string]int64
	if len(unknown) > 0 {
		var err error
		if landed, err = l.landedIDs(ctx, unknown); err != nil {
			// Leave the earlier ones to their own handlers and to Recover,
			// which decides by the same lookup.
			l.log.Warn("look up earlier pending changes in the change log", "collection", ref.Collection, "id", ref.ID, "err", err)
			earlier = nil
		}
	}
	l.qmu.Lock()
	for _, p := range earlier {
		if _, ok := landed[p.ID]; !ok {
			l.enqueueLocked(ref, p)
		}
	}
	l.qmu.Unlock()
	// An earlier change already in the log is cleared again, after this
	// write: its own clear may have run between this write's read of the
	// document and its commit, and a write that replaces the document
	// whole (a compare-and-set on its revision) put it back.
	var e node.LogEntry
	var c chore
	for _, p := range earlier {
		if seq, ok := landed[p.ID]; ok {
			c.clears = append(c.clears, clear{ref: ref, p: p, seq: seq})
			e.Seq = seq
		} else if _, ok := recentSeq[p.ID]; ok {
			c.clears = append(c.clears, clear{ref: ref, p: p}) // its own clear sets the seq field
		}
	}
	l.tidy(c)
	if last.ID == "" {
		l.start(ctx)
		return e, nil
	}
	return l.Record(ctx, ref, last)
}

// landedIDs returns the seq of each of ids that has an entry.
func (l *Log) landedIDs(ctx context.Context, ids []string) (map[string]int64, error) {
	cur, err := l.coll.Find(ctx, bson.M{"change_id": bson.M{"$in": ids}}, options.Find().SetProjection(bson.M{"change_id": 1}))
	if err != nil {
		return nil, fmt.Errorf("changelog: find changes in the log: %w", err)
	}
	var docs []doc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("changelog: find changes in the log: %w", err)
	}
	out := make(map[string]int64, len(docs))
	for _, d := range docs {
		out[d.ChangeID] = d.Seq
	}
	return out, nil
}

// enqueueLocked queues p for ref unless this Log queued it already (it
// returns that item) or appended it recently (appended, with its seq).
// qmu must be held.
func (l *Log) enqueueLocked(ref Ref, p Pending) (it *item, seq int64, appended bool) {
	if seq, ok := l.recent[p.ID]; ok {
		return nil, seq, true
	}
	if it, ok := l.queued[p.ID]; ok {
		return it, 0, false
	}
	it = &item{p: p, ref: ref, done: make(chan struct{})}
	l.queued[p.ID] = it
	l.queue = append(l.queue, it)
	return it, 0, false
}

// start gets what is queued appended: with Run active, its goroutine is
// woken; else the first caller that finds no append under way appends for
// everyone queued, on a context detached from ctx.
func (l *Log) start(ctx context.Context) {
	l.qmu.Lock()
	lead := !l.running && !l.flushing && len(l.queue) > 0
	l.flushing = l.flushing || lead
	running := l.running
	l.qmu.Unlock()
	switch {
	case running:
		select {
		case l.kick <- struct{}{}:
		default: // a kick is pending already
		}
	case lead:
		l.flush(context.WithoutCancel(ctx))
	}
}

// wait returns it's entry once appended, or ctx's error.
func (l *Log) wait(ctx context.Context, it *item) (node.LogEntry, error) {
	select {
	case <-it.done: // done wins over a ctx that ended meanwhile
		return it.entry, it.err
	default:
	}
	select {
	case <-it.done:
		return it.entry, it.err
	case <-ctx.Done():
		return node.LogEntry{}, fmt.Errorf("changelog: wait for the entry of %s %s: %w", it.p.EntityType, it.p.EntityID, ctx.Err())
	}
}

// Pending returns how many changes wait for their entry in this berthd.
func (l *Log) Pending() int {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return len(l.queue) + l.inflight
}

// Run is the Log's appender until ctx ends: while it runs, its goroutine
// appends what [Log.Record] queues (so no caller's request waits for other
// callers' batches), retries every [RunInterval] what failed batches left
// queued, and every [RecoverInterval] runs [Log.Recover] for changes stored
// by writes whose callers never handed them over (a write that committed
// although its caller saw an error). Without Run, callers append in turn.
func (l *Log) Run(ctx context.Context) {
	t := time.NewTicker(RunInterval)
	defer t.Stop()
	l.qmu.Lock()
	l.running = true
	l.qmu.Unlock()
	defer func() {
		// Callers append in turn again; what is queued now is appended
		// (bounded) before Run returns.
		l.qmu.Lock()
		l.running = false
		lead := !l.flushing && len(l.queue) > 0
		l.flushing = l.flushing || lead
		l.qmu.Unlock()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
		defer cancel()
		if lead {
			l.flush(fctx)
		}
		// The housekeeping of what is stored runs out too (bounded), so
		// a berthd that stops leaves no outbox behind without need and
		// no clear runs on a store being closed.
		_ = l.Cleared(fctx)
	}()
	lastRecover := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
		if time.Since(lastRecover) >= RecoverInterval {
			lastRecover = time.Now()
			if _, err := l.recoverOlderThan(ctx, RecoverAge, false); err != nil && ctx.Err() == nil {
				l.log.Warn("recover pending changes; will retry", "err", err)
			}
		}
		l.qmu.Lock()
		lead := !l.flushing && len(l.queue) > 0
		l.flushing = l.flushing || lead
		l.qmu.Unlock()
		if lead {
			l.flush(ctx)
		}
	}
}

// flush appends everything queued, batch by batch, until the queue is empty
// or a batch failed flushRetries times. The caller set l.flushing.
func (l *Log) flush(ctx context.Context) {
	var since int64 // after a failed insert: the first seq it may have stored
	failures := 0
	for {
		l.qmu.Lock()
		n := min(len(l.queue), maxBatch)
		batch := slices.Clone(l.queue[:n])
		l.queue = l.queue[n:]
		l.inflight = n
		if n == 0 {
			l.flushing = false
			l.qmu.Unlock()
			return
		}
		l.qmu.Unlock()

		bctx, cancel := context.WithTimeout(ctx, batchTimeout)
		rest, from, err := l.appendBatch(bctx, batch, since)
		cancel()
		since = from
		if err == nil {
			failures = 0
			l.qmu.Lock()
			l.inflight = 0
			l.qmu.Unlock()
			continue
		}
		failures++
		l.log.Warn("append to the change log; will retry", "changes", len(rest), "attempt", failures, "err", err)
		keep := rest
		if failures >= flushRetries || ctx.Err() != nil {
			keep = keep[:0]
			for _, it := range rest {
				if it.ref.Collection == "" {
					l.finish(it, node.LogEntry{}, err) // held nowhere else: its caller learns
				} else {
					keep = append(keep, it) // durable in its outbox: retried by Run
				}
			}
		}
		l.qmu.Lock()
		l.queue = append(keep, l.queue...)
		l.inflight = 0
		stop := failures >= flushRetries || ctx.Err() != nil
		if stop {
			l.flushing = false
		}
		l.qmu.Unlock()
		if stop {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(failures) * 100 * time.Millisecond):
		}
	}
}

// appendBatch appends batch as consecutive entries and clears their
// outboxes. since > 0 says an earlier insert from seq since may have stored
// some of them: those found there are not appended again. It returns the
// changes not appended and, on error, the first seq its failed insert
// attempted (or since).
func (l *Log) appendBatch(ctx context.Context, batch []*item, since int64) ([]*item, int64, error) {
	for range maxAppendAttempts {
		if since > 0 {
			var err error
			if batch, err = l.dropLanded(ctx, batch, since); err != nil {
				return batch, since, err
			}
			if len(batch) == 0 {
				return nil, 0, nil
			}
		}
		seq, prev, err := l.appendHead(ctx, since > 0)
		if err != nil {
			return batch, since, err
		}
		if prev == "" {
			prev = node.ZeroHash
		}
		entries := make([]node.LogEntry, len(batch))
		docs := make([]any, len(batch))
		at := l.now().UTC()
		for i, it := range batch {
			e := it.p.entry(seq+1+int64(i), l.term, at, prev)
			if e.Hash, err = e.ComputeHash(); err != nil {
				return batch, since, fmt.Errorf("changelog: %w", err)
			}
			body, err := json.Marshal(e)
			if err != nil {
				return batch, since, fmt.Errorf("changelog: encode entry: %w", err)
			}
			entries[i], docs[i], prev = e, doc{Seq: e.Seq, Hash: e.Hash, Body: string(body), ChangeID: it.p.ID}, e.Hash
		}
		_, err = l.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(true))
		if err != nil {
			// Some prefix may be stored (another replica took a seq, or
			// the store failed mid-way): find what landed, then retry the
			// rest on the new head.
			since = seq + 1
			if ctx.Err() != nil {
				return batch, since, fmt.Errorf("changelog: store entries from %d: %w", seq+1, err)
			}
			continue
		}
		l.stored(batch, entries)
		return nil, 0, nil
	}
	return batch, since, ErrContention
}

// appendHead returns the seq and hash to append after: this Log's own head
// when it knows one (it is the only appender of its berthd, and an insert
// that finds the seq taken says otherwise), else the stored hint; after a
// failed insert (lagging), the head rolled forward over the stored entries.
// The embedded store looks up the string-keyed hint by index but scans for
// integer-keyed entries, so the common append reads nothing.
func (l *Log) appendHead(ctx context.Context, lagging bool) (int64, string, error) {
	if lagging {
		return l.Head(ctx)
	}
	l.mu.Lock()
	e, ok := l.tail[l.head]
	l.mu.Unlock()
	if ok {
		return e.Seq, e.Hash, nil
	}
	h, err := l.hint(ctx)
	if err != nil {
		return 0, "", err
	}
	return h.Seq, h.Hash, nil
}

// stored finishes a batch whose entries are in the log: keeps the entries
// in the tail, wakes followers, hands the housekeeping (the head hint,
// clearing each change from its outbox) to the cleaner ([Log.tidy]) and
// tells each waiter its entry without waiting for that housekeeping. What makes a change durable is its
// outbox and its entry; the hint is a hint and an outbox that still holds an
// appended change is cleared by [Log.Recover] by change id, so a waiter
// waits for neither (docs/node-protocol.md section 7.2.1).
func (l *Log) stored(batch []*item, entries []node.LogEntry) {
	if len(entries) == 0 {
		return
	}
	for _, e := range entries {
		l.remember(e)
	}
	l.sawHead(entries[len(entries)-1].Seq)
	l.notify()
	// Queued before the waiters are told, so that anything a waiter's
	// caller queues next (a write of the same document) comes after it.
	c := chore{head: entries[len(entries)-1], clears: make([]clear, 0, len(batch))}
	for i, it := range batch {
		c.clears = append(c.clears, clear{ref: it.ref, p: it.p, seq: entries[i].Seq})
	}
	l.tidy(c)
	for i, it := range batch {
		l.finish(it, entries[i], nil)
	}
}

// dropLanded finishes the items of batch whose entries are stored from seq
// since on, and returns the others.
func (l *Log) dropLanded(ctx context.Context, batch []*item, since int64) ([]*item, error) {
	byID := make(map[string]*item, len(batch))
	for _, it := range batch {
		byID[it.p.ID] = it
	}
	cur, err := l.coll.Find(ctx, bson.M{"_id": bson.M{"$gte": since}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return batch, fmt.Errorf("changelog: read entries from %d: %w", since, err)
	}
	var docs []doc
	if err := cur.All(ctx, &docs); err != nil {
		return batch, fmt.Errorf("changelog: read entries from %d: %w", since, err)
	}
	var c chore
	type found1 struct {
		it *item
		e  node.LogEntry
	}
	var found []found1
	for _, d := range docs {
		it, ok := byID[d.ChangeID]
		if !ok || d.ChangeID == "" {
			continue
		}
		var e node.LogEntry
		if err := json.Unmarshal([]byte(d.Body), &e); err != nil {
			return batch, fmt.Errorf("changelog: decode entry %d: %w", d.Seq, err)
		}
		l.remember(e)
		c.clears = append(c.clears, clear{ref: it.ref, p: it.p, seq: e.Seq})
		found = append(found, found1{it, e})
		delete(byID, d.ChangeID)
	}
	if len(docs) > 0 {
		l.notify()
	}
	l.tidy(c)
	for _, f := range found {
		l.finish(f.it, f.e, nil)
	}
	rest := batch[:0:0]
	for _, it := range batch {
		if _, ok := byID[it.p.ID]; ok {
			rest = append(rest, it)
		}
	}
	return rest, nil
}

// outboxDoc is what [Log.Recover] reads of a document with an outbox.
type outboxDoc struct {
	ID       any       `bson:"_id"`
	Outbox   []Pending `bson:"log_outbox"`
	RemoveOn string    `bson:"log_remove_on"`
}

// Recover completes what a berthd that stopped (or died) between a write and
// its entry left: every change still in a tracked outbox is appended, once.
// It reads each tracked collection's documents that carry an outbox (one
// query each, at start), and finds which of their changes are already in
// the log (one query over the log, only when any are pending); those are
// only cleared. It returns once what it found is cleared from its outboxes.
// Call it before serving writes. Returns how many entries it appended.
//
// Recover takes every pending change, also one another berthd replica is
// appending right now: with several replicas, use [Log.RecoverOlderThan].
func (l *Log) Recover(ctx context.Context) (int, error) {
	return l.RecoverOlderThan(ctx, 0)
}

// RecoverOlderThan is [Log.Recover] for changes made at least age ago: a
// change younger than that may still be on its way through another
// replica's queue, and two replicas appending one change would record it
// twice. [Log.Run] uses [RecoverAge].
func (l *Log) RecoverOlderThan(ctx context.Context, age time.Duration) (int, error) {
	return l.recoverOlderThan(ctx, age, true)
}

// recoverOlderThan is [Log.RecoverOlderThan]; cleared says whether it
// returns only once what it found is cleared ([Log.Run]'s periodic pass
// does not wait: its appends must not stall behind housekeeping).
func (l *Log) recoverOlderThan(ctx context.Context, age time.Duration, cleared bool) (int, error) {
	cutoff := l.now().UTC().Add(-age)
	l.qmu.Lock()
	colls := make(map[string]string, len(l.outboxes))
	for c, f := range l.outboxes {
		colls[c] = f
	}
	l.qmu.Unlock()
	var items []*item
	for c, field := range colls {
		cur, err := l.st.Collection(c).Find(ctx, bson.M{OutboxField: bson.M{"$exists": true}},
			options.Find().SetProjection(bson.M{OutboxField: 1, RemoveOnField: 1}))
		if err != nil {
			return 0, fmt.Errorf("changelog: find outboxes in %s: %w", c, err)
		}
		var docs []outboxDoc
		if err := cur.All(ctx, &docs); err != nil {
			return 0, fmt.Errorf("changelog: find outboxes in %s: %w", c, err)
		}
		for _, d := range docs {
			for _, p := range d.Outbox {
				if age > 0 && p.At.After(cutoff) {
					continue
				}
				items = append(items, &item{p: p, ref: Ref{Collection: c, ID: d.ID, SeqField: field, RemoveOn: d.RemoveOn}, done: make(chan struct{})})
			}
		}
	}
	if len(items) == 0 {
		return 0, nil
	}
	ids := make([]string, 0, len(items))
	for _, it := range items {
		ids = append(ids, it.p.ID)
	}
	cur, err := l.coll.Find(ctx, bson.M{"change_id": bson.M{"$in": ids}})
	if err != nil {
		return 0, fmt.Errorf("changelog: find recovered changes in the log: %w", err)
	}
	var landed []doc
	if err := cur.All(ctx, &landed); err != nil {
		return 0, fmt.Errorf("changelog: find recovered changes in the log: %w", err)
	}
	seqOf := make(map[string]int64, len(landed))
	for _, d := range landed {
		seqOf[d.ChangeID] = d.Seq
	}
	todo := items[:0]
	seen := map[string]bool{}
	var c chore
	for _, it := range items {
		if seq, ok := seqOf[it.p.ID]; ok {
			// Appended before its outbox was cleared (berthd stopped
			// between the two): only cleared now, never appended again.
			c.clears = append(c.clears, clear{ref: it.ref, p: it.p, seq: seq})
			continue
		}
		if seen[it.p.ID] { // the same change in two documents' outboxes: append once
			continue
		}
		seen[it.p.ID] = true
		todo = append(todo, it)
	}
	slices.SortStableFunc(todo, func(a, b *item) int { return cmp.Compare(a.p.ID, b.p.ID) }) // ULIDs: creation order
	// Queue them like any change: one this berthd queued or appended
	// meanwhile (a write that committed since the query) is not queued twice.
	var mine []*item
	var done []*item
	l.qmu.Lock()
	for _, it := range todo {
		if seq, ok := l.recent[it.p.ID]; ok {
			it.entry.Seq = seq
			done = append(done, it)
			continue
		}
		if _, ok := l.queued[it.p.ID]; ok {
			continue
		}
		l.queued[it.p.ID] = it
		l.queue = append(l.queue, it)
		mine = append(mine, it)
	}
	lead := !l.flushing && len(l.queue) > 0
	l.flushing = l.flushing || lead
	l.qmu.Unlock()
	for _, it := range done {
		c.clears = append(c.clears, clear{ref: it.ref, p: it.p, seq: it.entry.Seq})
	}
	l.tidy(c)
	if lead {
		l.flush(ctx)
	}
	for _, it := range mine {
		if _, err := l.wait(ctx, it); err != nil {
			return 0, fmt.Errorf("changelog: append recovered changes: %w", err)
		}
	}
	// What recovery found is cleared before it returns: the start reads
	// no outbox it has just dealt with again.
	if cleared {
		if err := l.Cleared(ctx); err != nil {
			return len(mine), fmt.Errorf("changelog: clear recovered changes: %w", err)
		}
	}
	if len(mine) == 0 {
		return 0, nil
	}
	l.log.Info("appended changes a previous run left pending", "entries", len(mine), "already_in_log", len(seqOf)+len(done))
	return len(mine), nil
}
