package slots

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	keyA = "sha256:aaaa"
	keyB = "sha256:bbbb"
)

// running returns a slot at generation run of key, observed with phase and ready.
func running(key string, phase Phase, ready bool) Slot {
	return Slot{Exists: true, Replica: "0", NodeID: "nod_1", Attempt: Attempt{ID: "att_cur", Key: key, Predecessor: "att_prev"},
		Generation: GenRun, Acked: GenRun, Observed: Observation{Phase: phase, Ready: ready, AcceptedAt: t0}}
}

func at(g, acked Generation) Slot {
	s := running(keyA, PhaseStopped, false)
	s.Generation, s.Acked = g, acked
	return s
}

func TestDecideSlotTransitionTable(t *testing.T) {
	t.Parallel()
	failed := running(keyA, PhaseFailed, false)
	exited := running(keyA, PhaseStopped, false)
	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		{"absent", Input{Now: t0}, Decision{Case: CaseAbsent, Step: StepNone}},
		{"admit-run-first", Input{Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseAdmitRunFirst, Step: StepRun, Generation: GenRun, Key: keyA}},
		{"admit-run-first ignores replacement in flight", Input{Desired: true, DesiredKey: keyA, ReplacementInFlight: true, Now: t0},
			Decision{Case: CaseAdmitRunFirst, Step: StepRun, Generation: GenRun, Key: keyA}},
		{"admit-run-successor", Input{Slot: at(GenRemove, GenRemove), Desired: true, DesiredKey: keyB, Now: t0},
			Decision{Case: CaseAdmitRunSuccessor, Step: StepRun, Generation: GenRun, Key: keyB, Predecessor: "att_cur"}},
		{"settled", Input{Slot: at(GenRemove, GenRemove), Now: t0}, Decision{Case: CaseSettled, Step: StepNone}},
		{"start-held: first run", Input{Desired: true, DesiredKey: keyA, StartHeld: true, Now: t0},
			Decision{Case: CaseStartHeld, Step: StepWait}},
		{"start-held: successor", Input{Slot: at(GenRemove, GenRemove), Desired: true, DesiredKey: keyB, StartHeld: true, Now: t0},
			Decision{Case: CaseStartHeld, Step: StepWait}},
		{"start-held holds back no stop", Input{Slot: running(keyA, PhaseRunning, true), StartHeld: true, Now: t0},
			Decision{Case: CaseUndesired, Step: StepStop, Generation: GenStop}},
		{"running", Input{Slot: running(keyA, PhaseRunning, true), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseRunning, Step: StepNone}},
		{"running before any observation", Input{Slot: running(keyA, PhaseNone, false), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseRunning, Step: StepNone}},
		{"drift", Input{Slot: running(keyA, PhaseRunning, true), Desired: true, DesiredKey: keyB, Now: t0},
			Decision{Case: CaseDrift, Step: StepStop, Generation: GenStop}},
		{"drift of a failed slot skips its backoff", Input{Slot: failed, Desired: true, DesiredKey: keyB, Now: t0},
			Decision{Case: CaseDrift, Step: StepStop, Generation: GenStop}},
		{"undesired", Input{Slot: running(keyA, PhaseRunning, true), Now: t0},
			Decision{Case: CaseUndesired, Step: StepStop, Generation: GenStop}},
		{"undesired failed slot stops without backoff", Input{Slot: failed, Now: t0},
			Decision{Case: CaseUndesired, Step: StepStop, Generation: GenStop}},
		{"undesired ignores replacement in flight", Input{Slot: running(keyA, PhaseRunning, true), ReplacementInFlight: true, Now: t0},
			Decision{Case: CaseUndesired, Step: StepStop, Generation: GenStop}},
		{"failed-waiting", Input{Slot: failed, Desired: true, DesiredKey: keyA, Now: t0.Add(9 * time.Second)},
			Decision{Case: CaseFailedWaiting, Step: StepWait, RetryAt: t0.Add(10 * time.Second)}},
		{"failed-elapsed", Input{Slot: failed, Desired: true, DesiredKey: keyA, Now: t0.Add(10 * time.Second)},
			Decision{Case: CaseFailedElapsed, Step: StepStop, Generation: GenStop, RetryAt: t0.Add(10 * time.Second)}},
		{"stopped on its own counts as failed", Input{Slot: exited, Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseFailedWaiting, Step: StepWait, RetryAt: t0.Add(10 * time.Second)}},
		{"stop-receipt-pending", Input{Slot: at(GenStop, GenRun), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseStopReceiptPending, Step: StepWait}},
		{"stop-receipt-pending without desire", Input{Slot: at(GenStop, GenNone), Now: t0},
			Decision{Case: CaseStopReceiptPending, Step: StepWait}},
		{"remove", Input{Slot: at(GenStop, GenStop), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseRemove, Step: StepRemove, Generation: GenRemove}},
		{"remove without desire", Input{Slot: at(GenStop, GenStop), Now: t0},
			Decision{Case: CaseRemove, Step: StepRemove, Generation: GenRemove}},
		{"remove-receipt-pending", Input{Slot: at(GenRemove, GenStop), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseRemoveReceiptPending, Step: StepWait}},
		{"remove-receipt-pending without any receipt", Input{Slot: at(GenRemove, GenNone), Now: t0},
			Decision{Case: CaseRemoveReceiptPending, Step: StepWait}},
		{"replacement-in-flight", Input{Slot: running(keyA, PhaseRunning, true), Desired: true, DesiredKey: keyB, ReplacementInFlight: true, Now: t0},
			Decision{Case: CaseReplacementInFlight, Step: StepWait}},
		{"invalid generation", Input{Slot: at(Generation(7), GenNone), Desired: true, DesiredKey: keyA, Now: t0},
			Decision{Case: CaseInvalid, Step: StepWait}},
		{"invalid zero generation", Input{Slot: at(GenNone, GenNone), Now: t0}, Decision{Case: CaseInvalid, Step: StepWait}},
		{"invalid receipt above generation", Input{Slot: at(GenRun, GenStop), Now: t0}, Decision{Case: CaseInvalid, Step: StepWait}},
	}
	seen := map[Case]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideSlotTransition(tc.in)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
		seen[tc.want.Case] = true
	}
	for _, c := range AllCases() {
		if !seen[c] {
			t.Errorf("case %s has no table row", c)
		}
	}
}

// randomInput draws an input over every field the decision reads, including values outside
// the valid ranges.
func randomInput(r *rand.Rand) Input {
	keys := []string{"", keyA, keyB}
	phases := []Phase{PhaseNone, PhaseStarting, PhaseRunning, PhaseFailed, PhaseStopped, "weird"}
	in := Input{
		Desired:             r.IntN(2) == 0,
		DesiredKey:          keys[r.IntN(len(keys))],
		ReplacementInFlight: r.IntN(2) == 0,
		StartHeld:           r.IntN(4) == 0,
		Now:                 t0.Add(time.Duration(r.Int64N(int64(30*time.Minute))) - 5*time.Minute),
	}
	if r.IntN(6) == 0 {
		return in
	}
	s := Slot{Exists: true, Replica: "0", NodeID: "nod_1",
		Attempt:    Attempt{ID: "att_x", Key: keys[r.IntN(len(keys))], Predecessor: keys[r.IntN(len(keys))]},
		Generation: Generation(r.IntN(6) - 1), Acked: Generation(r.IntN(6) - 1),
		Observed: Observation{Phase: phases[r.IntN(len(phases))], Ready: r.IntN(2) == 0,
			AcceptedAt: t0.Add(time.Duration(r.Int64N(int64(10 * time.Minute))))}}
	for range r.IntN(12) {
		s.Ancestors = append(s.Ancestors, Attempt{ID: "att_a", Key: keys[r.IntN(len(keys))]})
	}
	in.Slot = s
	return in
}

func TestDecideSlotTransitionTotalAndDeterministic(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	counts := map[Case]int{}
	for i := 0; i < 50_000; i++ {
		in := randomInput(r)
		a := DecideSlotTransition(in)
		b := DecideSlotTransition(in)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("input %+v decided twice differently:\n%s", in, diff)
		}
		if !slices.Contains(AllCases(), a.Case) {
			t.Fatalf("input %+v: unnamed case %q", in, a.Case)
		}
		counts[a.Case]++
		// The step and the generation agree with the case.
		switch a.Step {
		case StepRun:
			if a.Generation != GenRun || (in.Slot.Exists && in.Slot.Generation != GenRemove) {
				t.Fatalf("input %+v: run %+v", in, a)
			}
		case StepStop:
			if a.Generation != GenStop || in.Slot.Generation != GenRun {
				t.Fatalf("input %+v: stop %+v", in, a)
			}
		case StepRemove:
			if a.Generation != GenRemove || in.Slot.Generation != GenStop || in.Slot.Acked != GenStop {
				t.Fatalf("input %+v: remove %+v", in, a)
			}
		case StepNone, StepWait:
			if a.Generation != GenNone {
				t.Fatalf("input %+v: %+v", in, a)
			}
		default:
			t.Fatalf("input %+v: unknown step %q", in, a.Step)
		}
		// A run always has the desire behind it, and no run happens without one.
		if (a.Step == StepRun) && !in.Desired {
			t.Fatalf("input %+v: run without desire", in)
		}
	}
	for _, c := range AllCases() {
		if counts[c] == 0 {
			t.Errorf("case %s never reached by the random inputs", c)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second,
		320 * time.Second, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for n, w := range want {
		if got := Backoff(n); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", n, got, w)
		}
	}
	if Backoff(-1) != BackoffBase || Backoff(1<<40) != BackoffMax {
		t.Errorf("out-of-range n not clamped: %v %v", Backoff(-1), Backoff(1<<40))
	}
}

func TestBackoffAncestry(t *testing.T) {
	t.Parallel()
	// A chain: cur <- a1 <- a2 <- ... each attempt naming its predecessor.
	chain := func(keys ...string) (map[string]Attempt, Attempt) {
		byID := map[string]Attempt{}
		prev := ""
		var last Attempt
		for i := len(keys) - 1; i >= 0; i-- {
			id, err := AttemptID(keys[i], prev)
			if err != nil {
				t.Fatal(err)
			}
			last = Attempt{ID: id, Key: keys[i], Predecessor: prev}
			byID[id] = last
			prev = id
		}
		return byID, last
	}
	tests := []struct {
		name string
		keys []string // newest first; keys[0] is the incumbent
		n    int
	}{
		{"first run", []string{keyA}, 0},
		{"one restart", []string{keyA, keyA}, 1},
		{"stops at another desire", []string{keyA, keyA, keyB, keyA, keyA}, 1},
		{"other desire right behind", []string{keyA, keyB, keyA}, 0},
		{"capped at eight", slices.Repeat([]string{keyA}, 20), 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			byID, cur := chain(tc.keys...)
			anc := Ancestry(byID, cur)
			if len(anc) > MaxAncestors {
				t.Fatalf("ancestry of %d attempts", len(anc))
			}
			n := RestartsOfDesire(anc, keyA)
			if n != tc.n {
				t.Fatalf("n = %d, want %d", n, tc.n)
			}
			s := running(keyA, PhaseFailed, false)
			s.Attempt, s.Ancestors = cur, anc
			d := DecideSlotTransition(Input{Slot: s, Desired: true, DesiredKey: keyA, Now: t0})
			if d.Case != CaseFailedWaiting || d.Restarts != tc.n || !d.RetryAt.Equal(t0.Add(Backoff(tc.n))) {
				t.Fatalf("decision %+v, want failed-waiting until %v", d, t0.Add(Backoff(tc.n)))
			}
			if d := DecideSlotTransition(Input{Slot: s, Desired: true, DesiredKey: keyA, Now: t0.Add(Backoff(tc.n))}); d.Case != CaseFailedElapsed {
				t.Fatalf("at the backoff's end: %s", d.Case)
			}
		})
	}
	// A corrupt chain that loops ends.
	loop := map[string]Attempt{"a": {ID: "a", Key: keyA, Predecessor: "b"}, "b": {ID: "b", Key: keyA, Predecessor: "a"}}
	if got := Ancestry(loop, Attempt{ID: "c", Key: keyA, Predecessor: "a"}); len(got) != 2 {
		t.Fatalf("looping chain: %d ancestors", len(got))
	}
}

func TestCheckCommit(t *testing.T) {
	t.Parallel()
	planned := Input{Slot: running(keyA, PhaseRunning, true), Desired: true, DesiredKey: keyB, Now: t0}
	made := DecideSlotTransition(planned)
	if made.Case != CaseDrift {
		t.Fatalf("planned %s", made.Case)
	}
	if _, err := CheckCommit(made, planned); err != nil {
		t.Fatalf("unchanged inputs: %v", err)
	}
	// The operator edited the spec back: the slot now runs its desire.
	back := planned
	back.DesiredKey = keyA
	if got, err := CheckCommit(made, back); !errors.Is(err, ErrConflict) || got.Case != CaseRunning {
		t.Fatalf("case moved: %s, %v", got.Case, err)
	}
	// Another slot started replacing meanwhile.
	busy := planned
	busy.ReplacementInFlight = true
	if _, err := CheckCommit(made, busy); !errors.Is(err, ErrConflict) {
		t.Fatalf("replacement started meanwhile: %v", err)
	}
	// A run whose key moved (same case) conflicts too.
	first := Input{Desired: true, DesiredKey: keyA, Now: t0}
	run := DecideSlotTransition(first)
	moved := first
	moved.DesiredKey = keyB
	if got, err := CheckCommit(run, moved); !errors.Is(err, ErrConflict) || got.Case != CaseAdmitRunFirst {
		t.Fatalf("key moved: %s, %v", got.Case, err)
	}
	// A decision that commits nothing is never committed.
	idle := Input{Slot: running(keyA, PhaseRunning, true), Desired: true, DesiredKey: keyA, Now: t0}
	if _, err := CheckCommit(DecideSlotTransition(idle), idle); !errors.Is(err, ErrConflict) {
		t.Fatalf("commit of a running slot: %v", err)
	}
}
