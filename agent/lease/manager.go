package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sys/unix"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
)

// BootIDPath is where Linux exposes the kernel boot id.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// Stop budgets of a local lease's fence: local leases have no expiry to beat,
// so their workloads get the reconcile loop's usual graceful timeout.
const (
	DefaultLocalGrace = 10 * time.Second
	DefaultLocalForce = 5 * time.Second
)

// inspectBudget bounds the Inspect that confirms a workload after a failed
// forced stop.
const inspectBudget = 2 * time.Second

// Clock reads the node's monotonic clock.
type Clock interface {
	// Now returns the current instant.
	Now() Mono
}

// BootClock is CLOCK_BOOTTIME: monotonic, and counting while suspended.
type BootClock struct{}

// Now implements Clock.
func (BootClock) Now() Mono {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("lease: CLOCK_BOOTTIME unreadable: %v", err)) // Linux always has it
	}
	return time.Duration(ts.Nano())
}

// ReadBootID returns the kernel boot id (a UUID), which changes on every boot.
func ReadBootID() (string, error) {
	raw, err := os.ReadFile(BootIDPath)
	if err != nil {
		return "", fmt.Errorf("read kernel boot id: %w", err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// Config configures a Manager. Store and Driver are required.
type Config struct {
	Store  *localstore.Store
	Driver runtime.Driver // the runtime driver the fences stop workloads through
	NodeID string         // names the node in the events it emits
	// Clock is the monotonic clock validities are measured on; nil means
	// [BootClock]. It must be CLOCK_BOOTTIME for leases to survive an agent
	// restart (a validity stored under another clock is not trusted).
	Clock Clock
	// BootID is the kernel boot id; empty means [ReadBootID].
	BootID string
	// Now is the wall clock for fence records and events; nil means time.Now.
	Now func() time.Time
	// Emit buffers an event for the core (node.fenced, node.fence_failed);
	// nil drops them.
	Emit func(ctx context.Context, ev node.Event) error
	// OnChange is called after a lease changed state or a fence ended (for
	// instance to wake the reconcile loop); nil means none. Never called
	// with a lock held.
	OnChange func()
	// LocalGrace and LocalForce bound the graceful and the forced stop of a
	// local lease's fence; zero means DefaultLocalGrace and
	// DefaultLocalForce. An expiring lease's fence uses M/2 for each, so that
	// T_grace + T_force <= M (docs/node-protocol.md section 8.5).
	LocalGrace, LocalForce time.Duration
	Logger                 *slog.Logger // nil discards
}

// Status is what the reconcile loop needs of one lease.
type Status struct {
	State node.LeaseState
	Token int64
	// Startable reports whether a stateful workload with exactly Token may
	// start now ([Machine.CanStart]).
	Startable bool
}

// Manager runs the node's leases: it persists the [Machine] in the local
// store, asks for renewals, fences leases that expire or are revoked, and
// gates stateful starts. Create it with [New], run it with [Manager.Run].
// Safe for concurrent use.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	clock Clock
	boot  string

	renew chan struct{}
	wake  chan struct{}

	mu      sync.Mutex
	m       *Machine                 // mu must be held
	gates   map[string]*sync.RWMutex // per lease: starts hold it shared, fences exclusive; mu must be held
	fences  map[string]*fenceRun     // newest fence per lease; mu must be held
	waiting []*fenceRun              // fences ordered before Run, started by Run; mu must be held
	life    context.Context          // set by Run; mu must be held
	wg      sync.WaitGroup           // running fences
}

// fenceRun is one fence of one lease; done closes when it ended.
type fenceRun struct {
	order       FenceOrder
	prev        *fenceRun // the lease's previous fence, which runs first
	done        chan struct{}
	ok          bool
	interrupted bool // the agent stopped mid-fence: the lease stays fencing
	bound       []string
	running     []string // workloads that may still run after a failed fence
}

// New loads the persisted leases and failed fences and restores them
// (docs/node-protocol.md section 8.4): leases stored under another kernel
// boot id, or whose validity ran out, come back expired and are fenced when
// [Manager.Run] starts; a fence interrupted by a crash is run again.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Driver == nil {
		return nil, errors.New("lease: Store and Driver are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = BootClock{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LocalGrace <= 0 {
		cfg.LocalGrace = DefaultLocalGrace
	}
	if cfg.LocalForce <= 0 {
		cfg.LocalForce = DefaultLocalForce
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.BootID == "" {
		id, err := ReadBootID()
		if err != nil {
			return nil, fmt.Errorf("lease: %w", err)
		}
		cfg.BootID = id
	}
	mg := &Manager{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, boot: cfg.BootID,
		renew: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		m: NewMachine(), gates: map[string]*sync.RWMutex{}, fences: map[string]*fenceRun{}}
	rows, err := cfg.Store.Leases(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var leases []Lease
	for _, r := range rows {
		l := Lease{LeaseID: r.LeaseID, ResourceType: r.ResourceType, ResourceID: r.ResourceID,
			Mode: node.LeaseMode(r.Mode), Token: r.Token, State: node.LeaseState(r.State),
			Duration: time.Duration(r.DurationMS) * time.Millisecond, Fence: FenceState(r.Fence), FenceReason: r.FenceReason}
		if r.ValidUntilNS != nil && r.BootID == cfg.BootID {
			l.HasValidity, l.ValidUntil = true, time.Duration(*r.ValidUntilNS)
		}
		leases = append(leases, l)
	}
	recs, err := cfg.Store.Fences(ctx, true)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var failed []FailedFence
	for _, f := range recs {
		failed = append(failed, FailedFence{LeaseID: f.LeaseID, Token: f.Token, WorkloadIDs: f.WorkloadIDs, At: f.At})
	}
	_, marked, err := cfg.Store.Meta(ctx, localstore.MetaFailed)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if err := cfg.Store.SetMeta(ctx, localstore.MetaHostBootID, cfg.BootID); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	mg.mu.Lock()
	defer mg.mu.Unlock()
	e := mg.m.Restore(leases, failed, marked, true, mg.clock.Now())
	if err := mg.persistLocked(ctx, e.Changed); err != nil {
		return nil, err
	}
	for _, o := range e.Fences {
		mg.startFenceLocked(o)
	}
	for _, l := range mg.m.Leases() {
		mg.log.Info("lease restored", "lease_id", l.LeaseID, "state", string(l.State), "token", l.Token, "fence", string(l.Fence))
	}
	if e.RenewNow {
		mg.signalRenew()
	}
	return mg, nil
}

// Run starts the fences the restore ordered, then expires leases and asks
// for renewals on time until ctx ends; it then waits for running fences
// (which end with ctx) and returns ctx's error.
func (mg *Manager) Run(ctx context.Context) error {
	mg.mu.Lock()
	mg.life = ctx
	for _, run := range mg.waiting {
		mg.goFenceLocked(run)
	}
	mg.waiting = nil
	mg.mu.Unlock()
	defer mg.wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		mg.mu.Lock()
		e, next := mg.m.Tick(mg.clock.Now())
		err := mg.applyLocked(ctx, e)
		now := mg.clock.Now()
		mg.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			mg.log.Error("persist leases", "error", err)
		}
		if len(e.Changed) > 0 {
			mg.changed()
		}
		wait := time.Hour
		if next != 0 {
			wait = max(next-now, time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-mg.wake:
		case <-timer.C:
		}
	}
}

func (mg *Manager) poke() {
	select {
	case mg.wake <- struct{}{}:
	default:
	}
}

func (mg *Manager) signalRenew() {
	select {
	case mg.renew <- struct{}{}:
	default:
	}
}

func (mg *Manager) changed() {
	if mg.cfg.OnChange != nil {
		mg.cfg.OnChange()
	}
}

// applyLocked carries out e's persistence, fences and renewal request. mu must be held.
func (mg *Manager) applyLocked(ctx context.Context, e Effects) error {
	err := mg.persistLocked(ctx, e.Changed)
	for _, o := range e.Fences {
		mg.startFenceLocked(o)
	}
	if e.RenewNow {
		mg.signalRenew()
	}
	return err
}

// persistLocked writes the rows of ids. mu must be held.
func (mg *Manager) persistLocked(ctx context.Context, ids []string) error {
	var errs []error
	for _, id := range ids {
		l, ok := mg.m.Lease(id)
		if !ok {
			continue
		}
		row := localstore.LeaseRow{LeaseID: l.LeaseID, ResourceType: l.ResourceType, ResourceID: l.ResourceID,
			Mode: string(l.Mode), Token: l.Token, State: string(l.State), DurationMS: l.Duration.Milliseconds(),
			BootID: mg.boot, Fence: string(l.Fence), FenceReason: l.FenceReason}
		if l.HasValidity {
			v := int64(l.ValidUntil)
			row.ValidUntilNS = &v
		}
		if err := mg.cfg.Store.PutLease(context.WithoutCancel(ctx), row); err != nil {
			errs = append(errs, fmt.Errorf("lease: %w", err))
		}
	}
	return errors.Join(errs...)
}

// RenewDue is signalled when renewals may be due; the session then sends
// [Manager.DueRenewals]. It is also signalled while no session is up: the
// signal waits for the next reader.
func (mg *Manager) RenewDue() <-chan struct{} { return mg.renew }

// DueRenewals returns the lease_renew bodies due now.
func (mg *Manager) DueRenewals() []node.LeaseRenew {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.m.DueRenewals(mg.clock.Now())
}

// RenewSent records that the lease_renew r with envelope id msgID is about to
// be written; call it before the write. Its send time is taken now.
func (mg *Manager) RenewSent(msgID string, r node.LeaseRenew) {
	mg.mu.Lock()
	mg.m.RenewSent(msgID, r, mg.clock.Now())
	mg.mu.Unlock()
	mg.poke()
}

// Hello returns the leases to list in hello.
func (mg *Manager) Hello() []node.HelloLease {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.m.Hello()
}

// Grant applies a verified lease_grant whose envelope's re is re. It returns
// the refusal to answer as error bad_message (non-fatal), or nil. A grant
// that needs a renewal signals [Manager.RenewDue].
func (mg *Manager) Grant(ctx context.Context, re string, g *node.LeaseGrant) *node.ErrorBody {
	mg.mu.Lock()
	e := mg.m.Grant(*g, re, mg.clock.Now())
	err := mg.applyLocked(ctx, e)
	l, _ := mg.m.Lease(g.LeaseID)
	mg.mu.Unlock()
	mg.poke()
	if err != nil {
		mg.log.Error("persist leases", "error", err)
	}
	if e.Refused != "" {
		mg.log.Warn("refused lease_grant", "lease_id", g.LeaseID, "token", g.FencingToken, "reason", e.Refused)
		return &node.ErrorBody{Code: string(berrors.BadMessage), Message: e.Refused}
	}
	if len(e.Changed) > 0 {
		mg.log.Info("lease granted", "lease_id", l.LeaseID, "mode", string(l.Mode), "token", l.Token, "state", string(l.State))
		mg.changed()
	}
	return nil
}

// Revoke applies a verified lease_revoke and, unless refused, waits for the
// fence of the lease to end (docs/node-protocol.md section 5.13). It returns
// either the refusal to answer as error bad_message, or the command_result:
// ok once every bound workload is confirmed stopped, or error fence_failed
// naming the workloads that may still run. A lease the node does not know
// is answered ok: nothing is bound to it.
func (mg *Manager) Revoke(ctx context.Context, r *node.LeaseRevoke) (node.CommandResult, *node.ErrorBody) {
	mg.mu.Lock()
	e, known, already := mg.m.Revoke(*r, mg.clock.Now())
	err := mg.applyLocked(ctx, e)
	run := mg.fences[r.LeaseID]
	mg.mu.Unlock()
	mg.poke()
	if err != nil {
		mg.log.Error("persist leases", "error", err)
	}
	if len(e.Changed) > 0 {
		mg.changed()
	}
	if e.Refused != "" {
		mg.log.Warn("refused lease_revoke", "lease_id", r.LeaseID, "token", r.FencingToken, "reason", e.Refused)
		return node.CommandResult{}, &node.ErrorBody{Code: string(berrors.BadMessage), Message: e.Refused}
	}
	if !known {
		return node.CommandResult{Status: "ok", Detail: "lease " + r.LeaseID + " is unknown to this node; nothing is bound to it"}, nil
	}
	if already || run == nil {
		return node.CommandResult{Status: "ok", Detail: fmt.Sprintf("lease %s already fenced under token %d", r.LeaseID, r.FencingToken)}, nil
	}
	select {
	case <-run.done:
	case <-ctx.Done():
		return node.CommandResult{}, &node.ErrorBody{Code: string(berrors.Unavailable), Message: "the session ended during the fence"}
	}
	if run.interrupted {
		return node.CommandResult{}, &node.ErrorBody{Code: string(berrors.Unavailable), Message: "the agent stopped during the fence"}
	}
	return fenceResult(run), nil
}

func fenceResult(run *fenceRun) node.CommandResult {
	if run.ok {
		return node.CommandResult{Status: "ok", Detail: fmt.Sprintf("fenced %s (token %d): stopped %s",
			run.order.LeaseID, run.order.Token, listOrNone(run.bound))}
	}
	return node.CommandResult{Status: "error",
		Detail: strings.Join(run.running, ", ") + " neither stopped nor gone after the forced stop",
		Error: &node.ErrorBody{Code: string(berrors.FenceFailed),
			Message: "self-fence of " + run.order.LeaseID + " could not confirm every bound workload stopped"}}
}

func listOrNone(ids []string) string {
	if len(ids) == 0 {
		return "no workload"
	}
	return strings.Join(ids, ", ")
}

// Ack applies command fence_ack (docs/node-protocol.md section 5.17) and
// returns its command_result: ok, with detail naming the failed fences that
// remain, if any.
func (mg *Manager) Ack(ctx context.Context, leaseIDs []string) node.CommandResult {
	if len(leaseIDs) == 0 {
		return node.CommandResult{Status: "error", Detail: "fence_ack lists no lease",
			Error: &node.ErrorBody{Code: string(berrors.BadMessage), Message: "fence_ack needs lease_ids"}}
	}
	mg.mu.Lock()
	remaining, err := mg.cfg.Store.AckFences(ctx, leaseIDs, mg.cfg.Now())
	if err != nil {
		mg.mu.Unlock()
		return node.CommandResult{Status: "error", Detail: "the node could not record the acknowledgement",
			Error: &node.ErrorBody{Code: string(berrors.Internal), Message: err.Error()}}
	}
	cleared, _ := mg.m.Ack(leaseIDs)
	failed := mg.m.Failed()
	mg.mu.Unlock()
	mg.log.Info("failed fences acknowledged", "cleared", cleared, "remaining", remaining)
	mg.changed()
	if len(remaining) > 0 || failed {
		return node.CommandResult{Status: "ok", Detail: "node stays failed; failed fences remain for " + strings.Join(remaining, ", ")}
	}
	return node.CommandResult{Status: "ok", Detail: "no failed fence remains; the node is no longer failed"}
}

// Failed reports whether the node is failed after a failed fence.
func (mg *Manager) Failed() bool {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.m.Failed()
}

// Statuses returns every lease's state for the reconcile decision, and
// whether the node is failed.
func (mg *Manager) Statuses() (map[string]Status, bool) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	now := mg.clock.Now()
	out := map[string]Status{}
	for _, l := range mg.m.Leases() {
		ok, _ := mg.m.CanStart(l.LeaseID, l.Token, now)
		out[l.LeaseID] = Status{State: l.State, Token: l.Token, Startable: ok}
	}
	return out, mg.m.Failed()
}

// Lease returns a copy of the lease id and whether the node has one.
func (mg *Manager) Lease(id string) (Lease, bool) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	return mg.m.Lease(id)
}

// Admit is taken by the reconcile loop around the driver's Start of a
// stateful workload bound to leaseID with token (docs/node-protocol.md
// section 6.4). When the start may go ahead it returns ok and a release
// function to call once Start returned; a fence of that lease waits for the
// release before it stops anything, and no start is admitted once a fence
// was ordered. Otherwise reason says why not.
func (mg *Manager) Admit(leaseID string, token int64) (release func(), ok bool, reason string) {
	mg.mu.Lock()
	gate := mg.gateLocked(leaseID)
	mg.mu.Unlock()
	gate.RLock()
	mg.mu.Lock()
	ok, reason = mg.m.CanStart(leaseID, token, mg.clock.Now())
	mg.mu.Unlock()
	if !ok {
		gate.RUnlock()
		return nil, false, reason
	}
	return gate.RUnlock, true, ""
}

func (mg *Manager) gateLocked(leaseID string) *sync.RWMutex {
	g := mg.gates[leaseID]
	if g == nil {
		g = &sync.RWMutex{}
		mg.gates[leaseID] = g
	}
	return g
}

// startFenceLocked orders the fence o: it becomes the lease's newest fence
// (a waiter sees it at once) and runs on its own goroutine after any fence
// of the same lease still running; before Run it waits for Run. mu must be
// held.
func (mg *Manager) startFenceLocked(o FenceOrder) {
	run := &fenceRun{order: o, done: make(chan struct{}), prev: mg.fences[o.LeaseID]}
	mg.fences[o.LeaseID] = run
	if mg.life == nil {
		mg.waiting = append(mg.waiting, run)
		return
	}
	mg.goFenceLocked(run)
}

// goFenceLocked starts run's goroutine. mu must be held and Run started.
func (mg *Manager) goFenceLocked(run *fenceRun) {
	ctx := mg.life
	mg.wg.Add(1)
	go func() {
		defer mg.wg.Done()
		defer close(run.done)
		if run.prev != nil {
			<-run.prev.done
			run.prev = nil // only this goroutine reads it; drop the chain of older fences
		}
		mg.fence(ctx, run)
	}()
}

// fence is the self-fence procedure of docs/node-protocol.md section 8.5 for
// one lease: take the lease's gate (no stateful start is in flight), stop
// every bound workload (graceful, then forced) within T_grace + T_force,
// record the outcome, emit node.fenced or node.fence_failed.
func (mg *Manager) fence(ctx context.Context, run *fenceRun) {
	o := run.order
	mg.mu.Lock()
	gate := mg.gateLocked(o.LeaseID)
	l, _ := mg.m.Lease(o.LeaseID)
	mg.mu.Unlock()
	gate.Lock()
	defer gate.Unlock()

	grace, force := mg.cfg.LocalGrace, mg.cfg.LocalForce
	if l.Mode == node.LeaseExpiring && l.Duration > 0 {
		m := node.LeaseMargin(l.Duration)
		grace, force = m/2, m-m/2
	}
	bound, err := mg.boundWorkloads(ctx, o.LeaseID)
	if err != nil {
		if ctx.Err() != nil {
			run.interrupted = true // the lease stays fencing and is fenced again on restart
			return
		}
		mg.log.Error("list the workloads bound to a lease; fencing what the driver runs", "lease_id", o.LeaseID, "error", err)
	}
	mg.log.Info("self-fence", "lease_id", o.LeaseID, "token", o.Token, "reason", o.Reason, "workloads", bound)
	stopped := make([]bool, len(bound))
	var wg sync.WaitGroup
	for i, id := range bound {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stopped[i] = mg.stopOne(ctx, id, grace, force)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		run.interrupted = true // the lease stays fencing and is fenced again on restart
		return
	}
	var running []string
	for i, id := range bound {
		if !stopped[i] {
			running = append(running, id)
		}
	}
	run.bound, run.running, run.ok = bound, running, len(running) == 0
	now := mg.cfg.Now().UTC()
	for i, id := range bound {
		if stopped[i] {
			mg.markStopped(ctx, id, fmt.Sprintf("fenced: lease %s %s (token %d)", o.LeaseID, o.Reason, o.Token))
		}
	}
	rec := localstore.FenceRecord{LeaseID: o.LeaseID, Token: o.Token, Reason: o.Reason, WorkloadIDs: bound,
		Outcome: localstore.FenceOutcomeFenced, At: now}
	if !run.ok {
		rec.Outcome, rec.WorkloadIDs = localstore.FenceOutcomeFailed, running
	}
	if err := mg.cfg.Store.RecordFence(ctx, rec); err != nil {
		mg.log.Error("record fence", "lease_id", o.LeaseID, "error", err)
	}
	mg.mu.Lock()
	e := mg.m.FenceDone(o, run.ok, running, now)
	if err := mg.persistLocked(ctx, e.Changed); err != nil {
		mg.log.Error("persist leases", "error", err)
	}
	mg.mu.Unlock()

	typ := node.EventNodeFenced
	data := node.FenceEventData{LeaseID: o.LeaseID, ResourceID: o.ResourceID, FencingToken: o.Token, Reason: o.Reason, WorkloadIDs: bound}
	if run.ok {
		mg.log.Info("lease fenced", "lease_id", o.LeaseID, "token", o.Token, "reason", o.Reason, "workloads", bound)
	} else {
		typ = node.EventNodeFenceFailed
		data.WorkloadIDs = running
		mg.log.Error("self-fence failed: workloads may still run; the node is failed until an operator acknowledges",
			"lease_id", o.LeaseID, "token", o.Token, "workloads", running)
	}
	if data.WorkloadIDs == nil {
		data.WorkloadIDs = []string{}
	}
	mg.emit(ctx, typ, o.LeaseID, data)
	mg.changed()
}

// boundWorkloads returns the workloads bound to leaseID: stateful
// workloads of the newest snapshot naming it, and workload records started
// under it.
func (mg *Manager) boundWorkloads(ctx context.Context, leaseID string) ([]string, error) {
	set := map[string]bool{}
	var errs []error
	if _, raw, err := mg.cfg.Store.LatestSnapshot(ctx); err != nil {
		errs = append(errs, err)
	} else if raw != nil {
		var d node.DesiredState
		if err := json.Unmarshal(raw, &d); err != nil {
			errs = append(errs, fmt.Errorf("parse stored snapshot: %w", err))
		}
		for _, w := range d.Spec.Workloads {
			if w.Stateful && w.LeaseID == leaseID {
				set[w.WorkloadID] = true
			}
		}
	}
	if recs, err := mg.cfg.Store.Workloads(ctx); err != nil {
		errs = append(errs, err)
	} else {
		for _, r := range recs {
			if r.LeaseID == leaseID {
				set[r.WorkloadID] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, errors.Join(errs...)
}

// stopOne stops one workload gracefully within grace, then forced within
// force, and reports whether it is confirmed stopped or gone. Its calls
// carry the mutation fields of [StopMutation].
func (mg *Manager) stopOne(ctx context.Context, id string, grace, force time.Duration) bool {
	var rec *localstore.Workload
	rev, _, err := mg.cfg.Store.LatestSnapshot(ctx)
	if err != nil {
		mg.log.Warn("read the desired-state revision for a fence stop", "workload_id", id, "error", err)
	}
	if recs, err := mg.cfg.Store.Workloads(ctx); err == nil {
		for i := range recs {
			if recs[i].WorkloadID == id {
				rec = &recs[i]
			}
		}
	}
	gctx, cancel := context.WithTimeout(ctx, grace)
	_, err = mg.cfg.Driver.Stop(gctx, &runtime.StopRequest{WorkloadID: id, Mode: runtime.StopGraceful, Timeout: grace,
		Mutation: StopMutation("fence-stop", id, rec, rev)})
	cancel()
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		return true
	}
	mg.log.Warn("graceful stop did not end the workload in time; forcing", "workload_id", id, "error", err)
	fctx, cancel := context.WithTimeout(ctx, force)
	_, err = mg.cfg.Driver.Stop(fctx, &runtime.StopRequest{WorkloadID: id, Mode: runtime.StopForced,
		Mutation: StopMutation("fence-kill", id, rec, rev)})
	cancel()
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		return true
	}
	mg.log.Error("forced stop failed", "workload_id", id, "error", err)
	ictx, cancel := context.WithTimeout(ctx, inspectBudget)
	defer cancel()
	st, err := mg.cfg.Driver.Inspect(ictx, &runtime.InspectRequest{WorkloadID: id})
	if errors.Is(err, runtime.ErrNotFound) || (err == nil && st != nil && st.State == runtime.StateExited) {
		return true
	}
	return false
}

// markStopped records a fenced workload as stopped so that the reconcile
// loop neither counts a crash nor restarts it.
func (mg *Manager) markStopped(ctx context.Context, id, msg string) {
	recs, err := mg.cfg.Store.Workloads(ctx)
	if err != nil {
		mg.log.Warn("record fenced workload", "workload_id", id, "error", err)
		return
	}
	for _, r := range recs {
		if r.WorkloadID != id {
			continue
		}
		r.Phase = "stopped"
		r.Message = msg
		if err := mg.cfg.Store.PutWorkload(ctx, r); err != nil {
			mg.log.Warn("record fenced workload", "workload_id", id, "error", err)
		}
		return
	}
}

func (mg *Manager) emit(ctx context.Context, typ, leaseID string, data node.FenceEventData) {
	if mg.cfg.Emit == nil {
		return
	}
	raw, _ := json.Marshal(data) // plain struct: cannot fail
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	ev := node.Event{SchemaVersion: 1, ID: "evt_" + ulid.Make().String(), Type: typ, Time: mg.cfg.Now().UTC(),
		Source:  node.EventSource{Kind: "node", NodeID: mg.cfg.NodeID},
		Subject: node.EventRef{Type: "lease", ID: leaseID},
		Actor:   node.EventRef{Type: "node", ID: mg.cfg.NodeID}, Data: m}
	if err := mg.cfg.Emit(context.WithoutCancel(ctx), ev); err != nil {
		mg.log.Error("buffer event", "type", typ, "lease_id", leaseID, "error", err)
	}
}

// StopMutation returns the mutation fields of a stop of workload id (verb
// "stop" from the reconcile loop, "fence-stop" and "fence-kill" from a
// self-fence, "detach" for its network), whose record is rec (nil when the
// agent has none); rev is the newest stored desired-state revision, the
// token without a record (docs/plugins.md section 3.4):
//
//   - with a record, the key is [pluginapi.CallKey](verb, id, rec.StartRev,
//     rec.StartAttempt) and the token rec.StartRev, the revision its attempt
//     began at, so that
//     a stop of one attempt is the same request each time it is retried and
//     never fenced out by the start it ends;
//   - without one, the key is [pluginapi.CallKey](verb+"-unrecorded", id,
//     rev, 0) and the token rev.
//
// Stops are fenced on the workload itself (StopRequest.FenceResource empty),
// whose tokens are only ever desired-state revisions (a stateful start is
// fenced by its lease instead), and revisions only increase: a stop is never
// refused as stale by a start the agent made before it.
func StopMutation(verb, id string, rec *localstore.Workload, rev int64) pluginapi.Mutation {
	if rec == nil {
		return pluginapi.Mutation{IdempotencyKey: pluginapi.CallKey(verb+"-unrecorded", id, rev, 0), FencingToken: uint64(max(rev, 0))}
	}
	return pluginapi.Mutation{IdempotencyKey: pluginapi.CallKey(verb, id, rec.StartRev, rec.StartAttempt), FencingToken: uint64(max(rec.StartRev, 0))}
}
