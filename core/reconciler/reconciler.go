// Package reconciler converges the cluster on the declared services: it grants
// stateful leases where core/placement decides, runs the rollout's sweep (which
// places slots with the same decider), writes each node's desired state, and pushes the
// route table to the gateway. A service's change is carried by the reconcile
// request written with it, which the reconciler learns of from the store and
// clears once a focused pass acted on it; node news wakes the work it affects
// through the same deduplicating [Queue]; a slow full pass, level-triggered
// over everything in the store, is the safety net.
package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthhq/berth/abi/node"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
)

// Pusher delivers a node's stored desired state on its live session.
type Pusher interface {
	Push(ctx context.Context, nodeID string)
}

// SpecPusher is the optional extension of a [Pusher] (*session.Server implements it) that is
// handed the revision and spec just stored, so the push neither reads the node back from the
// store nor decodes its spec again. A push of a revision the session was already sent does
// nothing.
type SpecPusher interface {
	PushSpec(ctx context.Context, nodeID string, rev int64, spec node.Spec)
}

// LiveSessions is the optional extension of a [Pusher] (*session.Server implements it) that
// says which nodes hold a live session on this core right now. A node's stored status is
// written behind its session (docs/store.md section 1.2), so right after many nodes dial in
// most documents still say pending or disconnected; a pass counts a node with a live session
// here as connected whatever its document says, so a placement made at that moment spreads
// over every connected node instead of the few whose status was written already.
type LiveSessions interface {
	// Connected reports whether nodeID has a live session on this core.
	Connected(nodeID string) bool
}

// DefaultPushWorkers is how many nodes' desired states one pass writes and pushes at once.
const DefaultPushWorkers = 16

// LeaseSender delivers lease messages on live node sessions (*session.Server implements it).
// Both calls return at once; a node without a live session is skipped (it learns at its next
// hello).
type LeaseSender interface {
	// SendLeaseGrant sends l's signed lease_grant to nodeID.
	SendLeaseGrant(ctx context.Context, nodeID string, l *fencing.Lease)
	// RevokeLease sends a signed lease_revoke of l (with l's current token) to nodeID and
	// handles its command_result in the background.
	RevokeLease(ctx context.Context, nodeID string, l *fencing.Lease, reason string)
}

// RouteSink receives the complete route table whenever it changes.
type RouteSink interface {
	SetRoutes(ctx context.Context, t abiroutes.Table) error
}

// Config wires a Reconciler. Catalog, Nodes and Compiler are required.
type Config struct {
	// RegistryHost is the host (and port) of Berth's registry in image references
	// (deploy.Config.RegistryHost); a desired state whose images name it says so
	// (node.Spec.RegistryHost), so a relayed node pulls them through its relay. Empty: never.
	RegistryHost string
	// RollBack makes the automatic rollback of a failed rollout (rollout.Config.RollBack, core/deploy
	// Deployer.RollBack); nil rolls nothing back.
	RollBack func(ctx context.Context, svc *services.Service) (*services.Service, error)
	// Secrets, when not nil, resolves and seals the workloads' secret values into each node's
	// desired state (docs/node-protocol.md section 6.6); nil delivers none.
	Secrets  SecretSealer
	Catalog  *services.Catalog
	Nodes    *nodes.Registry
	Pusher   Pusher    // nil: desired state is stored, not pushed
	Routes   RouteSink // nil: routes are computed, not pushed
	Compiler routes.Compiler
	// Admit, when not nil, is asked before each slot is placed (the deploy
	// hook); a refusal leaves the slot unplaced until a later pass.
	Admit DeployAdmitter
	// Leases, when not nil, is the lease authority of stateful services: the reconciler grants
	// the lease first (docs/node-protocol.md section 8), the Rollout places the service's one
	// slot on the holder (docs/reconciliation.md section 5.1), and the slot's workload appears in
	// that node's desired state only with the lease's token. Nil places stateful services like
	// portable ones, without leases (tests of other concerns only). A Rollout given here must
	// be configured with the same authority ([rollout.Config.Leases]).
	Leases *fencing.Authority
	// LeaseSender delivers grants and revokes the reconciler decides; nil sends none (nodes
	// learn at their next session).
	LeaseSender LeaseSender
	// Rollout produces the slots and workloads of every service (docs/reconciliation.md);
	// nil builds one over the Catalog's store with the Admit policy and Leases.
	Rollout *rollout.Producer
	// Runtime is the store of the runtime specs and slots the built Rollout works on; required
	// when Rollout is nil, not used otherwise.
	Runtime *rollout.Store
	// Events, when not nil, receives the events the built Rollout emits (rollout.failed, rollout.denied); it
	// is not used when Rollout is given.
	Events *events.Log
	// Metrics, when not nil, is where the built Rollout registers its families
	// ([rollout.NewMetrics]; not when Rollout is given) and where the Reconciler registers
	// berth_reconcile_pass_duration_seconds{kind} (docs/operating.md "Metrics").
	Metrics prometheus.Registerer
	Logger  *slog.Logger
	// Sweep sets the timing of full passes (docs/reconciliation.md section 6): quiet 1 s after
	// the last unkeyed hint, at the latest 30 s after the last pass, never sooner than 5 s after
	// it (zero fields take these defaults). Reconcile requests and node hints
	// ([Reconciler.HintNode]) do not wait for it.
	Sweep slots.SweepConfig
	// QueueLimit bounds each work queue (services, nodes) in distinct keys; zero means
	// [DefaultQueueLimit]. Keys beyond it are dropped and a full pass runs instead.
	QueueLimit int
	// PushWorkers is how many nodes' desired states a pass writes and pushes concurrently; zero
	// means [DefaultPushWorkers], negative one at a time.
	PushWorkers int
}

// DeployAdmitter decides whether slot of service s may start on node n.
// reasons explain a refusal; an error refuses too (fail closed).
type DeployAdmitter interface {
	AdmitDeploy(ctx context.Context, s *services.Service, slot int, n *nodes.Node) (allowed bool, reasons []string, err error)
}

// Reconciler runs passes one at a time, on one goroutine ([Reconciler.Run]). A focused pass
// runs as soon as a service or node key is queued and does the work of exactly those keys; a
// full pass over everything is scheduled by a [slots.Sweeper]: after unkeyed hints went quiet, at
// the latest a period after the last pass, when a failure backoff ends, and when a work queue
// overflowed.
type Reconciler struct {
	cfg   Config
	log   *slog.Logger
	hints chan struct{}
	// svcQ and nodeQ hold the keys that events woke (docs/reconciliation.md section 6).
	svcQ, nodeQ *Queue[string]
	// held are the services whose reconcile requests a pass could not act on (no node was
	// schedulable, or the pass failed): the next focused pass takes them again, and a hint (a
	// node connected, enrolled, ...) queues them. Only the Run goroutine touches it.
	held map[string]bool
	// cleared counts the reconcile requests cleared, for [Reconciler.Stats] and
	// berth_reconcile_requests_cleared_total; heldCount is len(held) for
	// berth_reconcile_requests_held.
	cleared, heldCount atomic.Int64
	// fullPasses and focusedPasses count the passes run, for [Reconciler.Stats].
	fullPasses, focusedPasses atomic.Int64
	// passSeconds is berth_reconcile_pass_duration_seconds by kind (full or focused); nil
	// without Config.Metrics.
	passSeconds *prometheus.HistogramVec
	// gateHint is the pending timer that hints a pass when the earliest gate of an expiring
	// lease held by a silent node opens, so the lease moves then and not at the next tick.
	gateHint *time.Timer
	gateAt   time.Time // when gateHint fires; mu must be held

	mu          sync.Mutex
	routeDigest string // digest of the last table the sink accepted; mu must be held
	routeRev    int64
	table       abiroutes.Table
	compiledAt  time.Time // when table was computed; mu must be held
	routeErr    error     // the last compile failure, nil after a success; mu must be held
	routeErrAt  time.Time // mu must be held
	compiler    string    // the compiler that made table; mu must be held
	failing     string    // the compiler that made routeErr; mu must be held
	// claimLog is what the latest pass decided about route claims, as logClaims
	// last logged it; only route touches it.
	claimLog map[string]string
}

// New returns a Reconciler.
func New(cfg Config) *Reconciler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rollout == nil {
		if cfg.Runtime == nil {
			panic("reconciler: Config.Runtime is required when Config.Rollout is nil") // a wiring bug
		}
		rc := rollout.Config{Store: cfg.Runtime, Catalog: cfg.Catalog, Nodes: cfg.Nodes, Logger: cfg.Logger, Events: cfg.Events,
			Leases: cfg.Leases, RollBack: cfg.RollBack}
		if cfg.Admit != nil {
			rc.Admit = cfg.Admit
		}
		if cfg.Metrics != nil {
			rc.Metrics = rollout.NewMetrics(cfg.Metrics)
		}
		cfg.Rollout = rollout.NewProducer(rc)
	}
	if cfg.PushWorkers == 0 {
		cfg.PushWorkers = DefaultPushWorkers
	}
	cfg.PushWorkers = max(cfg.PushWorkers, 1)
	r := &Reconciler{cfg: cfg, log: cfg.Logger.With("component", "reconciler"), hints: make(chan struct{}, 1),
		svcQ: NewQueue[string](cfg.QueueLimit), nodeQ: NewQueue[string](cfg.QueueLimit), held: map[string]bool{}}
	if cfg.Metrics != nil {
		r.passSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "berth_reconcile_pass_duration_seconds",
			Help:    "Duration of reconcile passes: full (the sweep) or focused (woken by a service's or node's change).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"kind"})
		cfg.Metrics.MustRegister(r.passSeconds,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "berth_reconcile_requests_cleared_total",
				Help: "Reconcile requests (written with a service's or a runtime spec's change) that a pass acted on and cleared."},
				func() float64 { return float64(r.cleared.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_reconcile_requests_held",
				Help: "Services whose reconcile request waits for a pass that can act on it: no node was schedulable, or the pass failed."},
				func() float64 { return float64(r.heldCount.Load()) }))
	}
	return r
}

// observePass records the duration of a pass of kind since start; a no-op without metrics.
func (r *Reconciler) observePass(kind string, start time.Time) {
	if r.passSeconds != nil {
		r.passSeconds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
}

// HintNode records a committed change about node nodeID (an accepted status report, a health
// transition of its workloads) and wakes a focused pass for the node and every service with a
// workload on it, without the sweep's waits. A service's own changes need no hint: each write
// carries its reconcile request, which wakes the reconciler through the store
// ([Reconciler.Run]). It never blocks; a node hinted again before its pass ran is done once, and
// one hinted during its pass is done once more after it.
func (r *Reconciler) HintNode(reason, nodeID string) {
	r.nodeQ.Add(nodeID)
	r.log.Debug("reconcile hinted", "reason", reason, "node_id", nodeID)
}

// PassStats counts the passes a Reconciler finished since New.
type PassStats struct {
	Full    int64 // full passes (the sweep's)
	Focused int64 // focused passes (woken by reconcile requests and keyed hints)
	// Cleared counts the reconcile requests the passes acted on and cleared.
	Cleared int64
}

// Stats returns the passes run so far; safe for concurrent use.
func (r *Reconciler) Stats() PassStats {
	return PassStats{Full: r.fullPasses.Load(), Focused: r.focusedPasses.Load(), Cleared: r.cleared.Load()}
}

// Hint records a committed change whose scope is not one service or node (an enrollment, a
// retirement, a route compiler binding) and asks for a full pass once hints are quiet, under
// the sweep's floor. It never blocks; hints during a pass earn exactly one follow-up pass.
func (r *Reconciler) Hint(reason string) {
	select {
	case r.hints <- struct{}{}:
		r.log.Debug("reconcile hinted", "reason", reason)
	default:
	}
}

// Run passes until ctx ends: the first full pass at once; a focused pass whenever keys are
// queued; further full passes as the [slots.Sweeper] schedules them, when a failure backoff a
// pass reported ends, and at once when a work queue overflowed. A failed pass is logged and
// retried by the next.
//
// Reconcile requests (docs/reconciliation.md section 6), on service documents and on operators'
// runtime specs, reach the service queue two ways:
//
//  1. at start, every pending request in the store (one read of the services and the specs in
//     the read view);
//  2. while running, from subscriptions to the writes of service documents and runtime specs
//     ([services.Catalog.WatchServices], [rollout.Store.WatchSpecs]): each written service or
//     spec that holds a request queues its service. The subscriptions are made before step 1,
//     so no write falls between the two.
//
// After a pass acted on a request (the pass succeeded and some node was schedulable) it is
// cleared by a compare-and-set on the revision the pass read; otherwise the service is held
// and taken again by the next focused pass and by any hint.
func (r *Reconciler) Run(ctx context.Context) {
	sub := r.cfg.Catalog.WatchServices(r.cfg.QueueLimit)
	defer sub.Close()
	specSub := r.cfg.Rollout.Store().WatchSpecs(r.cfg.QueueLimit)
	defer specSub.Close()
	r.queuePending(ctx)
	sw := slots.NewSweeper(r.cfg.Sweep, time.Now())
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		at, _ := sw.Next()
		timer.Reset(max(time.Until(at), 0))
		select {
		case <-ctx.Done():
			return
		case <-r.hints:
			r.hinted(sw)
			continue
		case <-sub.Ready():
			r.written(ctx, sub)
			continue
		case <-specSub.Ready():
			r.writtenSpecs(ctx, specSub)
			continue
		case <-r.svcQ.Ready():
			r.runFocused(ctx, sw)
			continue
		case <-r.nodeQ.Ready():
			r.runFocused(ctx, sw)
			continue
		case <-timer.C:
		}
		if !sw.Start(time.Now()) {
			continue
		}
		start := time.Now()
		res, err := r.pass(ctx, nil)
		r.observePass("full", start)
		r.fullPasses.Add(1)
		if err != nil && ctx.Err() == nil {
			r.log.Error("reconcile pass failed", "err", err)
		}
		r.consume(ctx, nil, res, err)
		select { // a hint during the pass earns one follow-up
		case <-r.hints:
			r.hinted(sw)
		default:
		}
		sw.Finish(time.Now())
		sw.Wake(res.out.WakeAt)
	}
}

// hinted records an unkeyed hint: a full pass once hints are quiet, and at once a focused pass
// for the held services, since what a hint reports (a node connected or enrolled, a lease
// released) may be what their requests waited for.
func (r *Reconciler) hinted(sw *slots.Sweeper) {
	sw.Hint(time.Now())
	for id := range r.held {
		r.svcQ.Add(id)
	}
}

// queuePending queues every service that holds a reconcile request (Run's step 1). A failed
// read is logged: the first full pass, due at once, acts on every request anyway.
func (r *Reconciler) queuePending(ctx context.Context) {
	svcs, err := r.cfg.Catalog.ListServices(ctx, nil)
	if err != nil {
		r.log.Warn("read pending reconcile requests; the first full pass covers them", "err", err)
		return
	}
	n := 0
	for i := range svcs {
		if svcs[i].Reconcile != nil {
			r.svcQ.Add(svcs[i].ID)
			n++
		}
	}
	specs, err := r.cfg.Rollout.Store().PendingSpecs(ctx)
	if err != nil {
		r.log.Warn("read pending reconcile requests of runtime specs; the first full pass covers them", "err", err)
	}
	for id := range specs {
		r.svcQ.Add(id)
		n++
	}
	if n > 0 {
		r.log.Info("pending reconcile requests queued", "services", n)
	}
}

// written queues the services that writes named and that hold a reconcile request (Run's step
// 2), and those whose document is gone (their workloads and slots go). A write that named no
// particular service (or more than the subscription holds) costs one scan of the services in
// the read view. A write without a request (the reconciler's own clear, a change-log tidy)
// queues nothing.
func (r *Reconciler) written(ctx context.Context, sub *store.Subscription) {
	ids, all := sub.Take()
	if all {
		r.queuePending(ctx)
		return
	}
	for _, id := range ids {
		s, err := r.cfg.Catalog.GetServiceByID(ctx, id)
		if errors.Is(err, services.ErrServiceNotFound) {
			r.svcQ.Add(id)
			continue
		}
		if err != nil {
			// The request stays in the store: the full pass, or the next write, acts on it.
			r.log.Warn("read a written service", "service_id", id, "err", err)
			continue
		}
		if s.Reconcile != nil {
			r.svcQ.Add(id)
			r.log.Debug("reconcile requested", "service_id", id, "cause", s.Reconcile.Cause, "revision", s.Reconcile.Revision)
		}
	}
}

// writtenSpecs is [Reconciler.written] for runtime specs: a written spec that holds a reconcile
// request queues its service.
func (r *Reconciler) writtenSpecs(ctx context.Context, sub *store.Subscription) {
	ids, all := sub.Take()
	if all {
		r.queuePending(ctx)
		return
	}
	for _, id := range ids {
		d, err := r.cfg.Rollout.Store().Spec(ctx, id)
		if err != nil {
			r.log.Warn("read a written runtime spec", "service_id", id, "err", err)
			continue
		}
		if d != nil && d.Reconcile != nil {
			r.svcQ.Add(id)
		}
	}
}

// consume ends the reconcile requests a pass read (res.requests and res.specRequests): when the
// pass succeeded and some node was schedulable, each is cleared with a compare-and-set on the
// revision the pass read, so a request written meanwhile stays (and its write has queued its
// service again); otherwise each service is held for the next focused pass. A held service the
// pass worked on (scoped; nil: every service) that has no request any more is let go. A pass
// that keeps failing keeps its services held: each focused pass retries them, as each full
// pass would.
func (r *Reconciler) consume(ctx context.Context, scoped map[string]bool, res passResult, passErr error) {
	for id := range r.held {
		_, svcPending := res.requests[id]
		_, specPending := res.specRequests[id]
		if !svcPending && !specPending && (scoped == nil || scoped[id]) && res.requests != nil {
			delete(r.held, id)
		}
	}
	if passErr != nil || !res.schedulable {
		for id := range res.requests {
			r.held[id] = true
		}
		for id := range res.specRequests {
			r.held[id] = true
		}
		r.heldCount.Store(int64(len(r.held)))
		return
	}
	clearAll := func(what string, reqs map[string]int64, f func(context.Context, string, int64) (bool, error)) {
		for id, rev := range reqs {
			ok, err := f(ctx, id, rev)
			if err != nil {
				r.held[id] = true
				if ctx.Err() == nil {
					r.log.Warn("reconcile request not cleared; the next pass takes it again", "of", what, "service_id", id, "revision", rev, "err", err)
				}
				continue
			}
			delete(r.held, id)
			if ok {
				r.cleared.Add(1)
			}
		}
	}
	clearAll("service", res.requests, r.cfg.Catalog.ClearReconcile)
	clearAll("runtime spec", res.specRequests, r.cfg.Rollout.Store().ClearSpecReconcile)
	r.heldCount.Store(int64(len(r.held)))
}

// runFocused takes every queued key and runs one focused pass over them and the held services;
// an overflow of either queue forces a full pass instead (the keys taken are covered by it).
func (r *Reconciler) runFocused(ctx context.Context, sw *slots.Sweeper) {
	svcKeys, svcOver := r.svcQ.Take(0)
	nodeKeys, nodeOver := r.nodeQ.Take(0)
	defer func() {
		for _, k := range svcKeys {
			r.svcQ.Done(k)
		}
		for _, k := range nodeKeys {
			r.nodeQ.Done(k)
		}
	}()
	if svcOver || nodeOver {
		r.log.Warn("reconcile work queue overflowed: running a full pass", "limit", r.cfg.QueueLimit)
		sw.Force(time.Now())
		return
	}
	if len(svcKeys) == 0 && len(nodeKeys) == 0 {
		return
	}
	scoped := make(map[string]bool, len(svcKeys)+len(r.held))
	for _, id := range svcKeys {
		scoped[id] = true
	}
	for id := range r.held {
		scoped[id] = true
	}
	ids := slices.Sorted(maps.Keys(scoped))
	start := time.Now()
	res, err := r.pass(ctx, &scope{services: ids, nodes: nodeKeys})
	r.observePass("focused", start)
	r.focusedPasses.Add(1)
	if err != nil && ctx.Err() == nil {
		r.log.Error("focused reconcile pass failed", "services", len(ids), "nodes", len(nodeKeys), "err", err)
	}
	r.consume(ctx, scoped, res, err)
	sw.Wake(res.out.WakeAt)
}

// scope is the work of a focused pass: the keys that events woke.
type scope struct {
	services, nodes []string
}

// Table returns the last route table computed.
func (r *Reconciler) Table() abiroutes.Table {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table
}

// RouteStatus returns the route table in force (redacted: certificates without
// their PEM), its SHA-256, the compiler and
// the last compile failure (routes.Status).
func (r *Reconciler) RouteStatus() routes.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := routes.Status{Table: r.table.Redacted(), SHA256: r.table.Digest(), CompiledAt: r.compiledAt, Compiler: r.compiler}
	if st.Table.Routes == nil {
		st.Table.Routes = []abiroutes.Route{}
	}
	if st.Compiler == "" { // nothing compiled yet
		st.Compiler = "none yet; next: " + describe(r.cfg.Compiler)
	}
	if r.routeErr != nil {
		at := r.routeErrAt
		st.LastError, st.LastErrorAt, st.FailingCompiler = r.routeErr.Error(), &at, r.failing
	}
	return st
}

// describe names a compiler: its Describe method (routes.Wasm,
// routes.Bindable: the compiler its latest Compile ran), else "unknown".
func describe(c routes.Compiler) string {
	if d, ok := c.(interface{ Describe() string }); ok {
		return d.Describe()
	}
	return "unknown"
}

// Pass runs one reconcile pass: placement of stateful services with their leases, the slots
// of portable services (core/rollout), then routes, then node desired states, then the lease
// grants decided.
// It neither reads nor clears reconcile requests: [Reconciler.Run] does.
func (r *Reconciler) Pass(ctx context.Context) error {
	_, err := r.pass(ctx, nil)
	return err
}

// PassFor runs one focused pass over the given services and nodes (what [Reconciler.Run] does
// when they are hinted): the node keys add every service with a workload on the node; the
// services are placed and rolled out, the routes recompiled, and the desired state of every node
// that holds (before or after) a workload of those services, or was named, is written and pushed.
// Leases are not swept and node retirements not finished: the full pass does those. Like Pass,
// it leaves reconcile requests alone.
func (r *Reconciler) PassFor(ctx context.Context, serviceIDs, nodeIDs []string) error {
	_, err := r.pass(ctx, &scope{services: serviceIDs, nodes: nodeIDs})
	return err
}

// passResult is what a pass reports besides its error.
type passResult struct {
	out rollout.Outcome
	// requests are the reconcile requests of the services the pass worked on, as it read them:
	// service id to the service revision read; specRequests those of their runtime specs, to
	// the spec revision read.
	requests, specRequests map[string]int64
	// schedulable reports whether some node could take work when the pass read the nodes.
	schedulable bool
}

// pass runs a full pass (sc nil) or a focused one over sc.
func (r *Reconciler) pass(ctx context.Context, sc *scope) (passResult, error) {
	var res passResult
	out, err := r.passOnce(ctx, sc, &res)
	res.out = out
	return res, err
}

// passOnce is pass; it fills res.requests and res.schedulable once it read the services and
// nodes.
func (r *Reconciler) passOnce(ctx context.Context, sc *scope, res *passResult) (rollout.Outcome, error) {
	var out rollout.Outcome
	if r.cfg.Leases != nil && sc == nil {
		if err := r.cfg.Leases.Sweep(ctx); err != nil {
			return out, err
		}
	}
	svcs, err := r.cfg.Catalog.ListServices(ctx, nil)
	if err != nil {
		return out, err
	}
	ns, err := r.nodes(ctx)
	if err != nil {
		return out, err
	}
	wls, err := r.cfg.Catalog.ListWorkloads(ctx, nil)
	if err != nil {
		return out, err
	}
	res.requests, res.specRequests = map[string]int64{}, map[string]int64{}
	var named map[string]bool
	if sc != nil {
		named = make(map[string]bool, len(sc.services))
		for _, id := range sc.services {
			named[id] = true
		}
	}
	for i := range svcs {
		if svcs[i].Reconcile != nil && (sc == nil || named[svcs[i].ID]) {
			res.requests[svcs[i].ID] = svcs[i].Revision
		}
	}
	if sc == nil {
		if res.specRequests, err = r.cfg.Rollout.Store().PendingSpecs(ctx); err != nil {
			return out, err
		}
	} else {
		for _, id := range sc.services {
			d, err := r.cfg.Rollout.Store().Spec(ctx, id)
			if err != nil {
				return out, err
			}
			if d != nil && d.Reconcile != nil {
				res.specRequests[id] = d.Revision
			}
		}
	}
	res.schedulable = slices.ContainsFunc(ns, func(n nodes.Node) bool { return n.Status == nodes.StatusConnected && n.Member() })
	// only (nil in a full pass) is the services a focused pass works on; touched the nodes whose
	// desired state it rewrites: the named ones and those of the services' workloads, before and
	// after the pass.
	var only, touched map[string]bool
	if sc != nil {
		only, touched = map[string]bool{}, map[string]bool{}
		for _, id := range sc.services {
			only[id] = true
		}
		for _, id := range sc.nodes {
			touched[id] = true
		}
		for _, w := range wls {
			if touched[w.NodeID] {
				only[w.ServiceID] = true
			}
		}
		for _, w := range wls {
			if only[w.ServiceID] {
				touched[w.NodeID] = true
			}
		}
		for i := range ns {
			// A retirement finishes in the full pass (it counts every service's slots on the
			// node): news from a retiring node asks for one.
			if rt := ns[i].Retirement; rt != nil && rt.State == nodes.RetirementRetiring && slices.Contains(sc.nodes, ns[i].ID) {
				r.Hint("node.retiring")
			}
		}
	}
	granted, err := r.place(ctx, svcs, ns, wls, only)
	if err != nil {
		return out, err
	}
	use := placement.UsageOf(svcs, wls)
	var errs []error
	var ids []string
	for i := range svcs {
		if only[svcs[i].ID] {
			ids = append(ids, svcs[i].ID)
		}
	}
	if only == nil {
		out, err = r.cfg.Rollout.Sweep(ctx, svcs, ns, use)
	} else {
		out, err = r.cfg.Rollout.SweepServices(ctx, ids, svcs, ns, use)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if out.Changed {
		// The sweep may have finished deletions and retirements.
		if svcs, err = r.cfg.Catalog.ListServices(ctx, nil); err != nil {
			return out, err
		}
		if ns, err = r.nodes(ctx); err != nil {
			return out, err
		}
	}
	if wls, err = r.cfg.Catalog.ListWorkloads(ctx, nil); err != nil {
		return out, err
	}
	if touched != nil {
		for _, w := range wls {
			if only[w.ServiceID] {
				touched[w.NodeID] = true
			}
		}
		for i := range granted {
			touched[granted[i].Holder] = true
		}
	}
	leases, err := r.leases(ctx)
	if err != nil {
		return out, err
	}
	// Routes first: a workload about to be stopped leaves the gateway before its node stops it.
	if err := r.route(ctx, svcs, ns, wls); err != nil {
		errs = append(errs, err)
	}
	if err := r.desire(ctx, svcs, ns, wls, leases, touched); err != nil {
		errs = append(errs, err)
	}
	// Grants go out after the desired state naming their token: the node starts the workload
	// once it holds the lease under that token (section 6.4), whichever arrives first.
	if r.cfg.LeaseSender != nil {
		for i := range granted {
			r.cfg.LeaseSender.SendLeaseGrant(ctx, granted[i].Holder, &granted[i])
		}
	}
	return out, errors.Join(errs...)
}

// nodes lists the nodes as a pass sees them: as stored, except that a node with a live session
// on this core ([LiveSessions]) whose document is still pending or disconnected is connected.
func (r *Reconciler) nodes(ctx context.Context) ([]nodes.Node, error) {
	ns, err := r.cfg.Nodes.List(ctx)
	if err != nil {
		return nil, err
	}
	live, ok := r.cfg.Pusher.(LiveSessions)
	if !ok {
		return ns, nil
	}
	for i := range ns {
		if (ns[i].Status == nodes.StatusPending || ns[i].Status == nodes.StatusDisconnected) && live.Connected(ns[i].ID) {
			ns[i].Status = nodes.StatusConnected
		}
	}
	return ns, nil
}

// leases returns the lease of every stateful service by service id (nil without an authority).
func (r *Reconciler) leases(ctx context.Context) (map[string]*fencing.Lease, error) {
	if r.cfg.Leases == nil {
		return nil, nil
	}
	all, err := r.cfg.Leases.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*fencing.Lease, len(all))
	for i := range all {
		out[all[i].ResourceID] = &all[i]
	}
	return out, nil
}

// place grants the leases of stateful services (their one slot is then produced on the
// holder by core/rollout, like any other slot), removes the workloads no slot names (of deleted
// services, and those an earlier version placed without a slot), and returns the leases it
// granted. only, when not nil, limits all of it to those services (a focused pass), and the
// leases of services that are gone are then left to the full pass.
func (r *Reconciler) place(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload, only map[string]bool) ([]fencing.Lease, error) {
	var granted []fencing.Lease
	use := placement.UsageOf(svcs, wls)
	current := map[string]string{} // the node of each service's replica "0"
	for _, w := range wls {
		if w.Replica == "0" && w.DesiredStatus != services.DesiredRemoved {
			current[w.ServiceID] = w.NodeID
		}
	}
	draining := map[string]bool{}
	for i := range ns {
		draining[ns[i].ID] = ns[i].Draining()
	}
	// live: stateful services whose document exists (a deleting one keeps its lease until its
	// slot settled and the finalizer removed the document); known: every service listed.
	live, known := map[string]bool{}, map[string]bool{}
	for i := range svcs {
		s := &svcs[i]
		known[s.ID] = true
		if !s.Stateful() || r.cfg.Leases == nil {
			continue
		}
		live[s.ID] = true
		if (only != nil && !only[s.ID]) || s.Deleting {
			continue
		}
		l, ok := r.placeStateful(ctx, s, placement.Candidates(ns, use, s.Runtime), current[s.ID], draining)
		if !ok || l == nil {
			continue
		}
		granted = append(granted, *l)
		use.Add(l.Holder, placement.ServiceKey(s.Project, s.Name), placement.ReplicaResources(s))
	}
	// Workloads no slot names: of services that are gone (a slot set of a vanished service is
	// core/rollout's), and of any service that an earlier version placed without a slot.
	for _, w := range wls {
		if only != nil && !only[w.ServiceID] {
			continue
		}
		if (w.Replica == "" && w.JobRun == "") || !known[w.ServiceID] {
			if err := r.cfg.Catalog.RemoveWorkload(ctx, w.ID); err != nil {
				return granted, err
			}
			r.log.Info("workload removed", "service", w.Project+"/"+w.Service, "reason", "no slot names it", "workload_id", w.ID)
		}
	}
	if only != nil {
		return granted, nil
	}
	return granted, r.deleteLeases(ctx, live)
}

// placeStateful decides where a stateful service's lease should be held ([placement.LeaseTarget]
// over the nodes cands and the node of its current workload) and grants it there with one
// compare-and-set on the lease when it is not held there yet. It returns the lease granted, nil
// when no grant was needed, and ok=false when the lease could not be read or granted (a later
// pass decides again); a node the lease was moved from is revoked (reason moved), and a holder
// that drains (draining) is revoked with reason drain while another node can take the lease, and
// nothing is granted that pass. The slot itself follows the holder in core/rollout.
func (r *Reconciler) placeStateful(ctx context.Context, s *services.Service, cands []placement.Node, current string, draining map[string]bool) (*fencing.Lease, bool) {
	la := r.cfg.Leases
	view := placement.Lease{Movable: true}
	l, err := la.Get(ctx, fencing.LeaseID(s.ID))
	if err == nil {
		gate, timed := l.Gate()
		view = placement.Lease{Holder: l.Holder, Blocked: l.Blocked() || l.Deleted,
			Movable: !l.Blocked() && !l.Deleted && timed && !la.Now().Before(gate)}
	} else if !errors.Is(err, store.ErrNotFound) {
		r.log.Warn("read lease", "service", s.Project+"/"+s.Name, "err", err)
		return nil, false
	}
	if l != nil && !view.Movable && !view.Blocked && l.Holder != "" && !availableIn(cands, l.Holder) {
		if gate, timed := l.Gate(); timed {
			r.hintAt(gate.Sub(la.Now()))
		}
	}
	if l != nil && l.Holder != "" && !l.Blocked() && !l.Deleted && draining[l.Holder] && r.cfg.LeaseSender != nil && elsewhere(cands, l.Holder) {
		// Handed over in order: the draining holder is asked to stop and give the lease back;
		// its ok frees the lease (core/session), and a later pass grants it to a schedulable node.
		r.log.Info("lease handed over: its holder drains", "service", s.Project+"/"+s.Name, "lease_id", l.ID, "node_id", l.Holder, "fencing_token", l.FencingToken)
		r.cfg.LeaseSender.RevokeLease(ctx, l.Holder, l, node.RevokeDrain)
		return nil, true
	}
	if l != nil && l.Blocked() && !l.Deleted {
		r.log.Warn("stateful service held back: its lease is blocked by an unacknowledged failed fence",
			"service", s.Project+"/"+s.Name, "lease_id", l.ID, "fence_failed", l.FenceFailed)
	}
	grantTo, chosen := placement.LeaseTarget(view, s.Replicas > 0, placement.ServiceRequest(s), cands, current)
	if grantTo == "" {
		if chosen != nil && chosen.NodeID == "" {
			r.log.Info("stateful service unplaceable", "service", s.Project+"/"+s.Name, "reason", chosen.Reason)
		}
		return nil, true
	}
	mode := node.LeaseMode(s.LeaseMode)
	if mode == "" {
		mode = node.LeaseLocal
	}
	gl, moved, err := la.Grant(ctx, fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: s.ID, NodeID: grantTo,
		Mode: mode, Duration: time.Duration(s.LeaseDurationMS) * time.Millisecond})
	if err != nil {
		r.log.Info("stateful service waits for its lease", "service", s.Project+"/"+s.Name, "node_id", grantTo, "reason", err)
		return nil, false
	}
	r.log.Info("lease granted", "service", s.Project+"/"+s.Name, "lease_id", gl.ID, "node_id", grantTo, "fencing_token", gl.FencingToken, "moved_from", moved)
	if moved != "" && r.cfg.LeaseSender != nil {
		r.cfg.LeaseSender.RevokeLease(ctx, moved, gl, node.RevokeMoved)
	}
	return gl, true
}

// hintAt arranges a hint after d (a lease's gate opening), unless one is due earlier.
func (r *Reconciler) hintAt(d time.Duration) {
	if d < 0 {
		d = 0
	}
	at := time.Now().Add(d + 10*time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gateHint != nil && !r.gateAt.IsZero() && r.gateAt.Before(at) && time.Now().Before(r.gateAt) {
		return
	}
	if r.gateHint != nil {
		r.gateHint.Stop()
	}
	r.gateAt = at
	r.gateHint = time.AfterFunc(time.Until(at), func() { r.Hint("lease.gate") })
}

// elsewhere reports whether a node of cands other than id takes new work: where a lease handed
// over by a draining holder can go.
func elsewhere(cands []placement.Node, id string) bool {
	for _, n := range cands {
		if n.ID != id && n.Unavailable == "" && !n.Cordoned {
			return true
		}
	}
	return false
}

// availableIn reports whether node id is among cands and takes new work.
func availableIn(cands []placement.Node, id string) bool {
	for _, n := range cands {
		if n.ID == id {
			return n.Unavailable == ""
		}
	}
	return false
}

// deleteLeases frees for good the lease of every stateful service that no longer exists, and
// revokes its holder (reason deleted).
func (r *Reconciler) deleteLeases(ctx context.Context, live map[string]bool) error {
	if r.cfg.Leases == nil {
		return nil
	}
	all, err := r.cfg.Leases.List(ctx, nil)
	if err != nil {
		return err
	}
	for _, l := range all {
		if l.Deleted || live[l.ResourceID] {
			continue
		}
		before, err := r.cfg.Leases.Delete(ctx, l.ResourceID)
		if err != nil {
			return err
		}
		r.log.Info("lease of a deleted service released", "lease_id", l.ID, "holder", l.Holder)
		if before != nil && before.Holder != "" && r.cfg.LeaseSender != nil {
			after, err := r.cfg.Leases.Get(ctx, l.ID)
			if err != nil {
				return err
			}
			r.cfg.LeaseSender.RevokeLease(ctx, before.Holder, after, node.RevokeDeleted)
		}
	}
	return nil
}

// admit asks the deploy hook about one placement and logs a refusal.
func (r *Reconciler) admit(ctx context.Context, s *services.Service, slot int, nodeID string, ns []nodes.Node) (bool, error) {
	var n *nodes.Node
	for i := range ns {
		if ns[i].ID == nodeID {
			n = &ns[i]
		}
	}
	if n == nil {
		return false, nil
	}
	ok, reasons, err := r.cfg.Admit.AdmitDeploy(ctx, s, slot, n)
	if err != nil {
		r.log.Warn("deploy not admitted: policy unavailable", "service", s.Project+"/"+s.Name, "slot", slot, "err", err)
		return false, nil
	}
	if !ok {
		r.log.Warn("deploy denied by policy", "service", s.Project+"/"+s.Name, "slot", slot, "node_id", nodeID, "reasons", strings.Join(reasons, "; "))
	}
	return ok, nil
}

// desire writes and pushes the desired state of every node (only those in touched, when not
// nil), [Config.PushWorkers] nodes at a time: each node's spec is built, encoded, stored with one
// compare-and-set on the node document and pushed on the node's session (signed there, once per
// node) by one worker, so no node waits for another's store write or socket.
func (r *Reconciler) desire(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload, leases map[string]*fencing.Lease, touched map[string]bool) error {
	byID := map[string]*services.Service{}
	for i := range svcs {
		byID[svcs[i].ID] = &svcs[i]
	}
	perNode := map[string][]services.Workload{}
	for _, w := range wls {
		perNode[w.NodeID] = append(perNode[w.NodeID], w)
	}
	var todo []*nodes.Node
	for i := range ns {
		n := &ns[i]
		if n.Status == nodes.StatusRemoved || (touched != nil && !touched[n.ID]) {
			continue
		}
		todo = append(todo, n)
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan *nodes.Node)
	for range min(r.cfg.PushWorkers, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				if err := r.desireNode(ctx, n, perNode[n.ID], byID, leases); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, n := range todo {
		if ctx.Err() != nil {
			break
		}
		next <- n
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// desireNode writes node n's desired state from its workloads wls, records the revision on its
// slot workloads, and pushes it. Safe to run for different nodes at once.
func (r *Reconciler) desireNode(ctx context.Context, n *nodes.Node, wls []services.Workload, byID map[string]*services.Service, leases map[string]*fencing.Lease) error {
	spec := BuildSpec(n, wls, byID, leases)
	nameRegistry(&spec, r.cfg.RegistryHost)
	if r.cfg.Secrets != nil {
		if err := r.cfg.Secrets.Resolve(ctx, n, &spec, workloadsByID(wls), byID); err != nil {
			return err
		}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("marshal desired state: %w", err)
	}
	// The hash covers the secrets as resolved (names, versions, node key) but not their
	// sealed values, which are random per sealing: they are sealed only when it changed.
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:])
	if r.cfg.Secrets != nil && hash != n.DesiredHash && hasSecrets(&spec) {
		if err := r.cfg.Secrets.Seal(ctx, n, &spec); err != nil {
			r.log.Error("workload secrets not sealed; those workloads are refused by the node", "node_id", n.ID, "err", err)
		}
		if raw, err = json.Marshal(spec); err != nil {
			return fmt.Errorf("marshal desired state: %w", err)
		}
	}
	rev, changed, err := r.cfg.Nodes.SetDesired(ctx, n, hash, string(raw))
	if err != nil {
		return err
	}
	if changed {
		r.log.Info("desired state updated", "node_id", n.ID, "rev", rev, "workloads", len(spec.Workloads))
	}
	var errs []error
	// rev carries every slot workload's desired status: once the node applied it, that
	// status is acknowledged (the receipts of docs/reconciliation.md section 3).
	for _, w := range wls {
		if w.Replica != "" && w.StatusRev == 0 {
			if err := r.cfg.Catalog.RecordStatusRev(ctx, w.ID, w.DesiredStatus, rev); err != nil {
				errs = append(errs, err)
			}
		}
	}
	switch p := r.cfg.Pusher.(type) {
	case nil:
	case SpecPusher:
		p.PushSpec(ctx, n.ID, rev, spec)
	default:
		p.Push(ctx, n.ID)
	}
	return errors.Join(errs...)
}

// SecretSealer resolves a node's workload secrets into its desired spec and seals their values
// to the node (core/secrets/delivery.Sealer).
type SecretSealer interface {
	Resolve(ctx context.Context, n *nodes.Node, spec *node.Spec, wls map[string]*services.Workload, svcs map[string]*services.Service) error
	Seal(ctx context.Context, n *nodes.Node, spec *node.Spec) error
}

func workloadsByID(wls []services.Workload) map[string]*services.Workload {
	out := make(map[string]*services.Workload, len(wls))
	for i := range wls {
		out[wls[i].ID] = &wls[i]
	}
	return out
}

// nameRegistry sets spec.RegistryHost to host when an image of spec's workloads is on it (the
// core's registry), so a relayed node pulls it through its relay; a spec without such an image
// gets none, and so no new revision. An empty host names nothing.
func nameRegistry(spec *node.Spec, host string) {
	if host == "" {
		return
	}
	for _, w := range spec.Workloads {
		if strings.HasPrefix(w.Image, host+"/") {
			spec.RegistryHost = host
			return
		}
	}
}

func hasSecrets(spec *node.Spec) bool {
	for i := range spec.Workloads {
		if len(spec.Workloads[i].Secrets) > 0 {
			return true
		}
	}
	return false
}

// BuildSpec returns the desired spec of node n holding workloads wls, whose
// services are in svcs by id. Workloads and routes are sorted, so the same
// input gives the same bytes.
//
// When leases is not nil (by service id), a stateful service's workload appears only when n holds
// its lease, not blocked by a failed fence, and carries the lease id and token
// (docs/node-protocol.md section 6.4); otherwise it is left out, so the node stops it. A service
// deleted with its volumes that still has a workload document on n is named in PurgeVolumes.
func BuildSpec(n *nodes.Node, wls []services.Workload, svcs map[string]*services.Service, leases map[string]*fencing.Lease) node.Spec {
	spec := node.Spec{Workloads: []node.WorkloadSpec{}, Routes: []node.RouteSpec{}, Network: node.Network{Address: n.Address}}
	routed := map[string][]string{}
	purge := map[string]node.VolumePurge{}
	for _, w := range wls {
		s := svcs[w.ServiceID]
		if s != nil && s.Deleting && s.PurgeVolumes && len(s.Volumes) > 0 {
			// Until the slot on this node settled, which needs this node's receipt of the
			// removal: the agent purges before acknowledging (docs/node-protocol.md 6.7).
			purge[s.ID] = node.VolumePurge{ProjectID: s.ProjectID, Project: s.Project, ServiceID: s.ID, Service: s.Name}
		}
		if s == nil || w.DesiredStatus == services.DesiredRemoved {
			continue
		}
		run := w.Run // what the workload's attempt was admitted with
		if run == nil {
			run = services.InvocationOf(s)
		}
		ws := node.WorkloadSpec{
			WorkloadID: w.ID, ProjectID: s.ProjectID, Project: s.Project, ServiceID: s.ID, Service: s.Name,
			Slot: w.Slot, Driver: defaultDriver(n), BundleDigest: run.BundleDigest, Command: run.Command, Env: run.Env,
			Image: run.Image, User: run.User, MemoryBytes: run.MemoryMB << 20, CPUMillis: run.CPUMillis,
			Port: run.Port, DesiredStatus: node.DesiredRunning,
			HealthCheck: node.HealthCheck{Path: run.HealthCheck.Path, IntervalS: run.HealthCheck.IntervalS, TimeoutS: run.HealthCheck.TimeoutS, Failures: run.HealthCheck.Failures},
		}
		if run.Runtime != "" {
			ws.Driver = run.Runtime
		}
		for _, v := range s.Volumes { // owned by the service, the same for every attempt
			ws.Volumes = append(ws.Volumes, node.Volume{Name: v.Name, Path: v.Path})
		}
		if s.Stateful() && leases != nil {
			l := leases[s.ID]
			if l == nil || l.Holder != n.ID || l.Blocked() || l.Deleted {
				continue
			}
			ws.Stateful, ws.LeaseID, ws.FencingToken = true, l.ID, l.FencingToken
		}
		if w.DesiredStatus == services.DesiredStopped {
			ws.DesiredStatus = node.DesiredStopped
		}
		if w.JobRun != "" { // one run of a job: it runs to completion (docs/jobs.md section 7)
			ws.Job = &node.JobRun{RunID: w.JobRun, TimeoutS: w.JobTimeoutS, Retries: w.JobRetries}
		}
		if w.MemoryBytes > 0 {
			ws.MemoryBytes = w.MemoryBytes
		}
		if w.CPUMillis > 0 {
			ws.CPUMillis = w.CPUMillis
		}
		if p := w.Probe; p != nil {
			ws.HealthCheck = node.HealthCheck{Path: p.Path, IntervalS: p.IntervalS, TimeoutS: p.TimeoutS, Failures: p.Failures}
		}
		spec.Workloads = append(spec.Workloads, ws)
		if ws.DesiredStatus != node.DesiredRunning || s.Deleting || w.JobRun != "" { // a run serves no route
			continue
		}
		for _, d := range s.Domains {
			routed[d+"\x00"+s.ID] = append(routed[d+"\x00"+s.ID], w.ID)
		}
	}
	sort.Slice(spec.Workloads, func(i, j int) bool { return spec.Workloads[i].WorkloadID < spec.Workloads[j].WorkloadID })
	for k, ids := range routed {
		host, svc, _ := strings.Cut(k, "\x00")
		sort.Strings(ids)
		spec.Routes = append(spec.Routes, node.RouteSpec{Hostname: host, ServiceID: svc, WorkloadIDs: ids, TLSMode: "none"})
	}
	sort.Slice(spec.Routes, func(i, j int) bool { return spec.Routes[i].Hostname < spec.Routes[j].Hostname })
	for _, p := range purge {
		spec.PurgeVolumes = append(spec.PurgeVolumes, p)
	}
	sort.Slice(spec.PurgeVolumes, func(i, j int) bool {
		a, b := spec.PurgeVolumes[i], spec.PurgeVolumes[j]
		return a.Project < b.Project || a.Project == b.Project && a.Service < b.Service
	})
	return spec
}

func (r *Reconciler) route(ctx context.Context, svcs []services.Service, ns []nodes.Node, wls []services.Workload) error {
	nodeAddr := map[string]string{}
	for _, n := range ns {
		nodeAddr[n.ID] = n.Address
	}
	in := routes.Input{}
	deleting := map[string]bool{}
	timeouts := map[[2]string]abiroutes.Timeouts{} // by project and service name
	stream := map[[2]string]bool{}
	for _, s := range svcs {
		if s.Deleting { // a deleting service's routes are withdrawn (docs/reconciliation.md section 9)
			deleting[s.ID] = true
			continue
		}
		in.Services = append(in.Services, routes.Service{ID: s.ID, Project: s.Project, Name: s.Name, Domains: s.Domains, TLSMode: s.TLS.Mode})
		if s.Timeouts != (abiroutes.Timeouts{}) {
			timeouts[[2]string{s.Project, s.Name}] = s.Timeouts
		}
		if s.Stream {
			stream[[2]string{s.Project, s.Name}] = true
		}
	}
	for _, w := range wls {
		// A job run or one-off command (docs/jobs.md) is never a backend of its service's routes.
		if deleting[w.ServiceID] || w.DesiredStatus != services.DesiredRunning || w.JobRun != "" {
			continue
		}
		in.Workloads = append(in.Workloads, routes.Workload{ID: w.ID, ServiceID: w.ServiceID, NodeID: w.NodeID, NodeAddress: nodeAddr[w.NodeID],
			Address: w.Address, ObservedStatus: w.ObservedStatus, Health: w.Health})
	}
	// Route claims decide contested hostnames before any compiler sees them
	// (docs/routes.md section 2), and the compiled table is held to them.
	claims, err := r.claimsFor(ctx, svcs)
	if err != nil {
		return fmt.Errorf("read route claims (keeping the last good table): %w", err)
	}
	in, resolution := routes.ResolveClaims(in, claims)
	t, err := r.cfg.Compiler.Compile(ctx, in)
	if err == nil {
		// A table that hands a held hostname to another service is refused
		// whole, naming the compiler and the hostnames.
		if err = resolution.Enforce(&t); err != nil {
			err = fmt.Errorf("route compiler %s: %w", describe(r.cfg.Compiler), err)
		} else {
			r.logClaims(resolution)
		}
	}
	// A service's gateway timeouts and stream ride on its routes whatever
	// compiler made them (docs/plugins.md sections 5.2 and 5.4; a compiler's
	// stream stays when the service sets none); the digest below covers them.
	for i := range t.Routes {
		k := [2]string{t.Routes[i].Project, t.Routes[i].Service}
		if to, ok := timeouts[k]; ok {
			t.Routes[i].Timeouts = to
		}
		if stream[k] {
			t.Routes[i].Stream = true
		}
	}
	by := describe(r.cfg.Compiler)
	r.mu.Lock()
	if err != nil {
		r.routeErr, r.routeErrAt, r.failing = err, time.Now().UTC(), by
	} else {
		r.routeErr, r.failing = nil, ""
	}
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("compile routes (keeping the last good table): %w", err)
	}
	digest := tableDigest(t)
	r.mu.Lock()
	same := digest == r.routeDigest
	if !same {
		r.routeRev++
	}
	t.Revision = r.routeRev
	r.compiler = by
	if !same {
		r.table = t
		r.compiledAt = time.Now().UTC()
	}
	r.mu.Unlock()
	if same || r.cfg.Routes == nil {
		return nil
	}
	if err := r.cfg.Routes.SetRoutes(ctx, t); err != nil {
		return fmt.Errorf("push route table: %w", err)
	}
	r.mu.Lock()
	r.routeDigest = digest
	r.mu.Unlock()
	r.log.Info("route table pushed", "revision", t.Revision, "routes", len(t.Routes), "digest", digest[:12])
	return nil
}
