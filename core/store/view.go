package store

// The read view: an in-memory copy of the collections berthd's loops and read-only handlers read,
// kept current from committed writes, so most reads cost no round trip (docs/store.md).
//
// How a write reaches the view, and why none is missed:
//
//  1. Every command of the Store's client passes the driver's command monitor (event.CommandMonitor,
//     installed by Open before the client connects; there is no other client). A write command
//     (insert, update, delete, findAndModify) is parsed when it is sent: each statement's filter
//     names the _id it touches (an equality, $eq or $in on _id; an insert names its documents'
//     _id). A statement whose filter names no _id, and every command the view does not know to be a
//     read (drop, dropDatabase, renameCollection, bulkWrite, ...), names its collection (or every
//     collection) whole instead. So the set of documents a write may have changed is always
//     covered, whatever the caller's code path.
//  2. When the command finishes, succeeded or failed (a failed or timed-out write may still have
//     been applied), and before the driver returns to the writer, what it named is marked stale in
//     the view. A failed write is marked a second time a moment later, for a server that applies
//     it after the connection broke.
//  3. A read that meets a stale document (or a collection marked whole) re-reads it from the
//     store by _id (or reloads the collection) before answering. The re-read starts after the
//     mark, so after the write finished, and sees that write or a later one; a caller therefore
//     always reads its own writes and every write finished before its read.
//  4. A re-read is installed only if no newer mark arrived while it was in flight (each mark
//     gives the document a new version), so concurrent readers never install an older state over a
//     newer one: when the re-read of one write races a later write of the same document, the later
//     write's mark wins and the next read re-reads again. The document's state in the view only
//     moves forward in the store's order.
//
// A write thus costs nothing extra, and a read costs a round trip only for a document written
// since it was last read. Against a MongoDB replica set other berthd processes write too: a change
// stream on the database names the documents they change, and those are marked the same way
// (resumed by its token after an error). When the token is lost (the oplog moved on, or the stream
// was invalidated) the view opens a new stream first and then marks every loaded collection whole,
// so nothing between the two is missed.
//
// A collection is loaded on its first read and kept current from then on. The view is off
// (reads go to the store) when the store may have writers it cannot see: FerretDB behind a URI,
// a MongoDB server that is not a replica set (no change streams), and an embedded store whose
// URI was handed out ([Store.EmbeddedURI]).
//
// Decisions never trust the view alone: every decision is one compare-and-set on the store with
// the revision read from the view as the expected one. A stale view costs a refused CAS; the
// refusal marks the document ([Store.UpdateIfRevision], or the monitor for a filtered update) and
// the retry re-reads it.

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
	"golang.org/x/sync/singleflight"
)

// failedRecheck is how long after a failed write its documents are marked a second time.
const failedRecheck = time.Second

// readAttempts bounds how often a read retries a re-read or load that a newer mark overtook
// before it answers from the store directly.
const readAttempts = 3

// reloadAbove is how many stale documents a filtered read re-reads one by one; with more, it
// reloads the collection.
const reloadAbove = 64

// View is the read view of one database of a [Store]; see the comment at the top of view.go.
// Obtain it with [Store.View]. Safe for concurrent use. Reads decode fresh values, so callers own
// what they get.
type View struct {
	database string
	log      *slog.Logger
	enabled  atomic.Bool
	db       *mongo.Database // what re-reads and loads read; set by Open once the client exists

	// pending maps a started write command (connection id and request id) to what it touches.
	pendingMu sync.Mutex
	pending   map[string]touch

	mu    sync.RWMutex
	colls map[string]*viewColl // loaded collections; mu must be held
	marks uint64               // counts document marks, so each mark's version is unique; mu must be held

	// subs are the write subscriptions (viewsub.go); subscribed reports whether there is one, so
	// the monitor parses writes for them even with the view off.
	subsMu     sync.Mutex
	subs       map[*Subscription]struct{}
	subscribed atomic.Bool

	// loading makes concurrent loads of one collection one load.
	loading singleflight.Group

	loads   atomic.Int64 // full loads done (tests and metrics)
	rereads atomic.Int64 // documents re-read

	// folds are the plan entries durable but not yet materialized (viewfold.go).
	folds folds
}

// touch is what one write may have changed: ids of one collection, or whole collections.
type touch struct {
	coll   string
	ids    []bson.RawValue
	reload bool // the whole of coll
	all    bool // every loaded collection
}

// viewColl is one loaded collection. Every field is guarded by View.mu.
type viewColl struct {
	docs   map[string]bson.Raw // by idKey
	sorted []string            // keys in _id order; nil when stale
	// stale holds the documents to re-read before use, and ver the version of each one's last
	// mark (unique across the view, so forgetting it after an install cannot make an old
	// version come back), so a re-read is installed only when no mark arrived while in flight.
	stale map[string]bson.RawValue
	ver   map[string]uint64
	// whole reports whether the collection must be loaded again before use (never loaded, or a
	// write named no _id); wholeGen counts those marks the same way.
	whole    bool
	wholeGen uint64
	// loaded reports whether the collection was loaded at least once, so that a whole mark
	// since then is caught up by one background load while single reads go by _id.
	loaded bool
}

func newView(database string, log *slog.Logger) *View {
	return &View{
		database: database,
		log:      log,
		pending:  map[string]touch{},
		colls:    map[string]*viewColl{},
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
// loaded collection on its next read).
func (v *View) Loads() int64 { return v.loads.Load() }

// Rereads returns how many documents the view has re-read after writes.
func (v *View) Rereads() int64 { return v.rereads.Load() }

// monitor returns the command monitor Open installs on the client.
func (v *View) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if !v.enabled.Load() && !v.subscribed.Load() {
				return
			}
			t, ok := parseWrite(e.CommandName, e.Command, v.database)
			if !ok {
				return
			}
			v.pendingMu.Lock()
			v.pending[pendingKey(e.ConnectionID, e.RequestID)] = t
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

func pendingKey(conn string, req int64) string { return fmt.Sprintf("%s/%d", conn, req) }

// finish marks what a finished write command named.
func (v *View) finish(conn string, req int64, failed bool) {
	key := pendingKey(conn, req)
	v.pendingMu.Lock()
	t, ok := v.pending[key]
	delete(v.pending, key)
	v.pendingMu.Unlock()
	if !ok {
		return
	}
	v.mark(t)
	if failed {
		time.AfterFunc(failedRecheck, func() { v.mark(t) })
	}
}

// mark records t in the loaded collections it names (a collection not loaded has nothing to
// mark: its first read loads it after this write finished), then hands it to the write
// subscriptions (viewsub.go): after, so a subscriber's read re-reads what t names.
func (v *View) mark(t touch) {
	v.markDocs(t)
	v.notify(t)
}

// markDocs is mark without the subscriptions.
func (v *View) markDocs(t touch) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if t.all {
		for _, c := range v.colls {
			c.markWhole()
		}
		return
	}
	c := v.colls[t.coll]
	if c == nil {
		return
	}
	if t.reload {
		c.markWhole()
		return
	}
	for _, id := range t.ids {
		k := idKey(id)
		v.marks++
		c.stale[k] = id
		c.ver[k] = v.marks
	}
}

func (c *viewColl) markWhole() {
	c.whole = true
	c.wholeGen++
}

// loadTimeout bounds one shared load of a collection: it runs on its own context, since
// every reader waiting on it may give up while the others still want it.
const loadTimeout = time.Minute

// cursorCloseTimeout bounds closing a cursor whose read was cancelled: the close runs on a
// fresh context so the server still hears it and frees what the cursor held.
const cursorCloseTimeout = 5 * time.Second

// ensure returns once collection name is loaded and not marked whole, loading it when needed.
// It reports false when a load kept being overtaken by marks (the caller reads the store).
// Concurrent callers share one load of a collection ([View.load]).
func (v *View) ensure(ctx context.Context, name string) (bool, error) {
	for attempt := 0; attempt < readAttempts; attempt++ {
		v.mu.Lock()
		c := v.colls[name]
		if c == nil {
			c = &viewColl{docs: map[string]bson.Raw{}, stale: map[string]bson.RawValue{}, ver: map[string]uint64{}, whole: true}
			v.colls[name] = c
		}
		whole := c.whole
		v.mu.Unlock()
		if !whole {
			return true, nil
		}
		select {
		case r := <-v.load(name):
			if r.Err != nil {
				return false, r.Err
			}
		case <-ctx.Done():
			return false, fmt.Errorf("store: load %s into the read view: %w", name, ctx.Err())
		}
	}
	return false, nil
}

// load starts a load of collection name, or joins the one in flight, and returns where its
// result arrives. The load reads on its own bounded context, so a reader that gives up
// neither cancels it for the others nor leaves its cursor open. It installs what it read only
// if no whole mark arrived meanwhile; marks of single documents made while it read stay and
// are re-read on use.
func (v *View) load(name string) <-chan singleflight.Result {
	return v.loading.DoChan(name, func() (any, error) {
		v.mu.Lock()
		c := v.colls[name]
		if c == nil || !c.whole {
			v.mu.Unlock()
			return nil, nil
		}
		gen := c.wholeGen
		v.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
		defer cancel()
		docs, err := v.readAll(ctx, name)
		if err != nil {
			return nil, err
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		if cur := v.colls[name]; cur == c && c.wholeGen == gen {
			c.docs, c.sorted, c.whole, c.loaded = docs, nil, false, true
			v.loads.Add(1)
		}
		return nil, nil
	})
}

func (v *View) readAll(ctx context.Context, name string) (map[string]bson.Raw, error) {
	cur, err := v.db.Collection(name).Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("store: load %s into the read view: %w", name, err)
	}
	defer closeCursor(ctx, cur)
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

// closeCursor closes cur on a fresh context bounded by [cursorCloseTimeout], so a read
// abandoned because ctx ended still tells the server to free the cursor (and what it holds).
func closeCursor(ctx context.Context, cur *mongo.Cursor) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cursorCloseTimeout)
	defer cancel()
	_ = cur.Close(cctx)
}

// fresh returns the current state of document id of collection name (nil: absent), re-reading
// it when it is marked stale. A collection loaded once and since marked whole is not loaded
// again for one document: the document alone is re-read by _id, and one shared load is started
// in the background for the view to catch up. It reports false when the collection must be
// read from the store.
func (v *View) fresh(ctx context.Context, name string, id bson.RawValue) (bson.Raw, bool, error) {
	k := idKey(id)
	for attempt := 0; attempt < readAttempts; attempt++ {
		v.mu.RLock()
		c := v.colls[name]
		rewhole := c != nil && c.whole && c.loaded
		v.mu.RUnlock()
		if rewhole {
			v.load(name) // not awaited: the view catches up while this read goes by _id
			got, err := v.reread(ctx, name, id)
			if err != nil {
				return nil, false, err
			}
			return got, true, nil
		}
		if ok, err := v.ensure(ctx, name); !ok || err != nil {
			return nil, false, err
		}
		v.mu.RLock()
		c = v.colls[name]
		sid, stale := c.stale[k]
		raw, ver, gen, whole := c.docs[k], c.ver[k], c.wholeGen, c.whole
		v.mu.RUnlock()
		if whole {
			continue
		}
		if !stale {
			return raw, true, nil
		}
		got, err := v.reread(ctx, name, sid)
		if err != nil {
			return nil, false, err
		}
		v.mu.Lock()
		if cur := v.colls[name]; cur == c && c.ver[k] == ver && c.wholeGen == gen {
			c.install(k, got)
		}
		v.mu.Unlock()
		// What was read started after every mark seen, so it is current for this caller even
		// when a newer mark kept it out of the view.
		return got, true, nil
	}
	return nil, false, nil
}

// install sets document k to raw (nil: absent) and clears its mark. View.mu must be held.
func (c *viewColl) install(k string, raw bson.Raw) {
	_, had := c.docs[k]
	if raw == nil {
		delete(c.docs, k)
	} else {
		c.docs[k] = raw
	}
	if had != (raw != nil) {
		c.sorted = nil
	}
	delete(c.stale, k)
	delete(c.ver, k)
}

// reread reads one document by _id from the store (nil: absent).
func (v *View) reread(ctx context.Context, name string, id bson.RawValue) (bson.Raw, error) {
	raw, err := v.db.Collection(name).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		v.rereads.Add(1)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: re-read %s %s: %w", name, id, err)
	}
	v.rereads.Add(1)
	return slices.Clone(raw), nil
}

// Invalidate marks the document {_id: id} of coll stale, so its next read re-reads it.
// [Store.UpdateIfRevision] calls it after a refused compare-and-set that sent no write. A no-op
// when the view is off.
func (v *View) Invalidate(_ context.Context, coll *mongo.Collection, id any) error {
	if !v.Enabled() {
		return nil
	}
	t, data, err := bson.MarshalValue(id)
	if err != nil {
		return fmt.Errorf("store: invalidate %s %v: %w", coll.Name(), id, err)
	}
	v.mark(touch{coll: coll.Name(), ids: []bson.RawValue{{Type: t, Value: data}}})
	return nil
}

// ResyncForTest marks every loaded collection whole, as a lost change-stream token does, so each
// is loaded again on its next read.
func (v *View) ResyncForTest(context.Context) error {
	v.mark(touch{all: true})
	return nil
}

// CorruptForTest overwrites the view's copy of one document without touching the store (raw nil
// removes it) and without marking it, so tests can make the view stale on purpose.
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
// store otherwise. Errors: wrapping [ErrNotFound] when there is none. Cost with the view on: one
// map lookup and one decode, plus one read by _id when the document was written since it was last
// read (and one load of the collection on its first read).
func (v *View) Get(ctx context.Context, coll *mongo.Collection, id any, out any) error {
	if sid, ok := id.(string); ok && v.foldedFor(coll.Name(), stringKey(sid)) != nil {
		// Folded plan writes lie over this document (viewfold.go).
		raw, err := v.getRaw(ctx, coll, sid, nil)
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, ErrNotFound)
		}
		if err := bson.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("store: decode %s %v: %w", coll.Name(), id, err)
		}
		return nil
	}
	if !v.Enabled() {
		return FindByID(ctx, coll, id, out)
	}
	t, data, err := bson.MarshalValue(id)
	if err != nil {
		return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, err)
	}
	raw, ok, err := v.fresh(ctx, coll.Name(), bson.RawValue{Type: t, Value: data})
	if err != nil {
		return err
	}
	if !ok || !v.Enabled() {
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
// over the collection's raw documents and one decode per match, plus one read by _id per document
// written since it was last read (a reload when there are more than 64).
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
	want := make([]bson.RawValue, len(eq))
	for i, e := range eq {
		t, data, err := bson.MarshalValue(e.Value)
		if err != nil {
			return fmt.Errorf("store: find in %s: field %s: %w", coll.Name(), e.Key, err)
		}
		want[i] = bson.RawValue{Type: t, Value: data}
	}
	matches, ok, err := v.scan(ctx, coll.Name(), eq, want)
	if err != nil {
		return err
	}
	if !ok || !v.Enabled() {
		return findStore(ctx, coll, eq, sort, out)
	}
	if len(sort) > 0 {
		sortRaw(matches, sort)
	}
	return decodeAll(coll.Name(), matches, out)
}

// scan returns the documents of collection name matching eq in _id order, after re-reading the
// stale ones. It reports false when the collection must be read from the store.
func (v *View) scan(ctx context.Context, name string, eq bson.D, want []bson.RawValue) ([]bson.Raw, bool, error) {
	for attempt := 0; attempt < readAttempts; attempt++ {
		if ok, err := v.ensure(ctx, name); !ok || err != nil {
			return nil, false, err
		}
		v.mu.Lock()
		c := v.colls[name]
		if c.whole {
			v.mu.Unlock()
			continue
		}
		if len(c.stale) > reloadAbove {
			c.markWhole()
			v.mu.Unlock()
			continue
		}
		stale := make(map[string]bson.RawValue, len(c.stale))
		for k, id := range c.stale {
			stale[k] = id
		}
		v.mu.Unlock()
		// Re-read what was written since last read; the results overlay the view for this scan
		// even when a newer mark keeps one out of the view.
		overlay := make(map[string]bson.Raw, len(stale))
		for k, id := range stale {
			v.mu.RLock()
			ver, gen := c.ver[k], c.wholeGen
			v.mu.RUnlock()
			got, err := v.reread(ctx, name, id)
			if err != nil {
				return nil, false, err
			}
			overlay[k] = got
			v.mu.Lock()
			if v.colls[name] == c && c.ver[k] == ver && c.wholeGen == gen {
				c.install(k, got)
			}
			v.mu.Unlock()
		}
		v.mu.Lock()
		if c.whole {
			v.mu.Unlock()
			continue
		}
		if c.sorted == nil {
			c.sorted = sortedKeys(c.docs)
		}
		keys := c.sorted
		folded := v.foldedKeys(name)
		var matches []bson.Raw
		var ferr error
		for _, k := range keys {
			raw, ok := c.docs[k]
			if o, over := overlay[k]; over {
				raw, ok = o, o != nil
			}
			if id, f := folded[k]; f {
				var in bson.Raw
				if ok {
					in = raw
				}
				if raw, ferr = v.overlay(name, k, id, in, nil); ferr != nil {
					break
				}
				ok = raw != nil
			}
			if ok && matchesRaw(raw, eq, want) {
				matches = append(matches, raw)
			}
		}
		// Overlaid documents the view does not hold yet (created since the last read, or by a
		// folded plan entry not yet materialized).
		var extra []string
		for k, o := range overlay {
			if _, in := c.docs[k]; !in && o != nil {
				if id, f := folded[k]; f && ferr == nil {
					o, ferr = v.overlay(name, k, id, o, nil)
					overlay[k] = o
				}
				if o != nil && matchesRaw(o, eq, want) {
					extra = append(extra, k)
				}
			}
		}
		for k, id := range folded {
			if ferr != nil {
				break
			}
			if _, in := c.docs[k]; in {
				continue
			}
			if _, over := overlay[k]; over {
				continue
			}
			var o bson.Raw
			if o, ferr = v.overlay(name, k, id, nil, nil); o != nil && matchesRaw(o, eq, want) {
				overlay[k] = o
				extra = append(extra, k)
			}
		}
		v.mu.Unlock()
		if ferr != nil {
			return nil, false, ferr
		}
		if len(extra) > 0 {
			for _, k := range extra {
				matches = append(matches, overlay[k])
			}
			slices.SortStableFunc(matches, func(a, b bson.Raw) int { return compareRaw(a.Lookup("_id"), b.Lookup("_id")) })
		}
		return matches, true, nil
	}
	return nil, false, nil
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
	defer closeCursor(ctx, cur)
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
