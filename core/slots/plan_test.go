package slots

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// world is an in-memory stand-in for the store rows a sweep reads and the node's receipts and
// observations, so scenarios run the planner the way the reconciler does.
type world struct {
	t        *testing.T
	slots    map[string]*Slot
	attempts map[string]Attempt
	now      time.Time
	blocker  *Blocker
	rollout  Rollout
	verdicts []Verdict // every verdict written, only when changed
}

func newWorld(t *testing.T) *world {
	return &world{t: t, slots: map[string]*Slot{}, attempts: map[string]Attempt{}, now: t0}
}

func desireOf(key string, replicas ...string) []DesiredSlot {
	out := make([]DesiredSlot, len(replicas))
	for i, r := range replicas {
		out[i] = DesiredSlot{Replica: r, NodeID: "nod_1", Key: key}
	}
	return out
}

func (w *world) input(desired []DesiredSlot) ServiceInput {
	in := ServiceInput{SpecRevision: 1, Desired: desired, Blocker: w.blocker, Rollout: w.rollout, Now: w.now}
	for _, s := range w.slots {
		in.Slots = append(in.Slots, *s)
	}
	return in
}

// sweep plans, commits every committing slot after re-checking it against a fresh read, and
// records the verdict when it changed.
func (w *world) sweep(desired []DesiredSlot) Plan {
	w.t.Helper()
	p := PlanService(w.input(desired))
	for _, sp := range p.Slots {
		if !sp.Commits() {
			continue
		}
		// The commit re-reads and re-decides; earlier commits of this sweep are in the fresh read.
		for _, f := range PlanService(w.input(desired)).Slots {
			if f.Replica != sp.Replica {
				continue
			}
			if _, err := CheckCommit(sp.Decision, f.Input); err != nil {
				w.t.Fatalf("commit of slot %s: %v", sp.Replica, err)
			}
		}
		w.apply(sp)
	}
	var prev *Verdict
	if n := len(w.verdicts); n > 0 {
		prev = &w.verdicts[n-1]
	}
	if VerdictChanged(prev, p.Verdict) {
		w.verdicts = append(w.verdicts, p.Verdict)
	}
	return p
}

func (w *world) apply(sp SlotPlan) {
	d := sp.Decision
	switch d.Step {
	case StepRun:
		id, err := AttemptID(d.Key, d.Predecessor)
		if err != nil {
			w.t.Fatal(err)
		}
		a := Attempt{ID: id, Key: d.Key, Predecessor: d.Predecessor}
		w.attempts[id] = a
		w.slots[sp.Replica] = &Slot{Exists: true, Replica: sp.Replica, NodeID: sp.NodeID, Attempt: a, Generation: GenRun,
			Ancestors: Ancestry(w.attempts, a)}
	case StepStop, StepRemove:
		w.slots[sp.Replica].Generation = d.Generation
	default:
		w.t.Fatalf("apply %+v", d)
	}
}

// node acknowledges every committed generation and reports runs with phase and ready.
func (w *world) node(phase Phase, ready bool, replicas ...string) {
	for _, r := range replicas {
		s := w.slots[r]
		s.Acked = s.Generation
		if s.Generation == GenRun {
			s.Observed = Observation{Phase: phase, Ready: ready, EverReady: ready || s.Observed.EverReady, AcceptedAt: w.now}
		}
	}
}

func (w *world) ackAll() {
	for _, s := range w.slots {
		s.Acked = s.Generation
	}
}

func cases(p Plan) map[string]Case {
	out := map[string]Case{}
	for _, s := range p.Slots {
		out[s.Replica] = s.Decision.Case
	}
	return out
}

func wantCases(t *testing.T, p Plan, want map[string]Case) {
	t.Helper()
	got := cases(p)
	for r, c := range want {
		if got[r] != c {
			t.Fatalf("slot %s: %s, want %s (all: %v)", r, got[r], c, got)
		}
	}
}

// converge runs a service with keyA on replicas until converged.
func (w *world) converge(key string, replicas ...string) {
	w.t.Helper()
	for i := 0; i < 20; i++ {
		p := w.sweep(desireOf(key, replicas...))
		if p.Verdict.State == Converged {
			return
		}
		for r, s := range w.slots {
			if s.Generation == GenRun && s.Attempt.Key == key {
				w.node(PhaseRunning, true, r)
			}
		}
		w.ackAll()
	}
	w.t.Fatalf("not converged: %v", w.verdicts)
}

func TestDriftReplacesOneSlotAtATimeAndWaitsForReadiness(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rs := []string{"0", "1", "2"}
	w.converge(keyA, rs...)
	for i, r := range rs {
		// One drift at a time: this slot stops, the later ones wait.
		p := w.sweep(desireOf(keyB, rs...))
		want := map[string]Case{r: CaseDrift}
		for _, o := range rs[i+1:] {
			want[o] = CaseReplacementInFlight
		}
		wantCases(t, p, want)
		if p.Verdict.State != Converging {
			t.Fatalf("verdict %v", p.Verdict)
		}
		// Until the stop receipt, the others keep waiting.
		wantCases(t, w.sweep(desireOf(keyB, rs...)), map[string]Case{r: CaseStopReceiptPending})
		w.node("", false, r)
		wantCases(t, w.sweep(desireOf(keyB, rs...)), map[string]Case{r: CaseRemove})
		w.node("", false, r)
		wantCases(t, w.sweep(desireOf(keyB, rs...)), map[string]Case{r: CaseAdmitRunSuccessor})
		// The successor runs but is not ready yet: the next drift still waits.
		w.node(PhaseRunning, false, r)
		p = w.sweep(desireOf(keyB, rs...))
		wantCases(t, p, map[string]Case{r: CaseRunning})
		for _, o := range rs[i+1:] {
			wantCases(t, p, map[string]Case{o: CaseReplacementInFlight})
		}
		w.node(PhaseRunning, true, r)
	}
	if p := w.sweep(desireOf(keyB, rs...)); p.Verdict.State != Converged {
		t.Fatalf("after the rollout: %v", p.Verdict)
	}
}

func TestRolloutOfCrashingReleaseBacksOffAndUndoRecovers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rs := []string{"0", "1", "2"}
	w.converge(keyA, rs...)
	// Roll to keyB: slot 0 is replaced, and its successor crashes on start.
	w.sweep(desireOf(keyB, rs...))
	w.ackAll()
	w.sweep(desireOf(keyB, rs...))
	w.ackAll()
	w.sweep(desireOf(keyB, rs...))
	for restart := 0; restart < 3; restart++ {
		w.node(PhaseFailed, false, "0")
		p := w.sweep(desireOf(keyB, rs...))
		wantCases(t, p, map[string]Case{"0": CaseFailedWaiting, "1": CaseReplacementInFlight, "2": CaseReplacementInFlight})
		if p.Verdict != (Verdict{SpecRevision: 1, State: Waiting, Reason: ReasonFailureBackoff}) {
			t.Fatalf("verdict %v", p.Verdict)
		}
		if want := w.now.Add(Backoff(restart)); !p.WakeAt.Equal(want) {
			t.Fatalf("restart %d: wake at %v, want %v", restart, p.WakeAt, want)
		}
		// The old replicas keep running keyA throughout.
		for _, r := range []string{"1", "2"} {
			if s := w.slots[r]; s.Generation != GenRun || s.Attempt.Key != keyA {
				t.Fatalf("slot %s left its release: %+v", r, s)
			}
		}
		w.now = p.WakeAt
		wantCases(t, w.sweep(desireOf(keyB, rs...)), map[string]Case{"0": CaseFailedElapsed})
		w.ackAll()
		w.sweep(desireOf(keyB, rs...)) // remove
		w.ackAll()
		wantCases(t, w.sweep(desireOf(keyB, rs...)), map[string]Case{"0": CaseAdmitRunSuccessor})
		if n := RestartsOfDesire(w.slots["0"].Ancestors, keyB); n != restart+1 {
			t.Fatalf("restart %d: n = %d", restart, n)
		}
	}
	// Undo: the desire is keyA again. The failing slot drifts at once (no backoff, and it is
	// the replacement in flight itself); the others already run the desire.
	w.node(PhaseFailed, false, "0")
	p := w.sweep(desireOf(keyA, rs...))
	wantCases(t, p, map[string]Case{"0": CaseDrift, "1": CaseRunning, "2": CaseRunning})
	w.converge(keyA, rs...)
	if n := RestartsOfDesire(w.slots["0"].Ancestors, keyA); n != 0 {
		t.Fatalf("after undo: n = %d, want 0 (the chain ran keyB last)", n)
	}
}

func TestDeletionDuringRolloutStopsAllAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rs := []string{"0", "1", "2"}
	w.converge(keyA, rs...)
	w.sweep(desireOf(keyB, rs...)) // slot 0 stops for the rollout
	if SettlementPending(w.input(nil).Slots) != ReasonSlotSettlementPending {
		t.Fatal("settlement not pending")
	}
	// Deleting: the desire is empty, so every running slot stops in this one sweep, while
	// slot 0 still waits for its stop receipt.
	p := w.sweep(nil)
	wantCases(t, p, map[string]Case{"0": CaseStopReceiptPending, "1": CaseUndesired, "2": CaseUndesired})
	w.ackAll()
	wantCases(t, w.sweep(nil), map[string]Case{"0": CaseRemove, "1": CaseRemove, "2": CaseRemove})
	if SettlementPending(w.input(nil).Slots) == "" {
		t.Fatal("settled before the remove receipts")
	}
	w.ackAll()
	p = w.sweep(nil)
	wantCases(t, p, map[string]Case{"0": CaseSettled, "1": CaseSettled, "2": CaseSettled})
	if p.Verdict.State != Converged || SettlementPending(w.input(nil).Slots) != "" {
		t.Fatalf("verdict %v, settlement %q", p.Verdict, SettlementPending(w.input(nil).Slots))
	}
}

func TestBlockerNeverHoldsStopsOrRemovals(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.converge(keyA, "0", "1", "2")
	w.blocker = &Blocker{Refused: true, Reason: ReasonReleaseMissing}
	// Scale down to one replica and move it to keyB: the drift of 0 is withheld (its successor
	// cannot be built), the unwanted 1 and 2 stop anyway.
	p := w.sweep(desireOf(keyB, "0"))
	for _, sp := range p.Slots {
		switch sp.Replica {
		case "0":
			if sp.Decision.Case != CaseDrift || !sp.Withheld || sp.Commits() {
				t.Fatalf("slot 0: %+v", sp)
			}
		default:
			if sp.Decision.Case != CaseUndesired || !sp.Commits() {
				t.Fatalf("slot %s: %+v", sp.Replica, sp)
			}
		}
	}
	if p.Verdict != (Verdict{SpecRevision: 1, State: Refused, Reason: ReasonReleaseMissing}) {
		t.Fatalf("verdict %v", p.Verdict)
	}
	w.ackAll()
	wantCases(t, w.sweep(desireOf(keyB, "0")), map[string]Case{"0": CaseDrift, "1": CaseRemove, "2": CaseRemove})
	if w.slots["0"].Generation != GenRun {
		t.Fatal("withheld drift committed")
	}
	// A wait of the build is a waiting verdict; once it clears, the rollout proceeds.
	w.blocker = &Blocker{Reason: "bindings-pending"}
	if p := w.sweep(desireOf(keyB, "0")); p.Verdict.State != Waiting || p.Verdict.Reason != "bindings-pending" {
		t.Fatalf("verdict %v", p.Verdict)
	}
	w.blocker = nil
	w.converge(keyB, "0")
}

func TestVerdictTransitionsWrittenOnlyWhenChanged(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.sweep(desireOf(keyA, "0"))     // admit
	w.sweep(desireOf(keyA, "0"))     // running, not observed: still converging
	w.node(PhaseRunning, false, "0") // running, not ready
	w.sweep(desireOf(keyA, "0"))
	w.node(PhaseFailed, false, "0")
	w.sweep(desireOf(keyA, "0")) // failure-backoff
	w.sweep(desireOf(keyA, "0")) // unchanged
	w.now = w.now.Add(time.Minute)
	w.sweep(desireOf(keyA, "0")) // failed-elapsed: converging
	w.ackAll()
	w.sweep(desireOf(keyA, "0"))
	w.ackAll()
	w.sweep(desireOf(keyA, "0"))
	w.node(PhaseRunning, true, "0")
	w.sweep(desireOf(keyA, "0")) // converged
	w.sweep(desireOf(keyA, "0")) // unchanged
	var got []string
	for _, v := range w.verdicts {
		got = append(got, v.String())
	}
	want := "[converging waiting(failure-backoff) converging converged]"
	if fmt.Sprint(got) != want {
		t.Fatalf("verdicts %v, want %s", got, want)
	}
	if VerdictChanged(&Verdict{SpecRevision: 1, State: Converged}, Verdict{SpecRevision: 2, State: Converged}) != true {
		t.Fatal("a new spec revision is a new verdict")
	}
}

func TestSweepRacingSpecEditConflictsThenConverges(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	rs := []string{"0", "1"}
	w.converge(keyA, rs...)
	// The sweep plans the rollout to keyB ...
	p := PlanService(w.input(desireOf(keyB, rs...)))
	var acting SlotPlan
	for _, sp := range p.Slots {
		if sp.Commits() {
			acting = sp
		}
	}
	if acting.Decision.Case != CaseDrift {
		t.Fatalf("planned %+v", acting)
	}
	// ... and an operator's edit back to keyA commits before the slot's commit re-reads.
	fresh := PlanService(w.input(desireOf(keyA, rs...)))
	var freshIn Input
	for _, sp := range fresh.Slots {
		if sp.Replica == acting.Replica {
			freshIn = sp.Input
		}
	}
	if _, err := CheckCommit(acting.Decision, freshIn); !errors.Is(err, ErrConflict) {
		t.Fatalf("commit after the edit: %v", err)
	}
	// The next sweep reads the edit and is converged at once.
	if p := w.sweep(desireOf(keyA, rs...)); p.Verdict.State != Converged {
		t.Fatalf("next sweep: %v", p.Verdict)
	}
}

func TestPlanServiceEdges(t *testing.T) {
	t.Parallel()
	// Too many slots decide nothing.
	var in ServiceInput
	for i := 0; i <= MaxSlots; i++ {
		in.Slots = append(in.Slots, Slot{Exists: true, Replica: fmt.Sprint(i), Generation: GenRun})
	}
	if p := PlanService(in); p.Verdict.Reason != ReasonReplicaLimit || len(p.Slots) != 0 {
		t.Fatalf("replica limit: %v, %d slots", p.Verdict, len(p.Slots))
	}
	// An invalid slot refuses the service; the desire's own refusal and unplaced replicas show.
	if p := PlanService(ServiceInput{Slots: []Slot{{Exists: true, Replica: "0", Generation: 9}}}); p.Verdict.Reason != ReasonSlotInvalid {
		t.Fatalf("invalid slot: %v", p.Verdict)
	}
	if p := PlanService(ServiceInput{Refused: ReasonNoEligibleNode}); p.Verdict.State != Refused {
		t.Fatalf("no eligible node: %v", p.Verdict)
	}
	if p := PlanService(ServiceInput{Unplaced: 1}); p.Verdict.State != Converging {
		t.Fatalf("unplaced: %v", p.Verdict)
	}
	// Replicas come out in replica order, whatever the input order.
	p := PlanService(ServiceInput{Desired: desireOf(keyA, "10", "2", "n1.1", "n1.0", "1")})
	var order []string
	for _, s := range p.Slots {
		order = append(order, s.Replica)
	}
	if fmt.Sprint(order) != "[1 2 10 n1.0 n1.1]" {
		t.Fatalf("order %v", order)
	}
	// A running slot desired on another node is stopped there; its successor runs on the new node.
	w := newWorld(t)
	w.converge(keyA, "0")
	moved := []DesiredSlot{{Replica: "0", NodeID: "nod_2", Key: keyA}}
	wantCases(t, w.sweep(moved), map[string]Case{"0": CaseUndesired})
	w.ackAll()
	w.sweep(moved)
	w.ackAll()
	wantCases(t, w.sweep(moved), map[string]Case{"0": CaseAdmitRunSuccessor})
	if w.slots["0"].NodeID != "nod_2" {
		t.Fatalf("successor on %s", w.slots["0"].NodeID)
	}
}

func TestConflictVerdict(t *testing.T) {
	t.Parallel()
	if got := ConflictVerdict(Verdict{SpecRevision: 3, State: Converging}); got.String() != "waiting(conflict)" || got.SpecRevision != 3 {
		t.Fatalf("got %v", got)
	}
	refused := Verdict{SpecRevision: 3, State: Refused, Reason: ReasonNoEligibleNode}
	if got := ConflictVerdict(refused); got != refused {
		t.Fatalf("got %v", got)
	}
}
