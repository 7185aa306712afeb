package rollout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo/options"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
)

func findOptions() *options.FindOptionsBuilder { return options.Find() }

func replaceUpsert() *options.ReplaceOptionsBuilder { return options.Replace().SetUpsert(true) }

// Platform is the platform every node counts as: nodes do not report theirs yet, and every
// runtime driver Berth ships runs Linux workloads of the node's own architecture.
const Platform = "linux"

// Admitter asks the deploy policy whether a new attempt of svc may run on node n; a refusal
// (or an error, which refuses too) leaves the run for a later sweep.
type Admitter interface {
	AdmitDeploy(ctx context.Context, s *services.Service, slot int, n *nodes.Node) (allowed bool, reasons []string, err error)
}

// Config wires a [Producer]. Store, Catalog and Nodes are required.
type Config struct {
	Store   *Store
	Catalog *services.Catalog
	Nodes   *nodes.Registry
	Admit   Admitter // nil admits every run
	Logger  *slog.Logger
	// Now is the core's clock (nil: time.Now); observations and backoffs are measured on it.
	Now func() time.Time
	// OnRetired, when not nil, is called after a retired node was marked removed, to end its
	// session.
	OnRetired func(ctx context.Context, nodeID string)
	// Metrics, when not nil, receives the producer's counts ([NewMetrics]).
	Metrics *Metrics
	// Events, when not nil, receives a rollout.failed event for each rollout failed by its
	// progress deadline (docs/reconciliation.md section 7.2) and a rollout.denied event for each
	// change of a deploy-hook refusal (section 7.3).
	Events *events.Log
	// Leases, when not nil, is the lease authority of stateful services (docs/reconciliation.md
	// section 5.1): a stateful service's one slot is desired on the node holding its lease
	// (granted by the caller, core/reconciler), and a slot left on a node the lease moved away
	// from is settled by that fence. Nil produces stateful services like portable ones.
	Leases *fencing.Authority
	// RollBack, when not nil, makes the automatic rollback of a failed rollout of svc (the
	// service as the sweep read it), written only while the service is still at svc's revision
	// and admitted like any change (core/deploy Deployer.RollBack). Nil rolls nothing back: the
	// failed rollout is reported and left for an operator.
	RollBack func(ctx context.Context, svc *services.Service) (*services.Service, error)
}

// TypeRolloutFailed is the event of a rollout that went past its progress deadline.
const TypeRolloutFailed = "rollout.failed"

// TypeUnplaceable is the event of a service whose verdict turned waiting(unplaceable: ...), once
// per change of the reason (docs/placement.md section 5).
const TypeUnplaceable = "placement.unplaceable"

// TypeRolloutDenied is the event of a service whose verdict turned refused(policy-denied...),
// once per change of the policy's reasons (docs/reconciliation.md section 7.3).
const TypeRolloutDenied = "rollout.denied"

// Producer turns runtime specs into slots and workloads: one [Producer.Sweep] visits every
// service, joins receipts, decides every slot with core/slots and commits each step with one
// compare-and-set on the service's slot set (docs/reconciliation.md sections 5 and 6).
type Producer struct {
	cfg Config
	log *slog.Logger
	// beforeCommit, when not nil, runs before each commit's fresh read (tests race it).
	beforeCommit func()
}

// Store returns the store of specs, slots and verdicts the Producer works on.
func (p *Producer) Store() *Store { return p.cfg.Store }

// NewProducer returns a Producer.
func NewProducer(cfg Config) *Producer {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Producer{cfg: cfg, log: cfg.Logger.With("component", "rollout")}
}

// Outcome is what one sweep did.
type Outcome struct {
	// Services counts the services visited; Commits the slot steps committed; Conflicts the
	// commits aborted because the slot moved under the sweep.
	Services, Commits, Conflicts int
	// Changed reports whether any slot, workload or verdict was written.
	Changed bool
	// WakeAt is the earliest pending backoff end (zero for none): sweep again then.
	WakeAt time.Time
}

// Sweep visits, in id order and [slots.PageSize] at a time, every service of svcs (the caller
// leaves out stateful services, which run under their lease) and every service that still holds
// a slot set, decides its slots and commits the steps. ns are every node, use what stands on
// each ([placement.UsageOf] over every workload; nil: nothing) and is updated as runs are placed. A failure of one service is logged and the
// sweep goes on; the error returned joins them.
func (p *Producer) Sweep(ctx context.Context, svcs []services.Service, ns []nodes.Node, use *placement.Usage) (out Outcome, err error) {
	if use == nil {
		use = &placement.Usage{}
	}
	began := time.Now() // the duration is measured on the wall clock, not the core's decision clock
	tally := p.cfg.Metrics.begin()
	byID := map[string]*services.Service{}
	for i := range svcs {
		byID[svcs[i].ID] = &svcs[i]
	}
	withSets, err := p.cfg.Store.ServicesWithSlots(ctx)
	if err != nil {
		return out, err
	}
	ids := make([]string, 0, len(byID)+len(withSets))
	for id := range byID {
		ids = append(ids, id)
	}
	for _, id := range withSets {
		if _, ok := byID[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out, err = p.visit(ctx, ids, byID, ns, use, tally)
	if rerr := p.retirements(ctx, ns); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err == nil { // a partial tally would undercount
		p.cfg.Metrics.end(tally, time.Since(began))
	}
	return out, err
}

// SweepServices is [Producer.Sweep] limited to the services ids (the work an event woke:
// docs/reconciliation.md section 6): it visits, once each and in id order, the ids that svcs
// holds (a deleting service is still in svcs, so its slots settle); an id svcs lacks, and node
// retirements, are left to the full sweep. svcs, ns and use are as for Sweep.
func (p *Producer) SweepServices(ctx context.Context, ids []string, svcs []services.Service, ns []nodes.Node, use *placement.Usage) (Outcome, error) {
	if use == nil {
		use = &placement.Usage{}
	}
	byID := map[string]*services.Service{}
	for i := range svcs {
		byID[svcs[i].ID] = &svcs[i]
	}
	var visit []string
	for _, id := range ids {
		if byID[id] != nil {
			visit = append(visit, id)
		}
	}
	slices.Sort(visit)
	return p.visit(ctx, slices.Compact(visit), byID, ns, use, nil) // a partial tally publishes nothing
}

// visit decides and commits each service of the sorted ids, page by page, counting verdicts and
// workloads into tally (nil counts nothing).
func (p *Producer) visit(ctx context.Context, ids []string, byID map[string]*services.Service, ns []nodes.Node, use *placement.Usage, tally *sweepTally) (Outcome, error) {
	var out Outcome
	nodeByID := make(map[string]*nodes.Node, len(ns))
	for i := range ns {
		nodeByID[ns[i].ID] = &ns[i]
	}
	var errs []error
	for cursor := ""; ; {
		page, next := slots.NextPage(ids, cursor, slots.PageSize)
		for _, id := range page {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			out.Services++
			r, err := p.service(ctx, id, byID[id], ns, nodeByID, use, tally)
			out.Commits += r.commits
			out.Conflicts += r.conflicts
			out.Changed = out.Changed || r.changed
			if !r.wakeAt.IsZero() && (out.WakeAt.IsZero() || r.wakeAt.Before(out.WakeAt)) {
				out.WakeAt = r.wakeAt
			}
			if err != nil {
				p.log.Error("service production failed", "service_id", id, "err", err)
				errs = append(errs, err)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	return out, errors.Join(errs...)
}

type serviceResult struct {
	commits, conflicts int
	changed            bool
	wakeAt             time.Time
}

// view is one consistent read of a service for planning.
type view struct {
	svc       *services.Service // nil: the service document is gone (only its slots remain)
	spec      *SpecDoc
	set       *SlotSet
	workloads map[string]*services.Workload // by workload id
	// leased reports whether the service runs under a lease ([Config.Leases], a stateful
	// service); holder is then the node holding it, "" while nobody may run it (never granted,
	// blocked by a failed fence, deleted).
	leased bool
	holder string
}

// read reads the service's state; svc, when not nil, is the copy the caller holds (a commit
// passes nil to read it again).
func (p *Producer) read(ctx context.Context, id string, svc *services.Service, fresh bool) (*view, error) {
	v := &view{svc: svc, workloads: map[string]*services.Workload{}}
	if fresh {
		s, err := p.cfg.Catalog.GetServiceByID(ctx, id)
		if err != nil && !errors.Is(err, services.ErrServiceNotFound) {
			return nil, err
		}
		v.svc = s
	}
	var err error
	if v.svc != nil && !v.svc.Deleting && !fresh {
		v.spec, err = p.cfg.Store.EnsureDerivedSpec(ctx, v.svc)
	} else {
		v.spec, err = p.cfg.Store.Spec(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	if v.set, err = p.cfg.Store.Slots(ctx, id); err != nil {
		return nil, err
	}
	for _, row := range v.set.Slots {
		w, err := p.cfg.Catalog.GetWorkload(ctx, row.WorkloadID)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		v.workloads[w.ID] = w
	}
	return v, nil
}

// service produces one service: receipts, desire, plan, commits, repairs, verdict.
func (p *Producer) service(ctx context.Context, id string, svc *services.Service, all []nodes.Node, ns map[string]*nodes.Node, use *placement.Usage, tally *sweepTally) (serviceResult, error) {
	var res serviceResult
	v, err := p.read(ctx, id, svc, svc == nil)
	if err != nil {
		return res, err
	}
	if v.svc == nil {
		// The service document went without a deletion (removed by hand or by an older
		// version): its workloads go from the nodes' desired states and its rows are forgotten.
		for _, row := range v.set.Slots {
			if err := p.cfg.Catalog.RemoveWorkload(ctx, row.WorkloadID); err != nil {
				return res, err
			}
		}
		p.log.Warn("slots of a vanished service released", "service_id", id, "slots", len(v.set.Slots))
		res.changed = true
		return res, p.cfg.Store.forget(ctx, id)
	}
	if err := p.readLease(ctx, v); err != nil {
		return res, err
	}
	if moved, err := p.joinReceipts(ctx, v, ns); err != nil {
		if errors.Is(err, slots.ErrConflict) {
			res.conflicts++
			return res, nil
		}
		return res, err
	} else if moved {
		res.changed = true
	}
	placed, unplaceable := place(v, all, ns, use)
	in := p.input(v, ns, placed)
	if unplaceable != "" && in.Refused == "" {
		in.Unplaceable = slots.UnplaceableReason(unplaceable)
	}
	plan := slots.PlanService(in)
	verdict := plan.Verdict
	var held slots.Reason // the deploy hook's hold of the first slot in replica order it held
	for _, sp := range plan.Slots {
		if !sp.Commits() {
			continue
		}
		err := p.commit(ctx, id, sp, ns, placed)
		switch {
		case errors.Is(err, slots.ErrConflict):
			res.conflicts++
			verdict = slots.ConflictVerdict(verdict)
			p.log.Info("slot commit aborted: conflict", "service", serviceName(v.svc), "service_id", id, "replica", sp.Replica, "case", sp.Decision.Case, "err", err)
		case errors.Is(err, errNotAdmitted):
			var na *notAdmitted
			if errors.As(err, &na) && held == "" {
				held = na.reason
			}
		case err != nil:
			return res, err
		default:
			res.commits++
			res.changed = true
			p.cfg.Metrics.step(sp.Decision.Case, sp.Replica)
			if sp.Decision.Step == slots.StepRun {
				use.Add(sp.NodeID, placement.ServiceKey(v.svc.Project, v.svc.Name), placement.ReplicaResources(v.svc))
			}
		}
	}
	verdict = slots.AdmissionVerdict(verdict, held)
	if res.commits > 0 || res.conflicts > 0 {
		if v, err = p.read(ctx, id, nil, true); err != nil {
			return res, err
		}
	}
	repaired, err := p.repair(ctx, v)
	if err != nil {
		return res, err
	}
	var settled []string
	for _, sp := range plan.Slots {
		if sp.Decision.Case == slots.CaseSettled {
			settled = append(settled, sp.Replica)
		}
	}
	pruned, err := p.pruneSettled(ctx, v, settled)
	if err != nil {
		return res, err
	}
	res.changed = res.changed || repaired || pruned
	res.wakeAt = plan.WakeAt
	for _, w := range v.workloads {
		tally.workload(w)
	}
	if v.svc == nil {
		return res, nil // deleted under the sweep; the next one forgets its rows
	}
	if v.svc.Deleting {
		done, err := p.finalize(ctx, v)
		if err != nil || done {
			return res, err
		}
	}
	if v.spec == nil && len(v.set.Slots) == 0 {
		return res, nil
	}
	prev, err := p.cfg.Store.Verdict(ctx, id)
	if err != nil {
		return res, err
	}
	var progress *slots.Progress
	if !v.svc.Deleting && v.spec != nil {
		var pp *slots.Progress
		if prev != nil {
			pp = prev.Progress
		}
		// The deadline runs from the rollout's start: the later write of its two revisions.
		start := v.svc.UpdatedAt
		if v.spec.UpdatedAt.After(start) {
			start = v.spec.UpdatedAt
		}
		next, vd, failed := slots.NextProgress(slots.ProgressInput{Prev: pp, ServiceRevision: v.svc.Revision, SpecRevision: v.spec.Revision,
			Ready: readyCount(plan), Verdict: verdict, Deadline: time.Duration(v.svc.ProgressDeadlineS) * time.Second, Now: p.cfg.Now(), Start: start})
		if failed {
			rolled, err := p.rolloutFailed(ctx, v.svc, verdict)
			if err != nil {
				return res, err
			}
			p.cfg.Metrics.failed(rolled)
			if rolled {
				// The rollback wrote a new revision: the next sweep decides over it, with a new clock.
				res.changed = true
				return res, nil
			}
		}
		progress, verdict = &next, vd
	}
	if err := p.refusedByPolicy(ctx, v.svc, prev, verdict); err != nil {
		return res, err
	}
	if err := p.unplaceable(ctx, v.svc, prev, verdict); err != nil {
		return res, err
	}
	wrote, err := p.cfg.Store.writeVerdict(ctx, id, prev, verdict, v.svc.Revision, progress)
	if err != nil {
		return res, err
	}
	tally.verdict(verdict)
	if wrote {
		p.cfg.Metrics.changed(verdict)
		res.changed = true
		p.log.Info("service verdict", "service", serviceName(v.svc), "service_id", id, "verdict", verdict.String(), "spec_revision", verdict.SpecRevision)
	}
	return res, nil
}

// serviceName is "project/name" of svc for the log, "" when the document is gone.
func serviceName(svc *services.Service) string {
	if svc == nil {
		return ""
	}
	return svc.Project + "/" + svc.Name
}

// readyCount counts the desired slots of plan that run their desired attempt, observed ready.
func readyCount(plan slots.Plan) int {
	n := 0
	for _, sp := range plan.Slots {
		s := sp.Input.Slot
		if sp.Input.Desired && !sp.Held && s.Exists && s.Generation == slots.GenRun && s.Attempt.Key == sp.Input.DesiredKey &&
			s.Observed.Phase == slots.PhaseRunning && s.Observed.Ready {
			n++
		}
	}
	return n
}

// refusedByPolicy appends the event rollout.denied (subject the service; data: service,
// revision, spec revision, verdict) when next is a policy-denied verdict that differs from the
// stored one prev (nil: none), before next is written. Its id derives from the service, the new
// verdict and when the stored one last changed, so a pass that dies before its verdict write
// and decides again stores it once, and a new change of reason stores a new one
// (docs/reconciliation.md section 7.3). No Events log, or no change, appends nothing.
func (p *Producer) refusedByPolicy(ctx context.Context, svc *services.Service, prev *StatusDoc, next slots.Verdict) error {
	if p.cfg.Events == nil || next.State != slots.Refused || !slots.IsPolicyDenied(next.Reason) {
		return nil
	}
	_, err := p.verdictEvent(ctx, svc, prev, next, TypeRolloutDenied, "record the deploy policy's refusal of "+serviceName(svc))
	return err
}

// verdictEvent appends the event typ about svc's verdict next (subject the service; data:
// service, revision, spec revision, verdict) unless next equals the stored verdict prev (nil:
// none). Its id derives from the service, the verdict, typ and when the stored verdict last
// changed, so a pass that dies before its verdict write and decides again stores it once. It
// reports whether it appended; an error of the append is wrapped with doing.
func (p *Producer) verdictEvent(ctx context.Context, svc *services.Service, prev *StatusDoc, next slots.Verdict, typ, doing string) (bool, error) {
	since := "none"
	if prev != nil {
		if !slots.VerdictChanged(&prev.Verdict, next) {
			return false, nil
		}
		since = prev.ChangedAt.UTC().Format(time.RFC3339Nano)
	}
	sum := sha256.Sum256([]byte(svc.ID + "/" + next.String() + "/" + since + "/" + typ))
	ev := events.Core(typ, "", map[string]any{"service": serviceName(svc), "revision": svc.Revision,
		"spec_revision": next.SpecRevision, "verdict": next.String()}, p.cfg.Now())
	ev.ID = "evt_" + hex.EncodeToString(sum[:13])
	ev.Subject = node.EventRef{Type: "service", ID: svc.ID}
	ev.ProjectID = svc.ProjectID
	if _, _, err := p.cfg.Events.Append(ctx, ev); err != nil {
		return false, fmt.Errorf("%s: %w", doing, err)
	}
	return true, nil
}

// unplaceable appends the event placement.unplaceable (subject the service; data: service,
// revision, spec revision, verdict) when next is a waiting(unplaceable: ...) verdict that differs
// from the stored one prev (nil: none), before next is written; its id derives from the service,
// the verdict and when the stored one last changed, so a repeated pass stores it once. No Events
// log, or no change, appends nothing (docs/placement.md section 5).
func (p *Producer) unplaceable(ctx context.Context, svc *services.Service, prev *StatusDoc, next slots.Verdict) error {
	if p.cfg.Events == nil || next.State != slots.Waiting || !slots.IsUnplaceable(next.Reason) {
		return nil
	}
	appended, err := p.verdictEvent(ctx, svc, prev, next, TypeUnplaceable, "record that "+serviceName(svc)+" is unplaceable")
	if err != nil || !appended {
		return err
	}
	p.log.Warn("replica unplaceable", "service", serviceName(svc), "service_id", svc.ID, "verdict", next.String())
	return nil
}

// rolloutFailed acts on a rollout of svc that just went past its progress deadline while its
// verdict read was: it emits rollout.failed (its id derived from the service and revision, so a
// sweep that dies and decides again emits it once), and with auto_rollback restores the previous
// release with one compare-and-set on the revision read, recorded in the change log as the
// system's. A revision that is itself an automatic rollback, or has nothing to return to, is
// not rolled back. It reports whether it rolled back.
func (p *Producer) rolloutFailed(ctx context.Context, svc *services.Service, was slots.Verdict) (bool, error) {
	name := svc.Project + "/" + svc.Name
	rollback := p.cfg.RollBack != nil && svc.AutoRollback && svc.RollbackOf == 0 && svc.Previous != nil && svc.Previous.Release().Digest() != ""
	p.log.Warn("rollout failed: no progress within its deadline", "service", name, "service_id", svc.ID, "revision", svc.Revision,
		"verdict", was.String(), "auto_rollback", rollback)
	if p.cfg.Events != nil {
		sum := sha256.Sum256([]byte(svc.ID + "/" + strconv.FormatInt(svc.Revision, 10) + "/" + TypeRolloutFailed))
		ev := events.Core(TypeRolloutFailed, "", map[string]any{"service": name, "revision": svc.Revision, "verdict": was.String(),
			"auto_rollback": rollback, "release": svc.Release().Digest()}, p.cfg.Now())
		ev.ID = "evt_" + hex.EncodeToString(sum[:13])
		ev.Subject = node.EventRef{Type: "service", ID: svc.ID}
		ev.ProjectID = svc.ProjectID
		if _, _, err := p.cfg.Events.Append(ctx, ev); err != nil {
			return false, err
		}
	}
	if !rollback {
		return false, nil
	}
	actx := changelog.WithActor(ctx, changelog.Actor{Type: "system", ID: "rollout"})
	back, err := p.cfg.RollBack(actx, svc)
	if errors.Is(err, services.ErrRevisionConflict) || errors.Is(err, services.ErrServiceDeleting) || errors.Is(err, services.ErrNoPreviousRelease) {
		p.log.Info("automatic rollback skipped: the service changed", "service", name, "err", err)
		return false, nil
	}
	if errors.Is(err, abierrors.New(abierrors.PolicyDenied, "")) {
		// The refusal is recorded (event, verdict, metric) by the deployer; the service keeps
		// the failed release until an operator acts.
		p.log.Warn("automatic rollback refused by policy", "service", name, "err", err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("roll back %s: %w", name, err)
	}
	p.log.Warn("rolled back a failed rollout", "service", name, "service_id", svc.ID, "failed_revision", svc.Revision,
		"revision", back.Revision, "release", back.Release().Digest())
	return true, nil
}

// readLease fills v.leased and v.holder for a stateful service under [Config.Leases].
func (p *Producer) readLease(ctx context.Context, v *view) error {
	if p.cfg.Leases == nil || v.svc == nil || !v.svc.Stateful() {
		return nil
	}
	v.leased = true
	l, err := p.cfg.Leases.Get(ctx, fencing.LeaseID(v.svc.ID))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the lease of %s: %w", serviceName(v.svc), err)
	}
	if !l.Blocked() && !l.Deleted {
		v.holder = l.Holder
	}
	return nil
}

// fenced reports whether row of a leased service stands on a node its lease was taken from: the
// lease is held by another node, which the authority grants only once the old holder is fenced
// (its gate opened, or it was declared lost), so the old attempt can no longer run.
func fenced(v *view, row SlotRow) bool {
	return v.leased && v.holder != "" && v.holder != row.NodeID
}

// joinReceipts records receipts the nodes returned since the last sweep, releases the slots
// of nodes that are removed or retired as lost (docs/reconciliation.md section 10), and settles
// the slot of a stateful service whose lease moved to another node (section 5.1: the fence
// stands for the stop and remove receipts the old holder cannot send), with one
// compare-and-set on the slot set. It reports whether it wrote.
func (p *Producer) joinReceipts(ctx context.Context, v *view, ns map[string]*nodes.Node) (bool, error) {
	rows := make([]SlotRow, 0, len(v.set.Slots))
	moved := false
	for _, row := range v.set.Slots {
		n := ns[row.NodeID]
		if n == nil || n.Status == nodes.StatusRemoved || n.Retirement != nil && n.Retirement.Disposition == nodes.DispositionLost {
			p.log.Warn("slot released: its node is gone", "service", serviceName(v.svc), "service_id", v.set.ServiceID, "replica", row.Replica, "node_id", row.NodeID, "workload_id", row.WorkloadID)
			if err := p.cfg.Catalog.RemoveWorkload(ctx, row.WorkloadID); err != nil {
				return false, err
			}
			moved = true
			continue
		}
		if fenced(v, row) && (row.Generation != int(slots.GenRemove) || row.Acked != int(slots.GenRemove)) {
			p.log.Warn("slot settled by its lease's fence: the lease moved to another node", "service", serviceName(v.svc),
				"service_id", v.set.ServiceID, "replica", row.Replica, "node_id", row.NodeID, "holder", v.holder, "workload_id", row.WorkloadID)
			row.Generation, row.Acked = int(slots.GenRemove), int(slots.GenRemove)
			rows = append(rows, row)
			moved = true
			continue
		}
		if acked := receipts(row, v.workloads[row.WorkloadID], n); acked > row.Acked {
			row.Acked = acked
			moved = true
		}
		rows = append(rows, row)
	}
	if !moved {
		return false, nil
	}
	return true, p.cfg.Store.writeSlots(ctx, v.set, rows)
}

// receipts returns the highest generation of row the node acknowledged (docs/reconciliation.md
// section 3): run once the node reported the workload or applied a desired state carrying it;
// stop once it applied a desired state that stops it and reports it not running; remove once it
// applied one without it. Receipts join in order.
func receipts(row SlotRow, w *services.Workload, n *nodes.Node) int {
	acked := row.Acked
	if w == nil || n == nil {
		return acked
	}
	applied := w.StatusRev > 0 && n.AppliedRev >= w.StatusRev
	if acked < int(slots.GenRun) && (w.ObservedAt != nil || applied) {
		acked = int(slots.GenRun)
	}
	down := w.ObservedStatus != "running" && w.ObservedStatus != "starting" && w.ObservedStatus != "stopping"
	if acked == int(slots.GenRun) && row.Generation >= int(slots.GenStop) && w.DesiredStatus != services.DesiredRunning && applied && down {
		acked = int(slots.GenStop)
	}
	if acked == int(slots.GenStop) && row.Generation == int(slots.GenRemove) && w.DesiredStatus == services.DesiredRemoved && applied && down {
		acked = int(slots.GenRemove)
	}
	return acked
}

// member reports whether n may hold slots of svc: a member node that runs svc's driver (nodes
// that never said which drivers they run take the default process driver).
func member(n *nodes.Node, svc *services.Service) bool {
	if !n.Member() {
		return false
	}
	if svc == nil || svc.Runtime == "" || svc.Runtime == "process" {
		return true
	}
	return slices.Contains(n.Drivers, svc.Runtime)
}

// place returns the node of every scheduled replica, and why the first replica that fits
// nowhere does not ("" when all have a node). A replica keeps the node its slot stands on while
// that node is a member that still meets the service's region and selector
// ([placement.Satisfied]) and is not draining; the others are placed by the one decider ([placement.Choose]) over
// every node, with what use says stands on each (capacity, cordon, requirements, spread,
// preferences, load). The one slot of a leased (stateful) service stands where the lease is held,
// and nowhere while it is not. A replica on a draining node is placed anew elsewhere, and keeps
// its node while the decider finds nowhere else for it. A replica a rebalance moves
// ([services.Rebalance]) goes to its target while the target is feasible for it
// ([placement.Feasible]), and keeps its node otherwise.
// ns are every node, byID the same by id.
func place(v *view, ns []nodes.Node, byID map[string]*nodes.Node, use *placement.Usage) (map[string]string, string) {
	placed := map[string]string{}
	if v.svc == nil || v.spec == nil || v.spec.Spec.Placement.Mode != slots.PlacementScheduled {
		return placed, ""
	}
	if v.leased {
		if n := byID[v.holder]; n != nil && member(n, v.svc) {
			placed["0"] = v.holder
			return placed, ""
		}
		if v.spec.Spec.Replicas.Total == 0 {
			return placed, ""
		}
		// Nobody holds the lease: say why when no node could take the replica (the reconciler
		// grants the lease where the same decider chooses).
		req, cands := request(&view{svc: v.svc, spec: v.spec, set: &SlotSet{}}, ns, byID, use, map[string]string{}, nil, nil)
		req.Place = req.Place[:min(len(req.Place), 1)]
		return placed, placement.Choose(req, cands).Unplaceable()
	}
	draining := map[string]string{} // replica: the draining node its slot stands on
	moving := map[string]string{}   // replica: the node a rebalance moves it to
	req, cands := request(v, ns, byID, use, placed, draining, moving)
	for _, r := range slices.SortedFunc(maps.Keys(moving), compareReplica) {
		if moveTo(&req, cands, r, moving[r]) {
			placed[r] = moving[r]
		}
	}
	res := placement.Choose(req, cands)
	for r, id := range res.Placed() {
		placed[r] = id
	}
	for r, id := range draining {
		if placed[r] == "" { // nowhere else to go: it stays where it is, serving
			placed[r] = id
		}
	}
	for _, c := range res.Choices {
		if c.NodeID == "" && placed[c.Replica] == "" {
			return placed, c.Reason
		}
	}
	return placed, ""
}

// request builds the decider's request for v's scheduled replicas: it records in placed the
// replicas that keep their node, and returns the request for the others with the candidates
// (none when every replica keeps its node and none moves, so a steady service costs no node
// list). A replica on a draining node is placed anew and recorded in draining (nil: none
// expected) with that node. A kept replica that the service's rebalance moves from its node is
// recorded in moving (nil: rebalances are not honoured) with the node it moves to; one that
// already has a slot on that node stands there.
func request(v *view, ns []nodes.Node, nodeByID map[string]*nodes.Node, use *placement.Usage, placed, draining, moving map[string]string) (placement.Request, []placement.Node) {
	req := placement.ServiceRequest(v.svc)
	req.Existing = map[string]string{}
	var stands map[[2]string]bool // replica and node of every kept slot, only when moves are honoured
	if moving != nil && v.svc.Rebalance != nil {
		stands = map[[2]string]bool{}
	}
	for _, row := range v.set.Slots {
		n := nodeByID[row.NodeID]
		if n == nil || n.Status == nodes.StatusRemoved || !member(n, v.svc) {
			continue
		}
		if code, _ := placement.Satisfied(req, placement.Node{ID: n.ID, Region: n.Region, Labels: n.Labels}); code != "" {
			continue
		}
		// A replica's surge slot ("3~") places the replica as its primary does; the run
		// (generation 1) wins over a slot on its way out.
		r := slots.BaseReplica(row.Replica)
		if n.Draining() {
			if draining != nil {
				draining[r] = row.NodeID
			}
			continue
		}
		if stands != nil {
			stands[[2]string{r, row.NodeID}] = true
		}
		if _, ok := placed[r]; !ok || row.Generation == int(slots.GenRun) {
			placed[r] = row.NodeID
			req.Existing[r] = row.NodeID
		}
	}
	for r, from := range placed {
		to := v.svc.Rebalance.MoveOf(r, from)
		switch {
		case stands == nil || to == "":
		case stands[[2]string{r, to}]:
			placed[r], req.Existing[r] = to, to // under way: its successor stands there
		default:
			moving[r] = to
		}
	}
	for i := 0; i < v.spec.Spec.Replicas.Total; i++ {
		if r := strconv.Itoa(i); placed[r] == "" {
			req.Place = append(req.Place, r)
		}
	}
	if len(req.Place) == 0 && len(moving) == 0 {
		return req, nil
	}
	return req, placement.Candidates(ns, use, v.svc.Runtime)
}

// moveTo moves replica r of req to node to when to is among cands and feasible for one more
// replica with r counted off its old node ([placement.Feasible]): req.Existing and to's Used
// take it (its old node keeps its reservation until it has gone, as a surge successor's does).
// It reports whether r moved.
func moveTo(req *placement.Request, cands []placement.Node, r, to string) bool {
	i := slices.IndexFunc(cands, func(n placement.Node) bool { return n.ID == to })
	if i < 0 {
		return false
	}
	check := *req
	check.Existing = make(map[string]string, len(req.Existing))
	for k, id := range req.Existing {
		if k != r {
			check.Existing[k] = id
		}
	}
	if code, _ := placement.Feasible(check, cands[i]); code != "" {
		return false
	}
	req.Existing[r] = to
	cands[i].Used = cands[i].Used.Add(req.Resources)
	return true
}

// input builds the planner's input from a read, the nodes and the placement chosen.
func (p *Producer) input(v *view, ns map[string]*nodes.Node, placed map[string]string) slots.ServiceInput {
	in := slots.ServiceInput{Now: p.cfg.Now()}
	for _, row := range v.set.Slots {
		in.Slots = append(in.Slots, slotOf(row, v.workloads[row.WorkloadID], v.spec))
	}
	if v.spec != nil {
		in.SpecRevision = v.spec.Revision
	}
	if v.svc == nil {
		return in
	}
	var all []slots.Node
	for _, n := range ns {
		all = append(all, slots.Node{ID: n.ID, Platform: Platform, Member: member(n, v.svc)})
	}
	spec := specOf(v.spec)
	if spec != nil && p.cfg.Leases != nil && v.svc.Stateful() {
		spec = statefulSpec(*spec)
	}
	d := slots.Desire(spec, v.svc.Deleting, all, placed)
	in.Unplaced, in.Refused = len(d.Unplaced), d.Refused
	in.Rollout = slots.ResolveRollout(v.svc.Rollout, len(d.Placed)+len(d.Unplaced), v.leased || v.svc.Stateful(), v.svc.RolloutPaused)
	if len(d.Placed) == 0 {
		return in
	}
	release := v.svc.Release().Digest()
	if release == "" {
		in.Blocker = &slots.Blocker{Refused: true, Reason: slots.ReasonReleaseMissing}
	}
	for _, pl := range d.Placed {
		key, err := desiredKey(v.svc, v.spec, pl.Platform)
		if err != nil {
			in.Blocker = &slots.Blocker{Refused: true, Reason: slots.ReasonSlotInvalid}
			continue
		}
		in.Desired = append(in.Desired, slots.DesiredSlot{Replica: pl.Replica, NodeID: pl.NodeID, Key: key})
	}
	return in
}

// desiredKey returns the desired attempt key of svc's replicas on platform under spec: its
// release, environment and invocation, the spec's key revision (which replica-count changes
// leave alone) and network, and the service's restart generation.
func desiredKey(svc *services.Service, spec *SpecDoc, platform string) (string, error) {
	sp := *specOf(spec)
	return slots.DesiredAttemptKey(slots.KeyInput{ReleaseDigest: svc.Release().Digest(), SpecRevision: sp.KeyRevision(), Env: svc.Env,
		Platform: platform, NetworkMode: sp.Network, Invocation: svc.InvocationDigest(), Restart: svc.RestartGeneration})
}

// statefulSpec returns sp as a stateful service runs it: scheduled, at most one replica (its
// node is the lease holder's, chosen by [Producer.place]).
func statefulSpec(sp slots.Spec) *slots.Spec {
	sp.Placement = slots.Placement{Mode: slots.PlacementScheduled}
	sp.Replicas = slots.Replicas{Total: min(sp.Replicas.Total, 1)}
	return &sp
}

// slotOf converts a stored row and its workload into the decision's view of the slot.
func slotOf(row SlotRow, w *services.Workload, spec *SpecDoc) slots.Slot {
	s := slots.Slot{Exists: true, Replica: row.Replica, NodeID: row.NodeID,
		Attempt:    slots.Attempt{ID: row.Attempt.ID, Key: row.Attempt.Key, Predecessor: row.Attempt.Predecessor},
		Generation: slots.Generation(row.Generation), Acked: slots.Generation(row.Acked)}
	for _, a := range row.Ancestors {
		s.Ancestors = append(s.Ancestors, slots.Attempt{ID: a.ID, Key: a.Key, Predecessor: a.Predecessor})
	}
	if w != nil {
		s.Observed = observation(w, spec)
		s.Observed.Unhealthy = w.Health == "failing"
		s.Observed.Failure = decisionFailure(ownFailure(row, w))
	}
	s.Carried, s.CarriedKey = decisionFailure(row.LastFailure), row.FailureKey
	return s
}

// decisionFailure reduces a stored failure (nil: none) to what a verdict names.
func decisionFailure(f *services.Failure) *slots.Failure {
	if f == nil {
		return nil
	}
	return &slots.Failure{Kind: f.Kind, ExitCode: f.ExitCode, Signal: f.Signal, ProbeURL: f.ProbeURL, ProbeStatus: f.ProbeStatus}
}

// observation maps a workload's reported status onto the decision's phases: an attempt that
// crashed (or stopped on its own) and was not ready since counts as failed from the first such
// report, even while the node restarts it in place.
func observation(w *services.Workload, spec *SpecDoc) slots.Observation {
	o := slots.Observation{EverReady: w.EverReady}
	if w.ObservedAt != nil {
		o.AcceptedAt = *w.ObservedAt
	}
	probeless := spec != nil && spec.Spec.Readiness.Kind == slots.ProbeProcess
	switch {
	case w.FailedAt != nil:
		o.Phase, o.AcceptedAt = slots.PhaseFailed, *w.FailedAt
	case w.ObservedStatus == "running":
		o.Phase, o.Ready = slots.PhaseRunning, probeless || w.Health == "passing"
		o.EverReady = o.EverReady || o.Ready
	case w.ObservedStatus == "starting" || w.ObservedStatus == "stopping":
		o.Phase = slots.PhaseStarting
	case w.ObservedStatus == "crashed":
		o.Phase = slots.PhaseFailed
	case w.ObservedStatus == "stopped" && w.DesiredStatus == services.DesiredRunning:
		o.Phase = slots.PhaseStopped
	default:
		o.AcceptedAt = time.Time{}
	}
	return o
}

var errNotAdmitted = errors.New("run not admitted by the deploy policy")

// notAdmitted is a run the deploy hook held back: it wraps errNotAdmitted and carries the
// verdict reason the hold names ([slots.PolicyDeniedReason] or [slots.ReasonPolicyUnavailable]).
type notAdmitted struct{ reason slots.Reason }

func (e *notAdmitted) Error() string { return errNotAdmitted.Error() + ": " + string(e.reason) }
func (e *notAdmitted) Unwrap() error { return errNotAdmitted }

// commit commits one slot's step (docs/reconciliation.md section 6): it reads the service
// again, plans again over the fresh read, checks the fresh decision is the step made, and writes
// the slot set with one compare-and-set on the revision it read; then it brings the workload
// document in line. It returns an error wrapping slots.ErrConflict when the slot moved.
func (p *Producer) commit(ctx context.Context, id string, made slots.SlotPlan, ns map[string]*nodes.Node, placed map[string]string) error {
	if p.beforeCommit != nil {
		p.beforeCommit()
	}
	v, err := p.read(ctx, id, nil, true)
	if err != nil {
		return err
	}
	plan := slots.PlanService(p.input(v, ns, placed))
	var fresh *slots.SlotPlan
	for i := range plan.Slots {
		if plan.Slots[i].Replica == made.Replica {
			fresh = &plan.Slots[i]
		}
	}
	if fresh == nil {
		return fmt.Errorf("slot %q: gone from the fresh plan: %w", made.Replica, slots.ErrConflict)
	}
	if fresh.Withheld {
		return fmt.Errorf("slot %q: withheld on the fresh read: %w", made.Replica, slots.ErrConflict)
	}
	d, err := slots.CheckCommit(made.Decision, fresh.Input)
	if err != nil {
		return err
	}
	now := p.cfg.Now().UTC()
	rows := slices.Clone(v.set.Slots)
	idx := slices.IndexFunc(rows, func(r SlotRow) bool { return r.Replica == made.Replica })
	var w *services.Workload
	var settled string // the workload of the removed attempt a run succeeds
	// A run, and a stop that begins a replacement (drift, failed-elapsed), need the deploy
	// hook's yes for the run that follows: asked before the stop, a refusal leaves the
	// incumbent running (docs/reconciliation.md section 7.3).
	if d.Step == slots.StepRun || d.Step == slots.StepStop && d.NeedsBuild() {
		n := ns[fresh.NodeID]
		if n == nil {
			return fmt.Errorf("slot %q: node %s is gone: %w", made.Replica, fresh.NodeID, slots.ErrConflict)
		}
		if err := p.admit(ctx, v.svc, made.Replica, d, n); err != nil {
			return err
		}
	}
	switch d.Step {
	case slots.StepRun:
		att, err := slots.AttemptID(d.Key, d.Predecessor)
		if err != nil {
			return err
		}
		row := SlotRow{Replica: made.Replica, NodeID: fresh.NodeID, Generation: int(slots.GenRun), CommittedAt: now,
			Attempt: AttemptRow{ID: att, Key: d.Key, Predecessor: d.Predecessor}, WorkloadID: workloadID(id, made.Replica, att)}
		if idx >= 0 {
			old := rows[idx]
			settled = old.WorkloadID
			row.LastFailure, row.FailureKey = carry(old, v.workloads[old.WorkloadID])
			row.Ancestors = append([]AttemptRow{old.Attempt}, old.Ancestors...)
			row.Ancestors = row.Ancestors[:min(len(row.Ancestors), slots.MaxAncestors)]
			rows[idx] = row
		} else {
			rows = append(rows, row)
		}
		w = p.workloadFor(v.svc, row)
		limits(w, v.spec)
	case slots.StepStop, slots.StepRemove:
		if idx < 0 {
			return fmt.Errorf("slot %q: no row: %w", made.Replica, slots.ErrConflict)
		}
		rows[idx].Generation, rows[idx].CommittedAt = int(d.Generation), now
	}
	if err := p.cfg.Store.writeSlots(ctx, v.set, rows); err != nil {
		return err
	}
	p.log.Info("slot step committed", "service", serviceName(v.svc), "service_id", id, "replica", made.Replica, "case", d.Case, "step", d.Step, "node_id", fresh.NodeID)
	if w != nil {
		if settled != "" {
			if err := p.cfg.Catalog.RemoveWorkload(ctx, settled); err != nil {
				return err
			}
		}
		return p.cfg.Catalog.InsertWorkload(ctx, w)
	}
	row := rows[idx]
	_, err = p.cfg.Catalog.SetDesiredStatus(ctx, row.WorkloadID, desiredStatus(row.Generation))
	if errors.Is(err, store.ErrNotFound) {
		return nil // repaired below from the row
	}
	return err
}

// admit asks the deploy hook about the run d leads to for replica of svc on n: nil when
// allowed (or no hook is configured), a *notAdmitted otherwise.
func (p *Producer) admit(ctx context.Context, svc *services.Service, replica string, d slots.Decision, n *nodes.Node) error {
	if p.cfg.Admit == nil {
		return nil
	}
	ok, reasons, err := p.cfg.Admit.AdmitDeploy(ctx, svc, replicaIndex(replica), n)
	if err == nil && ok {
		return nil
	}
	p.log.Warn("run not admitted by the deploy policy", "service", serviceName(svc), "service_id", svc.ID, "replica", replica,
		"case", d.Case, "node_id", n.ID, "reasons", reasons, "err", err)
	if err != nil {
		return &notAdmitted{reason: slots.ReasonPolicyUnavailable}
	}
	return &notAdmitted{reason: slots.PolicyDeniedReason(reasons)}
}

// repair brings every workload document in line with its slot row: it creates the workload of a
// run whose document is missing (a sweep that died between its commit and the insert), sets the
// desired status of each generation, and deletes the workloads of settled slots. It reports
// whether it wrote.
func (p *Producer) repair(ctx context.Context, v *view) (bool, error) {
	wrote := false
	for _, row := range v.set.Slots {
		w := v.workloads[row.WorkloadID]
		settled := row.Generation == int(slots.GenRemove) && row.Acked == int(slots.GenRemove)
		switch {
		case settled && w != nil:
			if err := p.cfg.Catalog.RemoveWorkload(ctx, w.ID); err != nil {
				return wrote, err
			}
			wrote = true
		case settled:
		case w == nil && v.svc != nil:
			nw := p.workloadFor(v.svc, row)
			limits(nw, v.spec)
			nw.DesiredStatus = desiredStatus(row.Generation)
			if err := p.cfg.Catalog.InsertWorkload(ctx, nw); err != nil {
				return wrote, err
			}
			wrote = true
		case w != nil && w.DesiredStatus != desiredStatus(row.Generation):
			ok, err := p.cfg.Catalog.SetDesiredStatus(ctx, w.ID, desiredStatus(row.Generation))
			if err != nil {
				return wrote, err
			}
			wrote = wrote || ok
		}
	}
	return wrote, nil
}

// limits copies an operator spec's resources and http readiness probe onto a new workload (a
// derived spec states nothing the service does not already say).
func limits(w *services.Workload, spec *SpecDoc) {
	if spec == nil || spec.Source != SourceOperator {
		return
	}
	w.MemoryBytes, w.CPUMillis = spec.Spec.Resources.MemoryBytes, spec.Spec.Resources.CPUMillis
	if r := spec.Spec.Readiness; r.Kind == slots.ProbeHTTP {
		w.Probe = &services.HealthCheck{Path: r.Path, IntervalS: int(max(r.IntervalMS/1000, 1)), TimeoutS: int(max(r.TimeoutMS/1000, 1)), Failures: r.Failures}
	}
}

func desiredStatus(gen int) string {
	switch slots.Generation(gen) {
	case slots.GenStop:
		return services.DesiredStopped
	case slots.GenRemove:
		return services.DesiredRemoved
	}
	return services.DesiredRunning
}

// workloadFor returns the workload document of row's attempt.
// It starts with the slot's carried failure, so the slot's last failure shows across attempts.
func (p *Producer) workloadFor(svc *services.Service, row SlotRow) *services.Workload {
	w := &services.Workload{ID: row.WorkloadID, ProjectID: svc.ProjectID, Project: svc.Project, ServiceID: svc.ID, Service: svc.Name,
		Slot: replicaIndex(row.Replica), Replica: row.Replica, AttemptID: row.Attempt.ID, NodeID: row.NodeID, SpecHash: row.Attempt.Key,
		Run:           services.InvocationOf(svc),
		DesiredStatus: services.DesiredRunning, ObservedStatus: "creating", Health: "unknown", CreatedAt: p.cfg.Now().UTC()}
	if f := row.LastFailure; f != nil {
		c := *f
		w.LastFailure, w.FailureBase = &c, f.Count
	}
	return w
}

// workloadID derives the workload id of an attempt, so a repeated commit or repair creates the
// same workload: "wl_" and 26 hex digits of SHA-256 over the service id, replica and attempt id.
func workloadID(serviceID, replica, attemptID string) string {
	sum := sha256.Sum256([]byte(serviceID + "/" + replica + "\x00" + attemptID))
	return "wl_" + hex.EncodeToString(sum[:13])
}

// replicaIndex returns the index of "<i>" or "<node>.<i>" (and of their surge names "<i>~"),
// 0 when there is none.
func replicaIndex(replica string) int {
	replica = slots.BaseReplica(replica)
	if i := lastDot(replica); i >= 0 {
		replica = replica[i+1:]
	}
	n, _ := strconv.Atoi(replica)
	return n
}

func lastDot(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '.' {
			return i
		}
	}
	return -1
}
