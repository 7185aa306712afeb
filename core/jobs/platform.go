package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berthhq/berth/core/store"
)

// PlatformCollection holds one document per platform task (docs/jobs.md section 10).
const PlatformCollection = "platform_jobs"

// PlatformHistory is how many passes a platform task keeps, newest last.
const PlatformHistory = 20

// PlatformPass is one pass of a platform task: when it started and ended, and how.
type PlatformPass struct {
	StartedAt time.Time `bson:"started_at" json:"started_at"`
	EndedAt   time.Time `bson:"ended_at" json:"ended_at"`
	// Result is "succeeded" or "failed".
	Result string `bson:"result" json:"result"`
	// Message is the error of a failed pass; empty otherwise.
	Message string `bson:"message,omitempty" json:"message,omitempty"`
}

// PlatformTask is berthd's own periodic work (registry garbage collection, the expiry of
// idempotency records, backup schedules, ...) listed beside jobs: its last pass and the
// [PlatformHistory] before it, written by whichever berthd ran it.
type PlatformTask struct {
	// Name says what the task does ("registry.gc").
	Name     string `bson:"_id" json:"name"`
	Revision int64  `bson:"revision" json:"-"`
	// Every is the task's usual period in seconds, for an operator to judge how late it is.
	EveryS int64 `bson:"every_s" json:"every_s"`
	// Passes and Failures count every pass recorded since the task's first.
	Passes   int64          `bson:"passes" json:"passes"`
	Failures int64          `bson:"failures" json:"failures"`
	Last     *PlatformPass  `bson:"last,omitempty" json:"last,omitempty"`
	History  []PlatformPass `bson:"history" json:"history"`
}

// Platform records and lists the passes of platform tasks. The zero value is not usable; make
// one with [NewPlatform]. Safe for concurrent use.
type Platform struct {
	st  *store.Store
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	running map[string]time.Duration // tasks [Platform.Every] runs here, by name: their period
}

// NewPlatform returns a Platform writing to st; log may be nil.
func NewPlatform(st *store.Store, log *slog.Logger) *Platform {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Platform{st: st, log: log, now: time.Now, running: map[string]time.Duration{}}
}

// Record writes one pass of task (started at started, ended now, failed when err is not nil)
// onto its document by compare-and-set, keeping the newest [PlatformHistory] passes; every is
// the task's usual period. A failure to record is logged and returned; the task itself is not
// affected by it.
func (p *Platform) Record(ctx context.Context, task string, every time.Duration, started time.Time, err error) error {
	pass := PlatformPass{StartedAt: started.UTC(), EndedAt: p.now().UTC(), Result: "succeeded"}
	if err != nil {
		pass.Result, pass.Message = "failed", err.Error()
	}
	werr := store.RetryOnConflict(ctx, func() error {
		var cur PlatformTask
		switch gerr := p.st.Get(ctx, PlatformCollection, task, &cur); {
		case errors.Is(gerr, store.ErrNotFound):
			doc := PlatformTask{Name: task, Revision: 1, EveryS: int64(every / time.Second), Passes: 1, Last: &pass, History: []PlatformPass{pass}}
			if pass.Result == "failed" {
				doc.Failures = 1
			}
			ierr := p.st.Insert(ctx, PlatformCollection, doc)
			if store.IsDuplicateKey(ierr) {
				return fmt.Errorf("%w: %s recorded by another berthd meanwhile", store.ErrConflict, task)
			}
			return ierr
		case gerr != nil:
			return gerr
		default:
			hist := append(slices.Clone(cur.History), pass)
			if n := len(hist); n > PlatformHistory {
				hist = hist[n-PlatformHistory:]
			}
			failures := cur.Failures
			if pass.Result == "failed" {
				failures++
			}
			_, serr := p.st.SetIfRevision(ctx, PlatformCollection, task, cur.Revision, store.Fields{
				"every_s": int64(every / time.Second), "passes": cur.Passes + 1, "failures": failures, "last": pass, "history": hist})
			return serr
		}
	})
	if werr != nil {
		p.log.Warn("platform task pass not recorded", "task", task, "err", werr)
		return fmt.Errorf("jobs: record a pass of platform task %s: %w", task, werr)
	}
	return nil
}

// List returns every platform task, ordered by name: those with a recorded pass, and those this
// berthd runs ([Platform.Every]) that have not finished a first pass yet (no passes, no history),
// so an operator sees every task from berthd's start.
func (p *Platform) List(ctx context.Context) ([]PlatformTask, error) {
	var out []PlatformTask
	if err := p.st.All(ctx, PlatformCollection, &out); err != nil {
		return nil, fmt.Errorf("jobs: list platform tasks: %w", err)
	}
	p.mu.Lock()
	for name, every := range p.running {
		if !slices.ContainsFunc(out, func(t PlatformTask) bool { return t.Name == name }) {
			out = append(out, PlatformTask{Name: name, EveryS: int64(every / time.Second), History: []PlatformPass{}})
		}
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PlatformTask) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Every runs pass as platform task name until ctx ends, recording each pass (a failed one is
// also logged here, so passes need not log their own error): the first after first, each next
// after the wait the pass returns (its usual period, or a shorter one when it left work). every
// is the usual period, recorded for operators.
func (p *Platform) Every(ctx context.Context, name string, every, first time.Duration, pass func(ctx context.Context) (time.Duration, error)) {
	p.mu.Lock()
	p.running[name] = every
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.running, name)
		p.mu.Unlock()
	}()
	wait := first
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		started := p.now()
		next, err := pass(ctx)
		if ctx.Err() != nil {
			return // stopped mid-pass: not a result of the task
		}
		if err != nil {
			p.log.Warn("platform task pass failed", "task", name, "err", err)
		}
		_ = p.Record(ctx, name, every, started, err)
		wait = next
		if wait <= 0 {
			wait = every
		}
	}
}
