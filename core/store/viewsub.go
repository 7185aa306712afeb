package store

// Write subscriptions: the read view tells a subscriber which documents of a collection were
// written, so a loop that acts on stored state (the reconciler) is woken by the store itself and
// not by a call each writer must remember to make.
//
// What a subscriber learns comes from the same feed that keeps the view current (view.go): the
// command monitor sees every write of this process's client when it finishes, and on a MongoDB
// replica set the change stream names what other processes wrote. A notice says only "this
// document may have changed": the subscriber reads the document (from the view) to learn what
// changed, and a notice of a write that changed nothing, or that failed, costs it one read.
//
// Subscriptions hold no goroutine: a write adds its ids to each matching subscription's pending
// set under a lock and makes its one-slot Ready channel receivable, without blocking. The pending
// set is bounded; a write beyond the bound, a write that names no _id, and a loss of the change
// stream's position turn the set into "every document" ([Subscription.Take] reports all), so a
// subscriber never misses a write, at the price of one scan of its collection in the view.

import (
	"context"
	"sync"
)

// DefaultSubscriptionLimit is how many distinct ids a [Subscription] holds before it reports
// every document instead.
const DefaultSubscriptionLimit = 4096

// Subscription collects the ids of the documents of one collection that writes named since the
// last [Subscription.Take]. Make one with [View.Subscribe]; end it with [Subscription.Close].
// Safe for concurrent use.
type Subscription struct {
	v     *View
	coll  string
	limit int
	ready chan struct{}

	mu     sync.Mutex
	ids    map[string]struct{} // pending string ids; mu must be held
	all    bool                // every document may have changed; mu must be held
	closed bool                // mu must be held
}

// Subscribe returns a subscription to the writes of collection coll, holding at most limit
// distinct ids (limit < 1: [DefaultSubscriptionLimit]). Writes this process makes through the
// Store's client are seen whether the view is on or off; writes of other processes are seen
// only where the view follows them (a MongoDB replica set, through its change stream). The
// caller calls [Subscription.Close] when done; an unclosed subscription keeps collecting ids
// (bounded) but runs nothing.
func (v *View) Subscribe(coll string, limit int) *Subscription {
	if limit < 1 {
		limit = DefaultSubscriptionLimit
	}
	sub := &Subscription{v: v, coll: coll, limit: limit, ready: make(chan struct{}, 1), ids: map[string]struct{}{}}
	v.subsMu.Lock()
	if v.subs == nil {
		v.subs = map[*Subscription]struct{}{}
	}
	v.subs[sub] = struct{}{}
	v.subscribed.Store(true)
	v.subsMu.Unlock()
	return sub
}

// Notify returns a channel that receives a value after writes to any of the collections colls,
// until ctx ends: the change feed of a reader that re-reads what it shows on any change (the
// dashboard's live pages) and needs no ids. One value stands for any number of writes; a reader
// that is busy loses nothing but the count. It holds one subscription and one goroutine per
// collection, both gone once ctx ends.
func (v *View) Notify(ctx context.Context, colls ...string) <-chan struct{} {
	out := make(chan struct{}, 1)
	for _, coll := range colls {
		sub := v.Subscribe(coll, 1) // the ids are not read: the smallest set
		go func() {
			defer sub.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case <-sub.Ready():
					sub.Take()
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out
}

// Ready receives a value once ids are pending after a write; the receiver then calls
// [Subscription.Take]. One value stands for any number of writes.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Take returns the pending ids (in no order) and clears them. all reports that any document of
// the collection may have changed (the bound was reached, a write named no _id or a non-string
// _id, or the view lost track of other processes' writes): the caller then looks at every
// document; ids may still hold some ids, which all covers.
func (s *Subscription) Take() (ids []string, all bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids = make([]string, 0, len(s.ids))
	for id := range s.ids {
		ids = append(ids, id)
	}
	clear(s.ids)
	all, s.all = s.all, false
	return ids, all
}

// Close ends the subscription: no more ids are collected. Idempotent.
func (s *Subscription) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.v.subsMu.Lock()
	delete(s.v.subs, s)
	s.v.subscribed.Store(len(s.v.subs) > 0)
	s.v.subsMu.Unlock()
}

// add records what t names of s's collection and signals Ready.
func (s *Subscription) add(t touch) {
	if !t.all && t.coll != s.coll {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	switch {
	case t.all || t.reload:
		s.all = true
	default:
		for _, id := range t.ids {
			str, ok := id.StringValueOK()
			if !ok || len(s.ids) >= s.limit {
				s.all = true
				continue
			}
			s.ids[str] = struct{}{}
		}
	}
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// notify hands t to every subscription. [View.mark] calls it once the view has marked what t
// names, outside the view's lock.
func (v *View) notify(t touch) {
	if !v.subscribed.Load() {
		return
	}
	v.subsMu.Lock()
	subs := make([]*Subscription, 0, len(v.subs))
	for s := range v.subs {
		subs = append(subs, s)
	}
	v.subsMu.Unlock()
	for _, s := range subs {
		s.add(t)
	}
}
