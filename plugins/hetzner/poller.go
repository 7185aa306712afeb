package hetzner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// pollBatch is how many action ids one GET /actions asks about.
const pollBatch = 25

// poller is the plugin's one action poller: every wait for an action goes
// through it, and each round asks about all waited-for actions with one
// GET /actions?id=..&id=.. per 25 ids, so the API cost of waiting does not
// grow with the number of creates in flight. Its loop runs while anyone
// waits. Safe for concurrent use.
type poller struct {
	client *hcloud.Client
	every  time.Duration
	log    *slog.Logger
	life   context.Context // ends the loop when the plugin closes

	mu      sync.Mutex
	waiting map[int64][]chan *hcloud.Action // mu must be held
	running bool                            // the loop runs; mu must be held
}

func newPoller(life context.Context, c *hcloud.Client, every time.Duration, log *slog.Logger) *poller {
	return &poller{client: c, every: every, log: log, life: life, waiting: map[int64][]chan *hcloud.Action{}}
}

// Wait returns when every action of ids has finished: nil when all
// succeeded, or the first one that failed. It returns ctx's error when ctx
// ends first.
func (p *poller) Wait(ctx context.Context, ids ...int64) (failed *hcloud.Action, err error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	chans := make(map[int64]chan *hcloud.Action, len(ids))
	p.mu.Lock()
	for _, id := range ids {
		ch := make(chan *hcloud.Action, 1)
		chans[id] = ch
		p.waiting[id] = append(p.waiting[id], ch)
	}
	if !p.running && len(ids) > 0 {
		p.running = true
		go p.loop()
	}
	p.mu.Unlock()
	defer p.forget(chans)
	for id, ch := range chans {
		select {
		case a := <-ch:
			if a.Status != hcloud.ActionStatusSuccess {
				return a, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for action %d: %w", id, ctx.Err())
		case <-p.life.Done():
			return nil, fmt.Errorf("waiting for action %d: the plugin is closing", id)
		}
	}
	return nil, nil
}

// Pending returns how many actions are waited for.
func (p *poller) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

// forget removes the channels of a finished or abandoned wait.
func (p *poller) forget(chans map[int64]chan *hcloud.Action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, ch := range chans {
		rest := slices.DeleteFunc(p.waiting[id], func(c chan *hcloud.Action) bool { return c == ch })
		if len(rest) == 0 {
			delete(p.waiting, id)
		} else {
			p.waiting[id] = rest
		}
	}
}

// loop polls every p.every until nobody waits or the plugin closes.
func (p *poller) loop() {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.life.Done():
			p.mu.Lock()
			p.running = false
			p.mu.Unlock()
			return
		case <-t.C:
		}
		if !p.PollOnce(p.life) {
			return
		}
	}
}

// PollOnce asks once about every waited-for action and hands out the
// finished ones. It reports whether anyone still waits; when nobody does,
// the loop is marked stopped.
func (p *poller) PollOnce(ctx context.Context) bool {
	p.mu.Lock()
	ids := make([]int64, 0, len(p.waiting))
	for id := range p.waiting {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		p.running = false
		p.mu.Unlock()
		return false
	}
	p.mu.Unlock()
	slices.Sort(ids)
	for chunk := range slices.Chunk(ids, pollBatch) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		actions, _, err := p.client.Action.List(cctx, hcloud.ActionListOpts{ID: chunk, ListOpts: hcloud.ListOpts{PerPage: pollBatch}})
		cancel()
		if err != nil {
			// The waiters' own deadlines bound this; the next round asks again.
			p.log.Warn("hetzner action poll failed", "actions", len(chunk), "err", err)
			continue
		}
		p.deliver(actions)
	}
	return true
}

// deliver hands each finished action to its waiters.
func (p *poller) deliver(actions []*hcloud.Action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range actions {
		if a.Status == hcloud.ActionStatusRunning {
			continue
		}
		for _, ch := range p.waiting[a.ID] {
			ch <- a
		}
		delete(p.waiting, a.ID)
	}
}
