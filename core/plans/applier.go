// Package plans owns the plan log's applier (docs/store.md section 2.3): the one writer of the
// hot decisions of a berthd (placements and reservations on a node's capacity ledger, operation
// claims). Submitters compute a [Plan] optimistically against the read view and hand it to the
// [Applier]; the applier decides each plan again against the latest state (the view with every
// decision accepted before it laid over it), drops the ones that no longer fit (their submitters
// get a conflict and plan again), and writes the accepted decisions of up to MaxPlans plans as one
// inserted document of the plan log, whose _id is the next sequence number. A submitter is answered
// only once that insert is durable. The view folds the entry in at once; a materializer writes the
// per-entity documents behind it in bulk and records how far it got, and a starting applier
// replays every entry after that.
//
// Nomad's plan applier (nomad/plan_apply.go) is the model; group commit as in etcd's backend
// and hashicorp/raft.
package plans

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/store"
)

// ErrDeposed is returned (wrapped) by [Applier.Submit] once another applier wrote a sequence
// number this one meant to write: this applier stops, and every plan submitted to it from then
// on is refused with it. Nothing it answered before is affected.
var ErrDeposed = errors.New("plans: another applier took over the plan log")

// ErrClosed is returned (wrapped) by [Applier.Submit] after [Applier.Close].
var ErrClosed = errors.New("plans: the applier is closed")

// Reader reads a document as the applier decides against it: the read view, with the entries
// durable but not materialized and the decisions accepted earlier in the same batch laid over
// it. Get decodes document id of collection coll into out; errors wrap [store.ErrNotFound].
type Reader interface {
	Get(ctx context.Context, coll, id string, out any) error
}

// Plan is one submitter's set of decisions. Decide is called by the applier, once, in the
// order plans arrive, against r: it checks that what the submitter chose still holds (the
// node has the room, the replica is not placed, the operation not claimed) and returns the
// writes that record it (absolute values computed from what r shows, never increments). An
// error drops the plan and is the submitter's answer; wrap [store.ErrConflict] when the plan no
// longer fits, so the submitter re-plans ([store.RetryOnConflict]). Decide must not block on
// anything but r.
type Plan struct {
	// Name says what the plan decides, for logs ("reserve prj_1 on node-0003").
	Name   string
	Decide func(ctx context.Context, r Reader) ([]store.PlanWrite, error)
}

// Receipt is the answer to an accepted plan: the sequence number of the durable entry that
// holds its decisions.
type Receipt struct {
	Seq int64
}

// Defaults of the options.
const (
	// DefaultMaxPlans is how many plans one entry holds at most.
	DefaultMaxPlans = 256
	// DefaultMaxWait is how long the applier waits for more plans once it has one, before it
	// writes. Zero: it takes what is queued when it is ready and writes at once; plans that
	// arrive during a write form the next batch (group commit), so a lone submitter pays one
	// insert, and many concurrent ones share each insert.
	DefaultMaxWait = 0
	// materializeRetry is how long the materializer waits after a failed write before trying
	// again.
	materializeRetry = 500 * time.Millisecond
)

// Option configures an [Applier].
type Option func(*Applier)

// WithMaxPlans sets how many plans one entry holds at most (default [DefaultMaxPlans]).
func WithMaxPlans(n int) Option { return func(a *Applier) { a.maxPlans = max(1, n) } }

// WithMaxWait sets how long the applier waits for more plans before it writes a batch that is
// not full (default [DefaultMaxWait]). A wait adds its length to every plan's latency.
func WithMaxWait(d time.Duration) Option { return func(a *Applier) { a.maxWait = max(0, d) } }

// WithLogger sets where the applier logs (default: nowhere).
func WithLogger(l *slog.Logger) Option { return func(a *Applier) { a.log = l } }

// WithMetrics registers the applier's metrics (docs/operating.md "Metrics") on reg.
func WithMetrics(reg prometheus.Registerer) Option { return func(a *Applier) { a.reg = reg } }

// WithoutMaterializer leaves entries unmaterialized until [Applier.Materialize] is called:
// for tests of the replay at start.
func WithoutMaterializer() Option { return func(a *Applier) { a.manual = true } }

// Applier is the one plan applier of a berthd; see the package comment. Safe for concurrent use.
type Applier struct {
	st       *store.Store
	id       string
	log      *slog.Logger
	reg      prometheus.Registerer
	maxPlans int
	maxWait  time.Duration
	manual   bool
	m        *metrics

	in     chan *submission
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once

	next int64 // the sequence number of the next entry; the loop's own

	// matMu makes one [Applier.Materialize] run at a time.
	matMu sync.Mutex
	// mu guards what the materializer shares with the loop and with waiters.
	mu           sync.Mutex
	unmat        []store.PlanEntry // durable entries not yet materialized, in order
	materialized int64
	deposed      bool
	matCond      chan struct{} // closed and replaced whenever materialized moves
	kick         chan struct{}
	matDone      chan struct{}
}

type submission struct {
	ctx    context.Context
	plan   Plan
	answer chan answer
}

type answer struct {
	r   Receipt
	err error
}

// Open replays the plan log of st (the entries after the last materialized one are folded into
// the view and materialized before it returns) and starts the applier and its materializer.
// ctx bounds the replay. Close the applier once.
func Open(ctx context.Context, st *store.Store, opts ...Option) (*Applier, error) {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	a := &Applier{st: st, id: hex.EncodeToString(idb[:]), log: slog.New(slog.DiscardHandler), maxPlans: DefaultMaxPlans, maxWait: DefaultMaxWait,
		in: make(chan *submission, 1024), stop: make(chan struct{}), done: make(chan struct{}), matCond: make(chan struct{}),
		kick: make(chan struct{}, 1), matDone: make(chan struct{})}
	for _, o := range opts {
		o(a)
	}
	a.log = a.log.With("component", "plans", "applier", a.id)
	a.m = newMetrics(a.reg)
	if err := st.EnsureCollections(ctx, store.PlansCollection, store.SequencesCollection); err != nil {
		return nil, fmt.Errorf("plans: open: %w", err)
	}
	mark, err := st.MaterializedPlan(ctx)
	if err != nil {
		return nil, fmt.Errorf("plans: open: %w", err)
	}
	replay, err := st.PlansAfter(ctx, mark)
	if err != nil {
		return nil, fmt.Errorf("plans: open: %w", err)
	}
	last, err := st.LastPlan(ctx)
	if err != nil {
		return nil, fmt.Errorf("plans: open: %w", err)
	}
	if n := len(replay); n > 0 {
		last = max(last, replay[n-1].Seq)
		for _, e := range replay {
			st.View().Fold(e.Seq, e.Writes)
		}
		if _, err := st.MaterializePlans(ctx, replay); err != nil {
			return nil, fmt.Errorf("plans: open: replay %d entries after %d: %w", n, mark, err)
		}
		st.View().Unfold(replay[n-1].Seq)
		mark = replay[n-1].Seq
		a.log.Info("plans: replayed the entries not materialized at the last stop", "entries", n, "through", mark)
	}
	a.next, a.materialized = last+1, mark
	go a.loop()
	go a.materializer()
	return a, nil
}

// ID returns the applier's random id, written into each entry it appends.
func (a *Applier) ID() string { return a.id }

// Submit hands p to the applier and waits for its answer: a [Receipt] once the entry holding its
// decisions is durable, or p.Decide's error (wrapping [store.ErrConflict] when it no longer fits),
// or an error wrapping [ErrDeposed] or [ErrClosed], or the store's error when the entry could not
// be written (then none of p's decisions was made). When ctx ends first Submit returns ctx's
// error; the plan may still be decided and written.
func (a *Applier) Submit(ctx context.Context, p Plan) (Receipt, error) {
	s := &submission{ctx: ctx, plan: p, answer: make(chan answer, 1)}
	select {
	case <-a.stop:
		return Receipt{}, fmt.Errorf("plans: submit %s: %w", p.Name, a.stopErr())
	default:
	}
	select {
	case a.in <- s:
	case <-a.stop:
		return Receipt{}, fmt.Errorf("plans: submit %s: %w", p.Name, a.stopErr())
	case <-ctx.Done():
		return Receipt{}, fmt.Errorf("plans: submit %s: %w", p.Name, ctx.Err())
	}
	select {
	case r := <-s.answer:
		return r.r, r.err
	case <-a.done:
		// The loop ended: it answered what it had taken; what it had not is refused.
		select {
		case r := <-s.answer:
			return r.r, r.err
		default:
			return Receipt{}, fmt.Errorf("plans: submit %s: %w", p.Name, a.stopErr())
		}
	case <-ctx.Done():
		return Receipt{}, fmt.Errorf("plans: submit %s: %w", p.Name, ctx.Err())
	}
}

func (a *Applier) stopErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deposed {
		return ErrDeposed
	}
	return ErrClosed
}

// Close stops the applier: plans queued and not yet decided are refused with [ErrClosed], a
// batch being written is finished and answered, and the materializer writes what is durable
// before Close returns (bounded by ctx; what it leaves is replayed at the next [Open]).
func (a *Applier) Close(ctx context.Context) error {
	a.closed.Do(func() { close(a.stop) })
	select {
	case <-a.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.poke()
	select {
	case <-a.matDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loop is the applier: it takes the plans queued, decides them, writes one entry and answers.
func (a *Applier) loop() {
	defer close(a.done)
	layer := a.st.NewLayer()
	for {
		var first *submission
		select {
		case first = <-a.in:
		case <-a.stop:
			a.refuseQueued(a.stopErr())
			return
		}
		batch := a.gather(first)
		if !a.commit(layer, batch) {
			a.refuseQueued(ErrDeposed)
			a.closed.Do(func() { close(a.stop) })
			return
		}
	}
}

// gather returns first and the plans queued behind it, up to maxPlans, waiting up to maxWait
// for more when it has fewer.
func (a *Applier) gather(first *submission) []*submission {
	batch := []*submission{first}
	var deadline <-chan time.Time
	if a.maxWait > 0 {
		t := time.NewTimer(a.maxWait)
		defer t.Stop()
		deadline = t.C
	}
	for len(batch) < a.maxPlans {
		select {
		case s := <-a.in:
			batch = append(batch, s)
			continue
		default:
		}
		if deadline == nil {
			break
		}
		select {
		case s := <-a.in:
			batch = append(batch, s)
			continue
		case <-deadline:
		case <-a.stop:
		}
		break
	}
	return batch
}

// commit decides batch, writes the accepted decisions as one entry and answers every plan. It
// reports false when this applier was deposed.
func (a *Applier) commit(layer *store.Layer, batch []*submission) bool {
	layer.Reset()
	var accepted []*submission
	var writes []store.PlanWrite
	for _, s := range batch {
		if err := s.ctx.Err(); err != nil {
			s.answer <- answer{err: fmt.Errorf("plans: %s: %w", s.plan.Name, err)}
			continue
		}
		ws, err := s.plan.Decide(s.ctx, layer)
		if err != nil {
			if errors.Is(err, store.ErrConflict) {
				a.m.conflicts.Inc()
			}
			s.answer <- answer{err: err}
			continue
		}
		layer.Add(ws)
		writes = append(writes, ws...)
		accepted = append(accepted, s)
	}
	if len(accepted) == 0 {
		return true
	}
	e := store.PlanEntry{Seq: a.next, Applier: a.id, At: time.Now().UTC(), Plans: len(accepted), Writes: writes}
	start := time.Now()
	err := a.append(e)
	a.m.appendSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		deposed := errors.Is(err, store.ErrPlanSeqTaken)
		if deposed {
			a.mu.Lock()
			a.deposed = true
			a.mu.Unlock()
			a.log.Error("plans: another applier wrote the next entry; this applier stops", "seq", e.Seq)
			err = fmt.Errorf("plans: entry %d: %w", e.Seq, ErrDeposed)
		}
		for _, s := range accepted {
			s.answer <- answer{err: fmt.Errorf("plans: %s: %w", s.plan.Name, err)}
		}
		return !deposed
	}
	a.next++
	a.m.entries.Inc()
	a.m.plans.Add(float64(len(accepted)))
	a.m.batch.Observe(float64(len(accepted)))
	viewOn := a.st.View().Enabled()
	if viewOn {
		a.st.View().Fold(e.Seq, e.Writes)
	}
	a.mu.Lock()
	a.unmat = append(a.unmat, e)
	a.mu.Unlock()
	a.poke()
	if !viewOn {
		// Reads go to the store: answer once the documents hold the decisions.
		// Bounded: after that the decisions stand (the entry is durable and replayed at the
		// next start) and the materializer keeps trying; the log says so.
		for attempt := 0; attempt < 20; attempt++ {
			err := a.Materialize(context.Background())
			if err == nil {
				break
			}
			a.log.Warn("plans: materialize before answering (the read view is off); trying again", "seq", e.Seq, "attempt", attempt, "err", err)
			time.Sleep(materializeRetry)
		}
	}
	for _, s := range accepted {
		s.answer <- answer{r: Receipt{Seq: e.Seq}}
	}
	return true
}

// append writes e. When the insert's outcome is unknown (an error other than a duplicate key) it
// reads the entry back: present and written by this applier means durable.
func (a *Applier) append(e store.PlanEntry) error {
	ctx := context.Background()
	err := a.st.AppendPlan(ctx, e)
	if err == nil || errors.Is(err, store.ErrPlanSeqTaken) {
		return err
	}
	got, rerr := a.st.PlanEntry(ctx, e.Seq)
	if rerr == nil && got.Applier == a.id {
		return nil
	}
	if rerr == nil {
		return fmt.Errorf("%w (after %v)", store.ErrPlanSeqTaken, err)
	}
	// Absent (or unreadable): the decisions were not made. Should the insert still land later,
	// the next entry's insert of the same sequence number fails and this applier stops.
	return err
}

// refuseQueued answers every queued plan with err.
func (a *Applier) refuseQueued(err error) {
	for {
		select {
		case s := <-a.in:
			s.answer <- answer{err: fmt.Errorf("plans: %s: %w", s.plan.Name, err)}
		default:
			return
		}
	}
}

func (a *Applier) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// materializer writes the documents of durable entries behind the applier, all the entries
// waiting at once, and unfolds them from the view.
func (a *Applier) materializer() {
	defer close(a.matDone)
	for {
		stopping := false
		select {
		case <-a.kick:
		case <-a.done:
			stopping = true
		}
		if a.manual {
			if stopping {
				return // what is left is replayed at the next Open
			}
			continue
		}
		for {
			if err := a.Materialize(context.Background()); err != nil {
				a.log.Warn("plans: materialize; trying again", "err", err)
				if stopping {
					return
				}
				select {
				case <-time.After(materializeRetry):
					continue
				case <-a.done:
					stopping = true
					continue
				}
			}
			break
		}
		if stopping {
			return
		}
	}
}

// Materialize writes the documents of every durable entry not yet materialized, records the last
// as materialized and unfolds them from the view. The materializer calls it after each entry;
// tests built [WithoutMaterializer] call it themselves.
func (a *Applier) Materialize(ctx context.Context) error {
	a.matMu.Lock()
	defer a.matMu.Unlock()
	a.mu.Lock()
	todo := a.unmat
	a.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	start := time.Now()
	n, err := a.st.MaterializePlans(ctx, todo)
	a.m.materializeSeconds.Observe(time.Since(start).Seconds())
	a.m.materialized.Add(float64(n))
	if err != nil {
		return err
	}
	last := todo[len(todo)-1].Seq
	a.st.View().Unfold(last)
	a.mu.Lock()
	a.unmat = a.unmat[len(todo):]
	a.materialized = last
	close(a.matCond)
	a.matCond = make(chan struct{})
	a.mu.Unlock()
	a.m.lag.Set(float64(a.Unmaterialized()))
	return nil
}

// Unmaterialized returns how many durable entries wait for the materializer.
func (a *Applier) Unmaterialized() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.unmat)
}

// WaitMaterialized returns once the entry seq and those before it are in their documents: what a
// reader that bypasses the view waits for (docs/store.md section 2.3). Errors: ctx's.
func (a *Applier) WaitMaterialized(ctx context.Context, seq int64) error {
	for {
		a.mu.Lock()
		done, ch := a.materialized >= seq, a.matCond
		a.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("plans: wait for entry %d to be materialized: %w", seq, ctx.Err())
		}
	}
}
