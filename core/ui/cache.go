package ui

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/berthhq/berth/core/store"
)

// liveCache keeps, per session and page, the data a live region was last rendered from and the
// change generation ([Config.Generation]) it was read at, so a page opened again, another tab,
// or every live stream of the same session woken by the same change reads the API once per
// change instead of once per request (docs/ui.md section "Speed"). An entry is used only while
// the generation has not moved and it is younger than [Config.CacheMaxAge] (what the store does
// not record, such as a live session's last frame, is at most that old). The session is checked
// by the API before the cache is consulted (authed), so a revoked session reads nothing from it.
type liveCache struct {
	gen    func() uint64
	maxAge time.Duration
	now    func() time.Time

	mu      sync.Mutex
	entries map[[32]byte]*cacheEntry // mu must be held
}

// cacheEntry is one session's data of one page. Its mutex is held while it is (re)loaded, so
// concurrent readers of the same entry wait for one load.
type cacheEntry struct {
	mu   sync.Mutex
	gen  uint64
	at   time.Time
	data any
	used time.Time // guarded by liveCache.mu; the eviction order
}

// cacheEntries bounds the cache: beyond it the least recently used entry is dropped.
const cacheEntries = 256

// cached reports whether page's live data may be cached: the pages whose data carries no
// per-render value (a service page carries a fresh Idempotency-Key for its forms).
func cached(page string) bool {
	return page == "overview" || page == "services" || page == "nodes"
}

// get returns the data of page for bearer, from the cache when it is current and from load
// otherwise (the result then replaces the entry; an error is not cached).
func (c *liveCache) get(ctx context.Context, bearer, page string, load func(context.Context) (any, error)) (any, error) {
	if c == nil || c.gen == nil {
		return load(ctx)
	}
	key := sha256.Sum256([]byte(page + "\x00" + bearer))
	now := c.now()
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		if len(c.entries) >= cacheEntries {
			c.evictLocked()
		}
		e = &cacheEntry{}
		c.entries[key] = e
	}
	e.used = now
	c.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	// The generation is read before the load: a change during the load moves it past the
	// entry's, so the next reader loads again.
	g := c.gen()
	if e.data != nil && e.gen == g && now.Sub(e.at) < c.maxAge {
		return e.data, nil
	}
	data, err := load(ctx)
	if err != nil {
		e.data = nil
		return nil, err
	}
	e.gen, e.at, e.data = g, c.now(), data
	return data, nil
}

// evictLocked drops the least recently used entry; c.mu must be held.
func (c *liveCache) evictLocked() {
	var oldest [32]byte
	var at time.Time
	first := true
	for k, e := range c.entries {
		if first || e.used.Before(at) {
			oldest, at, first = k, e.used, false
		}
	}
	delete(c.entries, oldest)
}

// Generation returns a [Config.Generation] over the writes to collections colls of v: one
// subscription of the read view per collection for the life of the process, read without a
// goroutine. A write this process made has signalled its subscription before the write
// returned, so a call after a write returns a new number; writes of other processes move it
// where the view follows them (docs/store.md, the change stream).
func Generation(v *store.View, colls ...string) func() uint64 {
	subs := make([]*store.Subscription, 0, len(colls))
	for _, coll := range colls {
		subs = append(subs, v.Subscribe(coll, 1))
	}
	var mu sync.Mutex
	var n uint64
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		changed := false
		for _, s := range subs {
			select {
			case <-s.Ready():
				s.Take()
				changed = true
			default:
			}
		}
		if changed {
			n++
		}
		return n
	}
}
