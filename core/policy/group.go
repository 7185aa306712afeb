package policy

import (
	"context"
	"sync"
	"time"
)

// group runs one store operation for many concurrent callers: a caller's
// item joins the next run, never one already in flight, so what it gets was
// read (or written) after it asked. On the embedded store (one connection,
// about 450 writes and, for a filter, far fewer than 1,500 reads a second)
// 64 concurrent admissions each reading the bindings and writing their
// decisions queued behind each other; grouped, a burst costs a few round
// trips instead of two per admission.
type group[T, R any] struct {
	// run does the work of one batch and returns one result per item, in
	// order. It is called from one goroutine at a time.
	run func(ctx context.Context, items []T) []R
	// max bounds the items of one run; zero means no bound.
	max int

	mu      sync.Mutex
	pending []*groupCall[T, R] // mu must be held
	running bool               // a goroutine is taking batches; mu must be held
}

type groupCall[T, R any] struct {
	item T
	res  R
	done chan struct{}
}

// groupRunTimeout bounds one batch's store operation.
const groupRunTimeout = 30 * time.Second

// do adds item to the next batch and returns its result. The batch runs on
// a context detached from ctx (other callers share it); when ctx ends first,
// do returns ctx's error and the item is still run.
func (g *group[T, R]) do(ctx context.Context, item T) (R, error) {
	c := &groupCall[T, R]{item: item, done: make(chan struct{})}
	g.mu.Lock()
	g.pending = append(g.pending, c)
	if !g.running {
		g.running = true
		go g.loop(context.WithoutCancel(ctx))
	}
	g.mu.Unlock()
	select {
	case <-c.done:
		return c.res, nil
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// loop takes batches until none is pending, then ends.
func (g *group[T, R]) loop(ctx context.Context) {
	for {
		g.mu.Lock()
		n := len(g.pending)
		if g.max > 0 {
			n = min(n, g.max)
		}
		if n == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		batch := g.pending[:n:n]
		g.pending = append([]*groupCall[T, R](nil), g.pending[n:]...)
		g.mu.Unlock()
		items := make([]T, len(batch))
		for i, c := range batch {
			items[i] = c.item
		}
		rctx, cancel := context.WithTimeout(ctx, groupRunTimeout)
		res := g.run(rctx, items)
		cancel()
		for i, c := range batch {
			c.res = res[i]
			close(c.done)
		}
	}
}
