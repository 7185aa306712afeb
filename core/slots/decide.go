package slots

import "time"

// Case names the row of the decision table a slot is in (docs/reconciliation.md section 3). Every
// input of [DecideSlotTransition] lands in exactly one case.
type Case string

// Decision cases.
const (
	// CaseAbsent: no slot and no desire; nothing to do.
	CaseAbsent Case = "absent"
	// CaseAdmitRunFirst: no slot and a desire; run at generation 1 with no predecessor.
	CaseAdmitRunFirst Case = "admit-run-first"
	// CaseAdmitRunSuccessor: removed with both receipts and a desire; run at generation 1 citing
	// the removed attempt as predecessor.
	CaseAdmitRunSuccessor Case = "admit-run-successor"
	// CaseSettled: removed with both receipts and no desire; nothing to do.
	CaseSettled Case = "settled"
	// CaseRunning: running the desired attempt and not failed; nothing to do.
	CaseRunning Case = "running"
	// CaseDrift: running another attempt than the desire; stop at generation 2.
	CaseDrift Case = "drift"
	// CaseUndesired: running with no desire; stop at generation 2.
	CaseUndesired Case = "undesired"
	// CaseFailedElapsed: the desired attempt failed and its backoff elapsed; stop at generation 2.
	CaseFailedElapsed Case = "failed-elapsed"
	// CaseFailedWaiting: the desired attempt failed and its backoff is pending; wait.
	CaseFailedWaiting Case = "failed-waiting"
	// CaseStopReceiptPending: stopped without the node's stop receipt; wait.
	CaseStopReceiptPending Case = "stop-receipt-pending"
	// CaseRemove: stopped with its receipt; remove at generation 3.
	CaseRemove Case = "remove"
	// CaseRemoveReceiptPending: removed without its second receipt; wait.
	CaseRemoveReceiptPending Case = "remove-receipt-pending"
	// CaseReplacementInFlight: drifted while another slot of the service is being replaced; wait.
	CaseReplacementInFlight Case = "replacement-in-flight"
	// CaseStartHeld: a run would be admitted (first or successor), but the rollout's bounds or
	// its pause hold it back this sweep ([Input.StartHeld]); wait.
	CaseStartHeld Case = "start-held"
	// CaseInvalid: the slot row breaks an invariant (a generation outside 1..3, or a receipt for a
	// generation never committed); nothing is committed and the verdict names slot-invalid.
	CaseInvalid Case = "invalid"
)

// AllCases returns every case in table order, in a new slice.
func AllCases() []Case {
	return []Case{CaseAbsent, CaseAdmitRunFirst, CaseAdmitRunSuccessor, CaseSettled, CaseRunning,
		CaseDrift, CaseUndesired, CaseFailedElapsed, CaseFailedWaiting, CaseStopReceiptPending, CaseRemove,
		CaseRemoveReceiptPending, CaseReplacementInFlight, CaseStartHeld, CaseInvalid}
}

// Step is what a decision asks the caller to commit.
type Step string

// Steps.
const (
	StepNone   Step = "none"   // nothing to commit
	StepRun    Step = "run"    // commit a new attempt at generation 1
	StepStop   Step = "stop"   // commit generation 2 for the incumbent
	StepRemove Step = "remove" // commit generation 3 for the incumbent
	StepWait   Step = "wait"   // nothing to commit yet; Decision.Wait says why
)

// Input is everything [DecideSlotTransition] reads about one slot. The caller builds it from one
// consistent read of the slot row, the service's desire and the service's other slots.
type Input struct {
	// Slot is the slot's state; the zero Slot is "no slot".
	Slot Slot
	// Desired reports whether the service desires this slot to run; false for an empty desire
	// (hold, deletion, no placement) and for a replica outside the desired set.
	Desired bool
	// DesiredKey is the [DesiredAttemptKey] for this slot; read only when Desired.
	DesiredKey string
	// ReplacementInFlight reports whether the service's rollout holds this slot's replacement
	// back this sweep (its bounds are spent, or it is paused: [PlanService]); it holds back
	// drift only.
	ReplacementInFlight bool
	// StartHeld reports whether the service's rollout holds back a run of this slot this sweep
	// (too many replicas running for its surge bound, or its rollout paused); it holds back
	// admissions only.
	StartHeld bool
	// Now is the core's clock at the decision, compared with Observation.AcceptedAt.
	Now time.Time
}

// Decision is the outcome of [DecideSlotTransition] for one slot.
type Decision struct {
	Case Case
	Step Step
	// Generation is the generation to commit: GenRun for StepRun, GenStop for StepStop, GenRemove
	// for StepRemove, GenNone otherwise.
	Generation Generation
	// Key is the attempt key of the run to admit (StepRun only).
	Key string
	// Predecessor is the removed attempt the run succeeds (CaseAdmitRunSuccessor only).
	Predecessor string
	// Restarts is n of the failure backoff (CaseFailedElapsed and CaseFailedWaiting only).
	Restarts int
	// RetryAt is when the failure backoff elapses (CaseFailedElapsed and CaseFailedWaiting only).
	RetryAt time.Time
}

// Acts reports whether the decision commits something (a run, a stop or a removal).
func (d Decision) Acts() bool {
	return d.Step == StepRun || d.Step == StepStop || d.Step == StepRemove
}

// NeedsBuild reports whether the decision's step has a desire behind it: a run, or a stop that is
// the first step of a replacement (drift, failed-elapsed). Such steps are withheld while the
// service's new work cannot be built; stops of unwanted slots and removals never are.
func (d Decision) NeedsBuild() bool {
	switch d.Case {
	case CaseAdmitRunFirst, CaseAdmitRunSuccessor, CaseDrift, CaseFailedElapsed:
		return true
	}
	return false
}

// DecideSlotTransition returns the one decision the table gives for in (docs/reconciliation.md
// section 3). It is pure, total and deterministic: it reads nothing but in, never panics, and
// equal inputs give equal decisions. Rules, in order:
//
//  1. no slot: admit-run-first with a desire (start-held while the rollout holds starts back),
//     absent without;
//  2. a generation outside 1..3 or a receipt above it: invalid;
//  3. removed (3): remove-receipt-pending until both receipts, then admit-run-successor with a
//     desire (start-held while the rollout holds starts back) and settled without;
//  4. stopped (2): stop-receipt-pending until its receipt, then remove;
//  5. run (1): undesired without a desire; drift (or replacement-in-flight while the rollout
//     holds the replacement back) at another key; failed-elapsed or failed-waiting when the node reported the
//     run failed or stopped on its own, by the backoff; running otherwise.
func DecideSlotTransition(in Input) Decision {
	s := in.Slot
	if !s.Exists {
		if in.Desired && in.StartHeld {
			return Decision{Case: CaseStartHeld, Step: StepWait}
		}
		if in.Desired {
			return Decision{Case: CaseAdmitRunFirst, Step: StepRun, Generation: GenRun, Key: in.DesiredKey}
		}
		return Decision{Case: CaseAbsent, Step: StepNone}
	}
	if s.Generation < GenRun || s.Generation > GenRemove || s.Acked < GenNone || s.Acked > s.Generation {
		return Decision{Case: CaseInvalid, Step: StepWait}
	}
	switch s.Generation {
	case GenRemove:
		if s.Acked < GenRemove {
			return Decision{Case: CaseRemoveReceiptPending, Step: StepWait}
		}
		if in.Desired && in.StartHeld {
			return Decision{Case: CaseStartHeld, Step: StepWait}
		}
		if in.Desired {
			return Decision{Case: CaseAdmitRunSuccessor, Step: StepRun, Generation: GenRun, Key: in.DesiredKey, Predecessor: s.Attempt.ID}
		}
		return Decision{Case: CaseSettled, Step: StepNone}
	case GenStop:
		if s.Acked < GenStop {
			return Decision{Case: CaseStopReceiptPending, Step: StepWait}
		}
		return Decision{Case: CaseRemove, Step: StepRemove, Generation: GenRemove}
	}
	// GenRun.
	if !in.Desired {
		return Decision{Case: CaseUndesired, Step: StepStop, Generation: GenStop}
	}
	if s.Attempt.Key != in.DesiredKey {
		if in.ReplacementInFlight {
			return Decision{Case: CaseReplacementInFlight, Step: StepWait}
		}
		return Decision{Case: CaseDrift, Step: StepStop, Generation: GenStop}
	}
	if s.Observed.Phase == PhaseFailed || s.Observed.Phase == PhaseStopped {
		n := RestartsOfDesire(s.Ancestors, in.DesiredKey)
		at := s.Observed.AcceptedAt.Add(Backoff(n))
		if in.Now.Before(at) {
			return Decision{Case: CaseFailedWaiting, Step: StepWait, Restarts: n, RetryAt: at}
		}
		return Decision{Case: CaseFailedElapsed, Step: StepStop, Generation: GenStop, Restarts: n, RetryAt: at}
	}
	return Decision{Case: CaseRunning, Step: StepNone}
}
