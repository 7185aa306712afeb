package slots

import (
	"slices"
	"time"
)

// VerdictState is the state of a service's verdict (docs/reconciliation.md section 7).
type VerdictState string

// Verdict states.
const (
	// Converged: every desired replica runs its desired attempt, observed ready, and nothing is
	// pending (a held or deleted service whose slots all settled is converged too).
	Converged VerdictState = "converged"
	// Converging: anything that is neither converged, waiting nor refused.
	Converging VerdictState = "converging"
	// Waiting: production waits on something named by Reason (failure-backoff, conflict, or a
	// wait of the build).
	Waiting VerdictState = "waiting"
	// Refused: new work cannot be built or placed, for the reason named; stops and removals still
	// proceed.
	Refused VerdictState = "refused"
)

// Verdict is one service's production verdict about one spec revision.
type Verdict struct {
	SpecRevision int64        `json:"spec_revision" bson:"spec_revision"`
	State        VerdictState `json:"state" bson:"state"`
	// Reason names the wait or the refusal; "" for converged and converging.
	Reason Reason `json:"reason,omitempty" bson:"reason,omitempty"`
}

// String returns "converged", "converging", "waiting(<reason>)" or "refused(<reason>)".
func (v Verdict) String() string {
	if v.Reason == "" {
		return string(v.State)
	}
	return string(v.State) + "(" + string(v.Reason) + ")"
}

// VerdictChanged reports whether next differs from the stored verdict prev (nil: none stored), so
// the caller writes the verdict, with its changed-at time, only when it moved.
func VerdictChanged(prev *Verdict, next Verdict) bool {
	return prev == nil || *prev != next
}

// ConflictVerdict returns the verdict to write when a commit of this sweep aborted with
// [ErrConflict]: waiting(conflict) about v's spec revision, unless v is a refusal, which stands.
// The next sweep decides again from fresh reads and replaces it.
func ConflictVerdict(v Verdict) Verdict {
	if v.State == Refused {
		return v
	}
	return Verdict{SpecRevision: v.SpecRevision, State: Waiting, Reason: ReasonConflict}
}

// Blocker is why a service's new work cannot be built this sweep: the release it names is
// missing, the platform cannot run it, or a wait of the build. While a blocker stands, steps with
// a desire behind them are withheld ([Decision.NeedsBuild]); stops of unwanted slots and removals
// still commit.
type Blocker struct {
	// Refused reports whether this is a refusal (true) or a wait (false).
	Refused bool
	Reason  Reason
}

// DesiredSlot is one replica the service desires, with its desired attempt key.
type DesiredSlot struct {
	Replica string
	NodeID  string
	// Key is [DesiredAttemptKey] for this replica on NodeID.
	Key string
}

// ServiceInput is one consistent read of a service for [PlanService].
type ServiceInput struct {
	// SpecRevision is the spec revision the desire derives from (0: no spec).
	SpecRevision int64
	// Desired are the placed replicas the service desires, any order; empty for an empty desire.
	Desired []DesiredSlot
	// Unplaced counts replicas the desire wants but could not place yet ([DesireResult.Unplaced]).
	Unplaced int
	// Refused is the desire's own refusal ([DesireResult.Refused]), "" for none.
	Refused Reason
	// Unplaceable is why a replica the desire wants fits on no node ([UnplaceableReason]), ""
	// when every replica has a node; the verdict waits on it.
	Unplaceable Reason
	// Blocker is set when the service's new work cannot be built this sweep.
	Blocker *Blocker
	// Slots are every slot row of the service, any order; more than [MaxSlots] is refused as
	// replica-limit and decides nothing.
	Slots []Slot
	// Rollout bounds the replacements (its zero value replaces one replica at a time, stop
	// before start).
	Rollout Rollout
	// Now is the core's clock for this sweep.
	Now time.Time
}

// SlotPlan is the decision for one slot of a service.
type SlotPlan struct {
	Replica string
	// NodeID is the node the step is for: the desired node for a run, the slot's node otherwise.
	NodeID string
	// Input is what the decision read; the commit re-reads it fresh for [CheckCommit].
	Input    Input
	Decision Decision
	// Withheld reports whether the step would act but is held back by the service's blocker.
	Withheld bool
	// Held reports whether the slot is an incumbent kept running at its own attempt while its
	// replica's successor comes up (or waits for the rollout's bounds): its Input desires its
	// own key, not the replica's.
	Held bool
}

// Commits reports whether the caller commits this slot's step this sweep.
func (p SlotPlan) Commits() bool { return p.Decision.Acts() && !p.Withheld }

// Plan is [PlanService]'s outcome.
type Plan struct {
	// Slots holds one entry per existing slot and per desired replica without one, in replica
	// order.
	Slots   []SlotPlan
	Verdict Verdict
	// WakeAt is the earliest pending backoff end, when a sweep should run again without a hint;
	// zero for none.
	WakeAt time.Time
}

// PlanService decides every slot of one service for one sweep (docs/reconciliation.md section 5):
// each slot through [DecideSlotTransition], replacements within the service's rollout bounds
// ([ServiceInput.Rollout]), desire-backed steps withheld under a blocker, and the verdict. Pure
// and deterministic: the order of in.Slots and in.Desired does not matter. A replica listed twice
// in either, a desired replica named with [SurgeSuffix], or a slot with Exists false, decides
// nothing and refuses the service slot-invalid.
//
// A replica has two slot names, "<r>" and "<r>~" ([SurgeSuffix]). Its target is the slot that
// runs (or is on its way to run) the desired attempt on the desired node; any other slot of it
// that still runs is its incumbent. Rules, for the desired replicas in replica order (those with
// no incumbent to replace first, then those with one, failed incumbents first):
//
//  1. a target that is ready ends every incumbent (they stop); one that is not yet ready keeps
//     them running at their own attempt (held), unless an incumbent failed, which stops;
//  2. a replica with an incumbent and no target begins a replacement: with a surge left
//     (running slots below desired replicas plus MaxSurge) its successor starts in the free
//     name beside the incumbent (surge); otherwise the incumbent stops first (in place) when
//     the ready replicas stay at or above desired replicas minus MaxUnavailable, or when it
//     was not ready anyway; otherwise it waits (replacement-in-flight);
//  3. every run the table would admit counts against the surge: while running slots (runs, and
//     stops the node has not yet acknowledged) reach desired replicas plus MaxSurge, the run
//     waits (start-held);
//  4. a paused rollout begins no replacement (its incumbents wait; the verdict waits on
//     rollout-paused); replacements under way finish and missing replicas still start.
//
// Slots of replicas not desired stop and settle as the table says, outside the bounds.
//
// The caller commits the slots whose [SlotPlan.Commits] holds, one at a time in the order given.
// For each it reads the service again, calls PlanService over the fresh read, and passes the same
// replica's fresh [SlotPlan.Input] to [CheckCommit]; committing the earlier slots of the same plan
// never makes a later one conflict (each commit spends exactly the bound the plan counted for it).
func PlanService(in ServiceInput) Plan {
	if len(in.Slots) > MaxSlots {
		return Plan{Verdict: Verdict{SpecRevision: in.SpecRevision, State: Refused, Reason: ReasonReplicaLimit}}
	}
	invalid := Plan{Verdict: Verdict{SpecRevision: in.SpecRevision, State: Refused, Reason: ReasonSlotInvalid}}
	desired := make(map[string]DesiredSlot, len(in.Desired))
	for _, d := range in.Desired {
		if _, dup := desired[d.Replica]; dup || BaseReplica(d.Replica) != d.Replica {
			return invalid
		}
		desired[d.Replica] = d
	}
	byReplica := make(map[string]Slot, len(in.Slots))
	groups := map[string][]Slot{}
	for _, s := range in.Slots {
		if _, dup := byReplica[s.Replica]; dup || !s.Exists {
			return invalid
		}
		byReplica[s.Replica] = s
		if b := BaseReplica(s.Replica); desired[b].Replica != "" {
			groups[b] = append(groups[b], s)
		}
	}
	ro := in.Rollout
	ro.MaxSurge, ro.MaxUnavailable = max(ro.MaxSurge, 0), max(ro.MaxUnavailable, 0)
	if ro.MaxSurge == 0 && ro.MaxUnavailable == 0 {
		ro.MaxUnavailable = 1
	}
	running, ready := 0, 0
	for _, s := range in.Slots {
		if Running(s) {
			running++
		}
	}
	for b := range desired {
		if slices.ContainsFunc(groups[b], Ready) {
			ready++
		}
	}
	pl := planner{now: in.Now, inputs: map[string]Input{}, nodes: map[string]string{}, held: map[string]bool{},
		starts: len(desired) + ro.MaxSurge - running, stops: ready - (len(desired) - ro.MaxUnavailable), rollout: ro}
	for r, s := range byReplica {
		if desired[BaseReplica(r)].Replica == "" {
			pl.set(s, false, "", s.NodeID)
		}
	}
	// Replicas with nothing to replace go first: they restore what is missing.
	var first, replace []job
	for b, d := range desired {
		rows := groups[b]
		slices.SortFunc(rows, func(x, y Slot) int { return compareReplicas(x.Replica, y.Replica) })
		j := job{d: d, rows: rows}
		for _, s := range rows {
			if s.Generation == GenRun && !j.matches(s) {
				j.incumbents = append(j.incumbents, s)
			}
			if j.matches(s) {
				j.target = true
			}
			if Ready(s) {
				j.rank = 1
			}
		}
		if len(j.incumbents) > 0 && !j.target {
			replace = append(replace, j)
		} else {
			first = append(first, j)
		}
	}
	slices.SortFunc(first, func(x, y job) int { return compareReplicas(x.d.Replica, y.d.Replica) })
	slices.SortFunc(replace, func(x, y job) int {
		if x.rank != y.rank {
			return x.rank - y.rank
		}
		return compareReplicas(x.d.Replica, y.d.Replica)
	})
	for _, j := range first {
		pl.restore(j)
	}
	for _, j := range replace {
		pl.replace(j)
	}

	names := make([]string, 0, len(pl.inputs))
	for r := range pl.inputs {
		names = append(names, r)
	}
	slices.SortFunc(names, compareReplicas)
	plans := make([]SlotPlan, len(names))
	for i, r := range names {
		p := &plans[i]
		*p = SlotPlan{Replica: r, NodeID: pl.nodes[r], Input: pl.inputs[r], Held: pl.held[r]}
		p.Decision = DecideSlotTransition(p.Input)
		p.Withheld = in.Blocker != nil && p.Decision.Acts() && p.Decision.NeedsBuild()
	}
	for _, j := range append(first, replace...) {
		if !slices.ContainsFunc(j.rows, func(s Slot) bool { return s.Generation == GenRun && j.matches(s) }) {
			pl.incomplete = true
		}
	}
	out := Plan{Slots: plans, Verdict: verdict(in, plans, pl.incomplete, pl.paused)}
	for _, p := range plans {
		if p.Decision.Case == CaseFailedWaiting && (out.WakeAt.IsZero() || p.Decision.RetryAt.Before(out.WakeAt)) {
			out.WakeAt = p.Decision.RetryAt
		}
	}
	return out
}

// verdict applies the precedence refused > waiting > converging > converged.
//
// A waiting verdict of a failed slot names its failure ([CrashLoopReason]); a slot whose run is
// up at the desired key with its readiness probe failing, or whose successor has not been ready
// since an earlier attempt at the same key failed, makes the service wait on that
// ([UnhealthyReason], [CrashLoopReason]) instead of converging. The first slot in replica order
// names the reason.
func verdict(in ServiceInput, plans []SlotPlan, incomplete, paused bool) Verdict {
	v := Verdict{SpecRevision: in.SpecRevision}
	invalid, backoff, settled := false, false, true
	var backoffReason, stuck Reason
	for _, p := range plans {
		switch p.Decision.Case {
		case CaseInvalid:
			invalid = true
		case CaseFailedWaiting:
			if !backoff {
				backoffReason = CrashLoopReason(p.Input.Slot.Observed.Failure)
			}
			backoff = true
		case CaseRunning:
			if stuck == "" {
				stuck = stuckReason(p.Input.Slot)
			}
		case CaseStopReceiptPending, CaseRemove, CaseRemoveReceiptPending, CaseAdmitRunSuccessor:
			if stuck == "" && p.Input.Desired {
				stuck = replacingReason(p.Input.Slot, p.Input.DesiredKey)
			}
		}
		s := p.Input.Slot
		switch p.Decision.Case {
		case CaseSettled, CaseAbsent:
		case CaseRunning:
			if s.Observed.Phase != PhaseRunning || !s.Observed.Ready {
				settled = false
			}
		default:
			settled = false
		}
	}
	switch {
	case invalid:
		v.State, v.Reason = Refused, ReasonSlotInvalid
	case in.Refused != "":
		v.State, v.Reason = Refused, in.Refused
	case in.Blocker != nil && in.Blocker.Refused:
		v.State, v.Reason = Refused, in.Blocker.Reason
	case in.Blocker != nil:
		v.State, v.Reason = Waiting, in.Blocker.Reason
	case backoff:
		v.State, v.Reason = Waiting, backoffReason
	case stuck != "":
		v.State, v.Reason = Waiting, stuck
	case in.Unplaceable != "":
		v.State, v.Reason = Waiting, in.Unplaceable
	case paused:
		v.State, v.Reason = Waiting, ReasonRolloutPaused
	case settled && in.Unplaced == 0 && !incomplete:
		v.State = Converged
	default:
		v.State = Converging
	}
	return v
}

// stuckReason returns why a slot the table finds running at its desired key cannot become
// ready, "" when nothing says it cannot: its probe fails, or its attempt succeeds one that
// failed at the same key and was not ready since.
func stuckReason(s Slot) Reason {
	o := s.Observed
	if o.Phase == PhaseRunning && o.Ready {
		return ""
	}
	if f := o.Failure; o.Phase == PhaseRunning && o.Unhealthy && f != nil && f.Kind == FailureProbe {
		return UnhealthyReason(*f)
	}
	if c := s.Carried; c != nil && !o.EverReady && s.Attempt.Predecessor != "" && s.CarriedKey == s.Attempt.Key {
		if c.Kind == FailureProbe {
			return UnhealthyReason(*c)
		}
		return CrashLoopReason(c)
	}
	return ""
}

// replacingReason returns why a desired slot that is being replaced after a failure waits: the
// failure of its attempt when that attempt ran desiredKey, else the failure it carries from an
// earlier attempt at desiredKey; "" for a replacement with no failure at the desired key behind
// it (a drift to a new release).
func replacingReason(s Slot, desiredKey string) Reason {
	f := s.Carried
	if s.Attempt.Key == desiredKey && s.Observed.Failure != nil {
		f = s.Observed.Failure
	} else if s.CarriedKey != desiredKey {
		return ""
	}
	switch {
	case f == nil:
		return ""
	case f.Kind == FailureProbe:
		return UnhealthyReason(*f)
	}
	return CrashLoopReason(f)
}

// ReasonSlotSettlementPending is the deletion finalizer's wait while a slot is not settled.
const ReasonSlotSettlementPending Reason = "slot-settlement-pending"

// SettlementPending returns ReasonSlotSettlementPending when any of slots has not reached its
// removal with both receipts joined, and "" when every slot settled (or there are none): the
// deletion finalizer removes a deleting service only then (docs/reconciliation.md section 9).
func SettlementPending(slots []Slot) Reason {
	for _, s := range slots {
		if s.Exists && (s.Generation != GenRemove || s.Acked != GenRemove) {
			return ReasonSlotSettlementPending
		}
	}
	return ""
}

// ReasonUnplaceable (waiting): a replica the service wants fits on no node; the placement
// decider's reason follows after ": ", as in "unplaceable: needs memory 512 MiB, largest free
// 256 MiB on 3 nodes matching region=eu" (docs/placement.md section 5).
const ReasonUnplaceable Reason = "unplaceable"

// UnplaceableReason returns [ReasonUnplaceable] with the decider's reason why.
func UnplaceableReason(why string) Reason {
	if why == "" {
		return ReasonUnplaceable
	}
	return Reason(string(ReasonUnplaceable) + ": " + why)
}

// IsUnplaceable reports whether r is a [ReasonUnplaceable] reason.
func IsUnplaceable(r Reason) bool {
	return r == ReasonUnplaceable || len(r) > len(ReasonUnplaceable)+2 && r[:len(ReasonUnplaceable)+2] == ReasonUnplaceable+": "
}
