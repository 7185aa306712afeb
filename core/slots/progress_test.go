package slots

import (
	"testing"
	"time"
)

// TestProgressDeadline walks a rollout through progress, a stall past its deadline, and a new
// revision, checking the verdict and that the failure is reported exactly once.
func TestProgressDeadline(t *testing.T) {
	t.Parallel()
	waiting := Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: exit 2"}
	step := func(prev *Progress, svcRev int64, ready int, v Verdict, at time.Duration) (Progress, Verdict, bool) {
		return NextProgress(ProgressInput{Prev: prev, ServiceRevision: svcRev, SpecRevision: 1, Ready: ready, Verdict: v,
			Deadline: 10 * time.Second, Now: t0.Add(at)})
	}
	p, v, failed := step(nil, 5, 0, waiting, 0)
	if failed || v != waiting || !p.At.Equal(t0) {
		t.Fatalf("first sweep: %+v %s %v", p, v, failed)
	}
	// One slot became ready at 8 s: the clock moves; at 17 s the deadline has not passed.
	p, _, _ = step(&p, 5, 1, waiting, 8*time.Second)
	if p, v, failed = step(&p, 5, 1, waiting, 17*time.Second); failed || v != waiting {
		t.Fatalf("before the deadline: %+v %s %v", p, v, failed)
	}
	// Fewer ready slots are no progress: at 18 s the deadline passed.
	p, v, failed = step(&p, 5, 0, waiting, 18*time.Second)
	want := Verdict{SpecRevision: 1, State: Refused, Reason: ReasonProgressDeadline}
	if !failed || v != want || !p.Failed {
		t.Fatalf("at the deadline: %+v %s %v", p, v, failed)
	}
	// Failed stays, and is reported once.
	if p, v, failed = step(&p, 5, 0, waiting, 30*time.Second); failed || v != want {
		t.Fatalf("after the deadline: %+v %s %v", p, v, failed)
	}
	// Another refusal stands as it is.
	other := Verdict{SpecRevision: 1, State: Refused, Reason: ReasonReleaseMissing}
	if _, v, _ = step(&p, 5, 0, other, 31*time.Second); v != other {
		t.Fatalf("other refusal: %s", v)
	}
	// A new service revision (a rollback) starts a new clock.
	p, v, failed = step(&p, 6, 0, waiting, 32*time.Second)
	if failed || v != waiting || p.Failed || !p.At.Equal(t0.Add(32*time.Second)) {
		t.Fatalf("new revision: %+v %s %v", p, v, failed)
	}
	// Converged finishes the rollout: no write-worthy change on later sweeps, and a later crash
	// of the same revision is no rollout failure.
	conv := Verdict{SpecRevision: 1, State: Converged}
	if p, v, failed = step(&p, 6, 3, conv, 100*time.Second); failed || v != conv || p.Failed || !p.Done {
		t.Fatalf("converged: %+v %s %v", p, v, failed)
	}
	if again, _, _ := step(&p, 6, 3, conv, 200*time.Second); again != p {
		t.Fatalf("converged again moved the progress: %+v then %+v", p, again)
	}
	if _, v, failed = step(&p, 6, 2, waiting, time.Hour); failed || v != waiting {
		t.Fatalf("crash after converging: %s %v", v, failed)
	}
	// The default deadline applies when none is stated.
	_, v, failed = NextProgress(ProgressInput{ServiceRevision: 7, SpecRevision: 1, Verdict: waiting, Now: t0})
	if failed || v != waiting {
		t.Fatalf("default deadline, first sweep: %s %v", v, failed)
	}
	_, _, failed = NextProgress(ProgressInput{Prev: &Progress{ServiceRevision: 7, SpecRevision: 1, At: t0}, ServiceRevision: 7, SpecRevision: 1,
		Verdict: waiting, Now: t0.Add(DefaultProgressDeadline - time.Second)})
	if failed {
		t.Fatal("failed before the default deadline")
	}
}

// TestProgressDeadlineRunsFromTheRolloutsStart: a rollout written at t0 and first seen by a
// sweep 8 s later fails at t0 + its deadline, not 8 s later; a start after the sweep's time
// (another clock) falls back to the sweep's time.
func TestProgressDeadlineRunsFromTheRolloutsStart(t *testing.T) {
	t.Parallel()
	waiting := Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: exit 2"}
	in := ProgressInput{ServiceRevision: 2, SpecRevision: 1, Verdict: waiting, Deadline: 10 * time.Second, Start: t0, Now: t0.Add(8 * time.Second)}
	p, _, failed := NextProgress(in)
	if failed || !p.At.Equal(t0) {
		t.Fatalf("first sweep 8 s after the rollout's start: %+v %v; want the clock at the start", p, failed)
	}
	in.Prev, in.Now = &p, t0.Add(10*time.Second)
	if _, v, failed := NextProgress(in); !failed || v.Reason != ReasonProgressDeadline {
		t.Fatalf("10 s after the start: %s %v; want refused(progress-deadline)", v, failed)
	}
	in = ProgressInput{ServiceRevision: 2, SpecRevision: 1, Verdict: waiting, Deadline: 10 * time.Second, Start: t0.Add(time.Minute), Now: t0}
	if p, _, _ := NextProgress(in); !p.At.Equal(t0) {
		t.Fatalf("a start after now: clock %v, want now", p.At)
	}
}

// TestPausedRolloutHasNoDeadline: a rollout waiting on its pause is not failed however long it
// stays paused.
func TestPausedRolloutHasNoDeadline(t *testing.T) {
	t.Parallel()
	paused := Verdict{SpecRevision: 1, State: Waiting, Reason: ReasonRolloutPaused}
	p, _, _ := NextProgress(ProgressInput{ServiceRevision: 3, SpecRevision: 1, Verdict: paused, Deadline: 10 * time.Second, Now: t0})
	p, v, failed := NextProgress(ProgressInput{Prev: &p, ServiceRevision: 3, SpecRevision: 1, Verdict: paused, Deadline: 10 * time.Second, Now: t0.Add(time.Hour)})
	if failed || v != paused || p.Failed {
		t.Fatalf("an hour paused: %+v %s %v", p, v, failed)
	}
}
