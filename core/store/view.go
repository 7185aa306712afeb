package store

// The read view: an in-memory copy of the collections berthd's loops and read-only handlers read,
// kept current from committed writes, so a read costs no round trip (docs/store.md).
//
// How a write reaches the view, and why none is missed:
//
//  1. Every command of the Store's client passes the driver's command monitor (event.CommandMonitor,
//     installed by Open before the client connects; there is no other client). A write command
//     (insert, update, delete, findAndModify) is parsed when it is sent: each statement's filter
//     names the _id it touches (an equality, $eq or $in on _id; an insert names its documents'
//     _id). A statement whose filter names no _id, and every command the view does not know to be a
//     read (drop, dropDatabase, renameCollection, bulkWrite, ...), marks its collection (or every
//     collection) for a full reload instead. So the set of documents a write may have changed is
//     always covered, whatever the caller's code path.
//  2. When the command finishes, succeeded or failed (a failed or timed-out write may still have
//     been applied), its ids are queued with a sequence number, in finish order. A failed write is
//     queued a second time a moment later, for a server that applies it after the connection broke.
//  3. One goroutine (the refresher) takes the queue in order and re-reads each named document by
//     _id from the store (or reloads the marked collections) and installs what it read: the
//     document, or its absence. It reads after the write finished, so it reads that write or a
//     later one. Re-reads are issued one at a time by that single goroutine and installed in the
//     order they were read, so a document's state in the view only moves forward in the store's
//     revision order, even when the re-read of one write races a later write of the same
//     document: the view then holds the later state at once, and the later write's own re-read
//     installs the same or a newer one.
//  4. A read from the view first waits until every write that finished before the read began has
//     been re-read (the applied sequence reaches the finished sequence seen at the start), so a
//     caller reads its own writes and never goes back in time.
//
// Against a MongoDB replica set other berthd processes write too: a change stream on the database
// names the documents they change (resumed by its token after an error); the refresher re-reads
// those the same way. When the token is lost (the oplog moved on, or the stream was invalidated)
// the view opens a new stream first and then reloads every loaded collection, so nothing between
// the two is missed.
//
// A collection is loaded on its first read and kept current from then on. The view is off
// (reads go to the store) when the store may have writers it cannot see: FerretDB behind a URI,
// a MongoDB server that is not a replica set (no change streams), and an embedded store whose
// URI was handed out ([Store.EmbeddedURI]).
//
// Decisions never trust the view alone: every decision is one compare-and-set on the store with
// the revision read from the view as the expected one. A stale view costs a refused CAS; the
// refusal re-reads the document into the view ([Store.UpdateIfRevision]) and the retry reads it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// failedRecheck is how long after a failed write its documents are re-read a second time.
const failedRecheck = time.Second

// refreshRetry bounds the refresher's retries of a re-read that failed before it gives up on the
// collection (drops it from the view, so its next read loads it again).
const refreshRetry = 3

// View is the read view of one database of a [Store]; see the comment at the top of view.go.
// Obtain it with [Store.View]. Safe for concurrent use. Reads decode fresh values, so callers own
// what they get.
type View struct {
	database string
	log      *slog.Logger
	enabled  atomic.Bool
	db       *mongo.Database // set by Open once the client exists

	// pending maps a started write command (connection id and request id) to what it touches.
	pendingMu sync.Mutex
	pending   map[string]touch

	mu       sync.RWMutex
	colls    map[string]*viewColl // loaded collections; mu must be held
	queue    []touch              // finished writes not yet re-read; mu must be held
	finished uint64               // sequence of the last queued write; mu must be held
	applied  uint64               // every queued write up to this sequence is installed; mu must be held
	changed  chan struct{}        // closed and replaced when applied or queue moves; mu must be held
	loading  map[string]bool      // collections queued for loading; mu must be held

	loads   atomic.Int64 // full loads done (tests and metrics)
	rereads atomic.Int64 // documents re-read
}

// touch is what one write may have changed: ids of one collection, or whole collections.
type touch struct {
	seq    uint64
	coll   string
	ids    []bson.RawValue
	reload bool // reload coll
	all    bool // reload every loaded collection
	load   bool // a read asks to load coll
	failed bool // the write failed: re-read again after failedRecheck
}

// viewColl is one loaded collection.
type viewColl struct {
	docs   map[string]bson.Raw // by idKey
	sorted []string            // keys in _id order; nil when stale
}

func newView(database string, log *slog.Logger) *View {
	return &View{
		database: database,
		log:      log,
		pending:  map[string]touch{},
		colls:    map[string]*viewColl{},
		loading:  map[string]bool{},
		changed:  make(chan struct{}),
	}
}

// Enabled reports whether reads are answered from memory; when not, every read goes to the store.
func (v *View) Enabled() bool { return v != nil && v.enabled.Load() }

// disable turns the view off for good: reads go to the store from now on.
func (v *View) disable(reason string) {
	if v.enabled.Swap(false) {
		v.log.Info("store: read view off; reads go to the store", "reason", reason)
	}
}

// Loads returns how many full collection loads the view has done (a lost feed costs one per
// loaded collection).
func (v *View) Loads() int64 { return v.loads.Load() }

// Rereads returns how many documents the view has re-read after writes.
func (v *View) Rereads() int64 { return v.rereads.Load() }

// monitor returns the command monitor Open installs on the client.
func (v *View) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if !v.enabled.Load() {
				return
			}
			t, ok := parseWrite(e.CommandName, e.Command, v.database)
			if !ok {
				return
			}
			v.pendingMu.Lock()
			v.pending[e.ConnectionID+"/"+fmt.Sprint(e.RequestID)] = t
			v.pendingMu.Unlock()
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
			v.finish(e.ConnectionID, e.RequestID, false)
		},
		Failed: func(_ context.Context, e *event.CommandFailedEvent) {
			v.finish(e.ConnectionID, e.RequestID, true)
		},
	}
}

// finish queues the touch of a finished write command.
func (v *View) finish(conn string, req int64, failed bool) {
	key := conn + "/" + fmt.Sprint(req)
	v.pendingMu.Lock()
	t, ok := v.pending[key]
	delete(v.pending, key)
	v.pendingMu.Unlock()
	if !ok {
		return
	}
	t.failed = failed
	v.enqueue(t)
	if failed {
		time.AfterFunc(failedRecheck, func() { t.failed = false; v.enqueue(t) })
	}
}

// enqueue appends t to the refresher's queue and returns its sequence.
func (v *View) enqueue(t touch) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.finished++
	t.seq = v.finished
	v.queue = append(v.queue, t)
	v.notifyLocked()
	return t.seq
}

// notifyLocked wakes every waiter. mu must be held.
func (v *View) notifyLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// waitApplied blocks until every write queued up to seq is installed, or ctx ends.
func (v *View) waitApplied(ctx context.Context, seq uint64) error {
	for {
		v.mu.RLock()
		done, ch := v.applied >= seq, v.changed
		v.mu.RUnlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("store: wait for the read view: %w", ctx.Err())
		}
	}
}

// ready returns once collection name is loaded (loading it first when needed) and every write
// that finished before the call is installed in it.
func (v *View) ready(ctx context.Context, name string) error {
	v.mu.Lock()
	target := v.finished
	if _, ok := v.colls[name]; !ok && !v.loading[name] {
		v.loading[name] = true
		v.finished++
		target = v.finished
		v.queue = append(v.queue, touch{seq: target, coll: name, load: true})
		v.notifyLocked()
	} else if v.loading[name] {
		// A load is queued: wait for everything queued so far, which includes it.
		target = v.finished
	}
	v.mu.Unlock()
	return v.waitApplied(ctx, target)
}

// run is the refresher: it installs queued writes in order until ctx ends.
func (v *View) run(ctx context.Context) {
	for {
		v.mu.Lock()
		batch := v.queue
		v.queue = nil
		ch := v.changed
		v.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				v.mu.Lock()
				v.applied = math.MaxUint64 // release every waiter; reads go to the store now
				v.notifyLocked()
				v.mu.Unlock()
				return
			case <-ch:
				continue
			}
		}
		v.apply(ctx, batch)
		v.mu.Lock()
		v.applied = batch[len(batch)-1].seq
		v.notifyLocked()
		v.mu.Unlock()
	}
}

// apply installs one batch of touches: loads and reloads first (each reads the collection as it
// is now, which covers every earlier write to it), then one re-read per distinct document.
func (v *View) apply(ctx context.Context, batch []touch) {
	reload := map[string]bool{}
	ids := map[string]map[string]bson.RawValue{}
	var order []string
	for _, t := range batch {
		switch {
		case t.all:
			v.mu.RLock()
			for name := range v.colls {
				reload[name] = true
			}
			v.mu.RUnlock()
		case t.load || t.reload:
			reload[t.coll] = true
		default:
			m := ids[t.coll]
			if m == nil {
				m = map[string]bson.RawValue{}
				ids[t.coll] = m
			}
			for _, id := range t.ids {
				k := idKey(id)
				if _, ok := m[k]; !ok {
					order = append(order, t.coll+"\x00"+k)
				}
				m[k] = id
			}
		}
	}
	for name := range reload {
		v.mu.RLock()
		_, loaded := v.colls[name]
		wanted := loaded || v.loading[name]
		v.mu.RUnlock()
		if !wanted {
			continue
		}
		if err := v.load(ctx, name); err != nil {
			v.log.Warn("store: read view could not load a collection; it is read from the store again on next use",
				"collection", name, "err", err)
			v.drop(name)
		}
	}
	for _, ck := range order {
		name, k, _ := strings.Cut(ck, "\x00")
		if reload[name] {
			continue // just loaded whole
		}
		v.mu.RLock()
		_, loaded := v.colls[name]
		v.mu.RUnlock()
		if !loaded {
			continue
		}
		if err := v.reread(ctx, name, ids[name][k]); err != nil {
			v.log.Warn("store: read view could not re-read a document; dropping the collection from the view",
				"collection", name, "err", err)
			v.drop(name)
		}
	}
}

// load reads collection name whole and installs it.
func (v *View) load(ctx context.Context, name string) error {
	var docs map[string]bson.Raw
	var err error
	for attempt := 0; attempt < refreshRetry; attempt++ {
		if docs, err = v.readAll(ctx, name); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.colls[name] = &viewColl{docs: docs}
	delete(v.loading, name)
	v.mu.Unlock()
	v.loads.Add(1)
	return nil
}

func (v *View) readAll(ctx context.Context, name string) (map[string]bson.Raw, error) {
	cur, err := v.db.Collection(name).Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("store: load %s into the read view: %w", name, err)
	}
	defer cur.Close(ctx)
	docs := map[string]bson.Raw{}
	for cur.Next(ctx) {
		raw := slices.Clone(cur.Current)
		id, err := raw.LookupErr("_id")
		if err != nil {
			return nil, fmt.Errorf("store: load %s into the read view: a document without _id", name)
		}
		docs[idKey(id)] = raw
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("store: load %s into the read view: %w", name, err)
	}
	return docs, nil
}

// reread reads one document by _id and installs it or its absence.
func (v *View) reread(ctx context.Context, name string, id bson.RawValue) error {
	var raw bson.Raw
	var err error
	for attempt := 0; attempt < refreshRetry; attempt++ {
		raw, err = v.db.Collection(name).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
		if err == nil || errors.Is(err, mongo.ErrNoDocuments) || ctx.Err() != nil {
			break
		}
	}
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("store: re-read %s %s: %w", name, id, err)
	}
	v.rereads.Add(1)
	k := idKey(id)
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.colls[name]
	if c == nil {
		return nil
	}
	_, had := c.docs[k]
	if raw == nil {
		delete(c.docs, k)
	} else {
		c.docs[k] = slices.Clone(raw)
	}
	if had != (raw != nil) {
		c.sorted = nil
	}
	return nil
}

// drop forgets collection name; its next read loads it again.
func (v *View) drop(name string) {
	v.mu.Lock()
	delete(v.colls, name)
	delete(v.loading, name)
	v.mu.Unlock()
}

// Invalidate re-reads the document {_id: id} of coll into the view and returns once it is
// installed (or ctx ends). [Store.UpdateIfRevision] calls it after a refused compare-and-set so
// the retry reads what won. A no-op when the view is off.
func (v *View) Invalidate(ctx context.Context, coll *mongo.Collection, id any) error {
	if !v.Enabled() {
		return nil
	}
	t, data, err := bson.MarshalValue(id)
	if err != nil {
		return fmt.Errorf("store: invalidate %s %v: %w", coll.Name(), id, err)
	}
	seq := v.enqueue(touch{coll: coll.Name(), ids: []bson.RawValue{{Type: t, Value: data}}})
	return v.waitApplied(ctx, seq)
}

// ResyncForTest forgets every loaded collection as a lost feed does, so each is loaded again on
// its next read.
func (v *View) ResyncForTest(ctx context.Context) error {
	seq := v.enqueue(touch{all: true})
	return v.waitApplied(ctx, seq)
}

// CorruptForTest overwrites the view's copy of one document without touching the store (raw nil
// removes it), so tests can make the view stale on purpose.
func (v *View) CorruptForTest(coll string, id any, raw bson.Raw) {
	t, data, _ := bson.MarshalValue(id)
	k := idKey(bson.RawValue{Type: t, Value: data})
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.colls[coll]
	if c == nil {
		return
	}
	if raw == nil {
		delete(c.docs, k)
	} else {
		c.docs[k] = slices.Clone(raw)
	}
	c.sorted = nil
}

// Get decodes the document {_id: id} of coll into out, from the view when it is on and from the
// store otherwise. Errors: wrapping [ErrNotFound] when there is none; ctx's error when the view
// could not catch up before ctx ended. Cost with the view on: one map lookup and one decode.
func (v *View) Get(ctx context.Context, coll *mongo.Collection, id any, out any) error {
	if !v.Enabled() {
		return FindByID(ctx, coll, id, out)
	}
	if err := v.ready(ctx, coll.Name()); err != nil {
		return err
	}
	if !v.Enabled() {
		return FindByID(ctx, coll, id, out)
	}
	t, data, err := bson.MarshalValue(id)
	if err != nil {
		return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, err)
	}
	v.mu.RLock()
	c := v.colls[coll.Name()]
	var raw bson.Raw
	if c != nil {
		raw = c.docs[idKey(bson.RawValue{Type: t, Value: data})]
	}
	v.mu.RUnlock()
	if c == nil {
		// Dropped meanwhile after a failed refresh: read the store.
		return FindByID(ctx, coll, id, out)
	}
	if raw == nil {
		return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, ErrNotFound)
	}
	if err := bson.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("store: decode %s %v: %w", coll.Name(), id, err)
	}
	return nil
}

// Find decodes into out (a pointer to a slice) the documents of coll whose top-level fields
// equal the values in eq (nil or empty: every document), in _id order, from the view when it is
// on and from the store otherwise. eq follows MongoDB equality: integers compare by value
// whatever their width, and a nil value matches a missing field. Cost with the view on: one pass
// over the collection's raw documents and one decode per match.
func (v *View) Find(ctx context.Context, coll *mongo.Collection, eq bson.D, out any) error {
	return v.FindSorted(ctx, coll, eq, nil, out)
}

// FindSorted is [View.Find] ordered by the top-level fields of sort (1 ascending, -1
// descending), then by _id. Values compare as numbers when both are numbers, as strings when both
// are strings, and otherwise by BSON type number (a missing field first), which is MongoDB's
// order for the values Berth sorts on.
func (v *View) FindSorted(ctx context.Context, coll *mongo.Collection, eq bson.D, sort bson.D, out any) error {
	if !v.Enabled() {
		return findStore(ctx, coll, eq, sort, out)
	}
	if err := v.ready(ctx, coll.Name()); err != nil {
		return err
	}
	if !v.Enabled() {
		return findStore(ctx, coll, eq, sort, out)
	}
	want := make([]bson.RawValue, len(eq))
	for i, e := range eq {
		t, data, err := bson.MarshalValue(e.Value)
		if err != nil {
			return fmt.Errorf("store: find in %s: field %s: %w", coll.Name(), e.Key, err)
		}
		want[i] = bson.RawValue{Type: t, Value: data}
	}
	var matches []bson.Raw
	v.mu.Lock()
	c := v.colls[coll.Name()]
	if c != nil && c.sorted == nil {
		c.sorted = sortedKeys(c.docs) // rebuilt after an insert or a delete
	}
	v.mu.Unlock()
	v.mu.RLock()
	if c = v.colls[coll.Name()]; c != nil {
		keys := c.sorted
		if keys == nil { // changed between the two locks: take this read in any order, sorted below
			keys = sortedKeys(c.docs)
		}
		for _, k := range keys {
			if raw, ok := c.docs[k]; ok && matchesRaw(raw, eq, want) {
				matches = append(matches, raw)
			}
		}
	}
	v.mu.RUnlock()
	if c == nil {
		return findStore(ctx, coll, eq, sort, out)
	}
	if len(sort) > 0 {
		sortRaw(matches, sort)
	}
	return decodeAll(coll.Name(), matches, out)
}

// decodeAll decodes raws into out, a pointer to a slice, replacing its contents.
func decodeAll(name string, raws []bson.Raw, out any) error {
	pv := reflect.ValueOf(out)
	if pv.Kind() != reflect.Pointer || pv.Elem().Kind() != reflect.Slice {
		return fmt.Errorf("store: find in %s: out must be a pointer to a slice, got %T", name, out)
	}
	sv := pv.Elem()
	res := reflect.MakeSlice(sv.Type(), len(raws), len(raws))
	for i, raw := range raws {
		if err := bson.Unmarshal(raw, res.Index(i).Addr().Interface()); err != nil {
			return fmt.Errorf("store: decode %s: %w", name, err)
		}
	}
	sv.Set(res)
	return nil
}

// findStore is [View.Find] against the store.
func findStore(ctx context.Context, coll *mongo.Collection, eq bson.D, sort bson.D, out any) error {
	filter := eq
	if filter == nil {
		filter = bson.D{}
	}
	order := append(slices.Clone(sort), bson.E{Key: "_id", Value: 1})
	cur, err := coll.Find(ctx, filter, options.Find().SetSort(order))
	if err != nil {
		return fmt.Errorf("store: find in %s: %w", coll.Name(), err)
	}
	if err := cur.All(ctx, out); err != nil {
		return fmt.Errorf("store: find in %s: %w", coll.Name(), err)
	}
	return nil
}

// sortRaw orders raws by the fields of sort, stably (raws come in _id order).
func sortRaw(raws []bson.Raw, sort bson.D) {
	slices.SortStableFunc(raws, func(a, b bson.Raw) int {
		for _, e := range sort {
			dir := 1
			switch n := e.Value.(type) {
			case int:
				dir = cmpInt(int64(n), 0) | 1
			case int32:
				dir = cmpInt(int64(n), 0) | 1
			case int64:
				dir = cmpInt(n, 0) | 1
			}
			if c := compareRaw(a.Lookup(e.Key), b.Lookup(e.Key)); c != 0 {
				return c * dir
			}
		}
		return 0
	})
}

// compareRaw orders two values (a missing one is the zero RawValue) for [sortRaw].
func compareRaw(a, b bson.RawValue) int {
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			switch {
			case fa < fb:
				return -1
			case fa > fb:
				return 1
			}
			return 0
		}
	}
	if a.Type == bson.TypeString && b.Type == bson.TypeString {
		return strings.Compare(a.StringValue(), b.StringValue())
	}
	if a.Type != b.Type {
		return int(a.Type) - int(b.Type)
	}
	return bytes.Compare(a.Value, b.Value)
}

// matchesRaw reports whether every field of eq equals its value in raw.
func matchesRaw(raw bson.Raw, eq bson.D, want []bson.RawValue) bool {
	for i, e := range eq {
		got, err := raw.LookupErr(e.Key)
		if err != nil {
			if want[i].Type == bson.TypeNull {
				continue // {f: null} matches a missing field
			}
			return false
		}
		if !sameRaw(got, want[i]) {
			return false
		}
	}
	return true
}

// sameRaw compares two BSON values as a MongoDB equality does for the types Berth filters on:
// numbers by value whatever their type, everything else by type and bytes.
func sameRaw(a, b bson.RawValue) bool {
	if fa, ok := number(a); ok {
		fb, ok := number(b)
		return ok && fa == fb
	}
	return a.Type == b.Type && bytes.Equal(a.Value, b.Value)
}

func number(v bson.RawValue) (float64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32()), true
	case bson.TypeInt64:
		return float64(v.Int64()), true
	case bson.TypeDouble:
		return v.Double(), true
	}
	return math.NaN(), false
}

// idKey is the map key of an _id value: its type and bytes (strings by their text, so keys of
// string ids sort as the strings do).
func idKey(id bson.RawValue) string {
	if id.Type == bson.TypeString {
		return "\x02" + id.StringValue()
	}
	return string([]byte{byte(id.Type)}) + string(id.Value)
}

// sortedKeys returns the keys of docs in _id order (strings as strings, numbers by value, other
// types by type and bytes).
func sortedKeys(docs map[string]bson.Raw) []string {
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		switch bson.Type(a[0]) {
		case bson.TypeInt64:
			x, y := bson.RawValue{Type: bson.TypeInt64, Value: []byte(a[1:])}, bson.RawValue{Type: bson.TypeInt64, Value: []byte(b[1:])}
			return cmpInt(x.Int64(), y.Int64())
		case bson.TypeInt32:
			x, y := bson.RawValue{Type: bson.TypeInt32, Value: []byte(a[1:])}, bson.RawValue{Type: bson.TypeInt32, Value: []byte(b[1:])}
			return cmpInt(int64(x.Int32()), int64(y.Int32()))
		}
		return strings.Compare(a, b)
	})
	return keys
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
