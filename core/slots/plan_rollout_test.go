package slots

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func replicas(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}

// TestSurgeStartsTheSuccessorBeforeStoppingTheIncumbent: one replica under the default bounds
// (surge 1, unavailable 0) starts its successor beside the incumbent, keeps the incumbent
// running until the successor is ready, and only then stops it.
func TestSurgeStartsTheSuccessorBeforeStoppingTheIncumbent(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.rollout = ResolveRollout(nil, 1, false, false)
	w.converge(keyA, "0")
	p := w.sweep(desireOf(keyB, "0"))
	wantCases(t, p, map[string]Case{"0": CaseRunning, "0~": CaseAdmitRunFirst})
	if !p.Slots[0].Held || p.Verdict.State != Converging {
		t.Fatalf("incumbent held %v, verdict %v", p.Slots[0].Held, p.Verdict)
	}
	w.node(PhaseStarting, false, "0~")
	p = w.sweep(desireOf(keyB, "0"))
	wantCases(t, p, map[string]Case{"0": CaseRunning, "0~": CaseRunning})
	w.node(PhaseRunning, true, "0~")
	p = w.sweep(desireOf(keyB, "0"))
	wantCases(t, p, map[string]Case{"0": CaseUndesired, "0~": CaseRunning})
	w.ackAll()
	wantCases(t, w.sweep(desireOf(keyB, "0")), map[string]Case{"0": CaseRemove})
	w.ackAll()
	p = w.sweep(desireOf(keyB, "0"))
	wantCases(t, p, map[string]Case{"0": CaseSettled, "0~": CaseRunning})
	if p.Verdict.State != Converged {
		t.Fatalf("verdict %v, want converged", p.Verdict)
	}
	// The next rollout alternates back to the primary name (its settled row is the free one).
	p = w.sweep(desireOf(keyA, "0"))
	wantCases(t, p, map[string]Case{"0": CaseAdmitRunSuccessor, "0~": CaseRunning})
}

// TestSurgeHoldsWhileTheSuccessorCrashes: a successor that never becomes ready keeps the
// incumbent running and serving, whatever its backoff does.
func TestSurgeHoldsWhileTheSuccessorCrashes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.rollout = ResolveRollout(nil, 1, false, false)
	w.converge(keyA, "0")
	for range 6 {
		w.sweep(desireOf(keyB, "0"))
		if s := w.slots["0~"]; s != nil && s.Generation == GenRun {
			w.node(PhaseFailed, false, "0~")
		}
		w.ackAll()
		w.now = w.now.Add(BackoffMax)
		if s := w.slots["0"]; s.Generation != GenRun || !Ready(*s) {
			t.Fatalf("incumbent %+v, want running and ready", *s)
		}
	}
}

// TestSurgeReplacesAFailedLoneIncumbentInPlace: under the default bounds (surge 1,
// unavailable 0), a lone replica that crash-loops (never ready, so the unavailability bound is
// already overspent) is replaced in place when its desire changes: it stops at once, costing no
// availability, rather than waiting on the bound forever.
func TestSurgeReplacesAFailedLoneIncumbentInPlace(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.rollout = ResolveRollout(nil, 1, false, false)
	w.sweep(desireOf(keyA, "0"))
	w.ackAll()
	w.node(PhaseFailed, false, "0")
	p := w.sweep(desireOf(keyB, "0"))
	wantCases(t, p, map[string]Case{"0": CaseDrift})
	w.ackAll()
	wantCases(t, w.sweep(desireOf(keyB, "0")), map[string]Case{"0": CaseRemove})
	w.ackAll()
	wantCases(t, w.sweep(desireOf(keyB, "0")), map[string]Case{"0": CaseAdmitRunSuccessor})
}

// TestReplicaCountChangeStartsOnlyTheNewReplica: raising replicas from 2 to 3 at the same key
// starts replica 2 and decides nothing for 0 and 1; lowering to 1 stops replica 2 and 1 only.
func TestReplicaCountChangeStartsOnlyTheNewReplica(t *testing.T) {
	t.Parallel()
	for _, ro := range []Rollout{{}, {MaxSurge: 1}, {MaxSurge: 10, MaxUnavailable: 3}} {
		w := newWorld(t)
		w.rollout = ro
		w.converge(keyA, "0", "1")
		p := w.sweep(desireOf(keyA, "0", "1", "2"))
		if diff := cmp.Diff(map[string]Case{"0": CaseRunning, "1": CaseRunning, "2": CaseAdmitRunFirst}, cases(p)); diff != "" {
			t.Fatalf("rollout %+v: scale up (-want +got):\n%s", ro, diff)
		}
		w.converge(keyA, "0", "1", "2")
		p = w.sweep(desireOf(keyA, "0"))
		if diff := cmp.Diff(map[string]Case{"0": CaseRunning, "1": CaseUndesired, "2": CaseUndesired}, cases(p)); diff != "" {
			t.Fatalf("rollout %+v: scale down (-want +got):\n%s", ro, diff)
		}
	}
}

// TestPausedRolloutBeginsNoReplacement: a paused rollout holds every incumbent and waits on
// rollout-paused; a replacement already under way finishes; resuming continues.
func TestPausedRolloutBeginsNoReplacement(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.rollout = Rollout{MaxSurge: 1}
	w.converge(keyA, "0", "1")
	p := w.sweep(desireOf(keyB, "0", "1")) // 0~ starts
	wantCases(t, p, map[string]Case{"0~": CaseAdmitRunFirst, "1": CaseReplacementInFlight})
	w.rollout.Paused = true
	w.node(PhaseRunning, true, "0~")
	p = w.sweep(desireOf(keyB, "0", "1"))
	wantCases(t, p, map[string]Case{"0": CaseUndesired, "0~": CaseRunning, "1": CaseReplacementInFlight})
	if p.Verdict.Reason != ReasonRolloutPaused || p.Verdict.State != Waiting {
		t.Fatalf("verdict %v, want waiting(rollout-paused)", p.Verdict)
	}
	w.ackAll()
	w.sweep(desireOf(keyB, "0", "1"))
	w.ackAll()
	for range 3 {
		p = w.sweep(desireOf(keyB, "0", "1"))
		wantCases(t, p, map[string]Case{"1": CaseReplacementInFlight})
		w.ackAll()
	}
	w.rollout.Paused = false
	wantCases(t, w.sweep(desireOf(keyB, "0", "1")), map[string]Case{"1": CaseRunning, "1~": CaseAdmitRunFirst})
}

// TestRolloutBoundsHoldUntilConverged simulates rollouts of random sizes and bounds against a
// node that acknowledges every step and makes runs ready at random: after every commit, no
// more slots run than desired replicas plus the surge, and once the service was ready no fewer
// replicas are ready than desired minus the unavailability; every rollout converges.
func TestRolloutBoundsHoldUntilConverged(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(21, 22))
	for round := range 300 {
		n := 1 + r.IntN(12)
		ro := Rollout{MaxSurge: r.IntN(4), MaxUnavailable: r.IntN(3)}
		w := newWorld(t)
		w.rollout = ro
		names := replicas(n)
		w.converge(keyA, names...)
		ro = resolved(ro)
		desired := desireOf(keyB, names...)
		if r.IntN(3) == 0 { // some replicas also move node
			for i := range desired {
				if r.IntN(2) == 0 {
					desired[i].NodeID = "nod_2"
				}
			}
		}
		converged := false
		for sweep := 0; sweep < 40*n && !converged; sweep++ {
			p := PlanService(w.input(desired))
			for _, sp := range p.Slots {
				if !sp.Commits() {
					continue
				}
				var fresh SlotPlan
				for _, f := range PlanService(w.input(desired)).Slots {
					if f.Replica == sp.Replica {
						fresh = f
					}
				}
				if _, err := CheckCommit(sp.Decision, fresh.Input); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				w.apply(sp)
				in := w.input(desired)
				state := map[string]Slot{}
				for _, s := range in.Slots {
					state[s.Replica] = s
				}
				running, ready := boundsCount(in, state)
				if running > n+ro.MaxSurge {
					t.Fatalf("round %d (%d replicas, %+v): %d running", round, n, ro, running)
				}
				if ready < n-ro.MaxUnavailable {
					t.Fatalf("round %d (%d replicas, %+v): %d ready after %s of %s", round, n, ro, ready, sp.Decision.Case, sp.Replica)
				}
			}
			converged = p.Verdict.State == Converged
			for _, s := range w.slots {
				s.Acked = s.Generation
				if s.Generation == GenRun && s.Observed.Phase != PhaseRunning && r.IntN(2) == 0 {
					s.Observed = Observation{Phase: PhaseRunning, Ready: true, EverReady: true, AcceptedAt: w.now}
				}
			}
		}
		if !converged {
			t.Fatalf("round %d (%d replicas, %+v): not converged", round, n, ro)
		}
	}
}

func TestRolloutBoundsResolveAndValidate(t *testing.T) {
	t.Parallel()
	pct := func(v int) *Bound { return &Bound{Value: v, Percent: true} }
	cnt := func(v int) *Bound { return &Bound{Value: v} }
	for _, tc := range []struct {
		spec     *RolloutSpec
		replicas int
		stateful bool
		want     Rollout
	}{
		{nil, 3, false, Rollout{MaxSurge: 1}},
		{nil, 1, true, Rollout{MaxUnavailable: 1}},
		{&RolloutSpec{MaxSurge: cnt(10)}, 100, false, Rollout{MaxSurge: 10}},
		{&RolloutSpec{MaxSurge: pct(25), MaxUnavailable: pct(25)}, 10, false, Rollout{MaxSurge: 3, MaxUnavailable: 2}},
		{&RolloutSpec{MaxSurge: pct(10), MaxUnavailable: cnt(0)}, 1, false, Rollout{MaxSurge: 1}},
		{&RolloutSpec{MaxSurge: cnt(0), MaxUnavailable: pct(10)}, 5, false, Rollout{MaxUnavailable: 1}}, // both round to 0
	} {
		if got := ResolveRollout(tc.spec, tc.replicas, tc.stateful, false); got != tc.want {
			t.Errorf("ResolveRollout(%+v, %d, %v) = %+v, want %+v", tc.spec, tc.replicas, tc.stateful, got, tc.want)
		}
	}
	for _, tc := range []struct {
		spec     *RolloutSpec
		stateful bool
		ok       bool
	}{
		{nil, false, true},
		{&RolloutSpec{MaxSurge: pct(100), MaxUnavailable: cnt(256)}, false, true},
		{&RolloutSpec{MaxSurge: cnt(0), MaxUnavailable: cnt(0)}, false, false},
		{&RolloutSpec{MaxSurge: cnt(0)}, false, false}, // unavailable defaults to 0
		{&RolloutSpec{MaxSurge: cnt(-1)}, false, false},
		{&RolloutSpec{MaxSurge: pct(101)}, false, false},
		{&RolloutSpec{MaxUnavailable: cnt(257)}, false, false},
		{&RolloutSpec{MaxSurge: cnt(1)}, true, false},
		{&RolloutSpec{MaxSurge: cnt(0), MaxUnavailable: cnt(1)}, true, true},
	} {
		err := ValidateRollout(tc.spec, tc.stateful)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateRollout(%+v, %v) = %v, want ok %v", tc.spec, tc.stateful, err, tc.ok)
		}
		if err != nil && !errors.Is(err, &Refusal{Reason: ReasonSpecRolloutInvalid}) {
			t.Errorf("ValidateRollout: %v does not name %s", err, ReasonSpecRolloutInvalid)
		}
	}
	for in, want := range map[string]Bound{"3": {Value: 3}, "25%": {Value: 25, Percent: true}, " 0 ": {}} {
		if got, err := ParseBound(in); err != nil || got != want {
			t.Errorf("ParseBound(%q) = %+v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x", "2.5", "%", "10%%", "+1"} {
		if _, err := ParseBound(in); err == nil {
			t.Errorf("ParseBound(%q) accepted", in)
		}
	}
}
