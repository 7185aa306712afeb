package slots

import "testing"

func intp(v int) *int { return &v }

// TestVerdictNamesTheFailure checks that a service whose rollout cannot progress is waiting on
// the failure its slot reported, in the words an operator reads, and that a slot merely not ready
// yet still converges.
func TestVerdictNamesTheFailure(t *testing.T) {
	t.Parallel()
	probe404 := &Failure{Kind: FailureProbe, ProbeURL: "http://127.0.0.1:4100/status/404", ProbeStatus: 404}
	exit2 := &Failure{Kind: FailureExit, ExitCode: intp(2)}
	running := func(key string) Slot {
		return Slot{Exists: true, Replica: "0", NodeID: "nod_1", Attempt: Attempt{ID: "att_1", Key: key},
			Generation: GenRun, Acked: GenRun, Observed: Observation{Phase: PhaseRunning, AcceptedAt: t0}}
	}
	cases := []struct {
		name string
		slot func() Slot
		want Verdict
	}{
		{"probe answers 404", func() Slot {
			s := running(keyA)
			s.Observed.Unhealthy, s.Observed.Failure = true, probe404
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "unhealthy: probe /status/404 -> 404"}},
		{"probe gets no answer", func() Slot {
			s := running(keyA)
			s.Observed.Unhealthy = true
			s.Observed.Failure = &Failure{Kind: FailureProbe, ProbeURL: "http://127.0.0.1:4100/healthz?deep=1"}
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "unhealthy: probe /healthz?deep=1 -> no answer"}},
		{"health not known yet", func() Slot { return running(keyA) }, Verdict{SpecRevision: 1, State: Converging}},
		{"probe failure no longer failing", func() Slot {
			s := running(keyA)
			s.Observed.Failure = probe404 // the node reports it passing again: health is not failing
			s.Observed.Ready = true
			return s
		}, Verdict{SpecRevision: 1, State: Converged}},
		{"exit 2 in backoff", func() Slot {
			s := running(keyA)
			s.Observed.Phase, s.Observed.Failure = PhaseFailed, exit2
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: exit 2"}},
		{"signal in backoff", func() Slot {
			s := running(keyA)
			s.Observed.Phase, s.Observed.Failure = PhaseFailed, &Failure{Kind: FailureSignal, Signal: 9}
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: signal 9"}},
		{"oom in backoff", func() Slot {
			s := running(keyA)
			s.Observed.Phase, s.Observed.Failure = PhaseFailed, &Failure{Kind: FailureOOM, Signal: 9}
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: oom"}},
		{"image in backoff", func() Slot {
			s := running(keyA)
			s.Observed.Phase, s.Observed.Failure = PhaseFailed, &Failure{Kind: FailureImage}
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: ReasonImageUnavailable}},
		{"failed without a failure report", func() Slot {
			s := running(keyA)
			s.Observed.Phase = PhaseFailed
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: ReasonFailureBackoff}},
		{"successor of a failed attempt at the same key", func() Slot {
			s := running(keyA)
			s.Attempt.Predecessor = "att_0"
			s.Observed = Observation{Phase: PhaseStarting, AcceptedAt: t0}
			s.Carried, s.CarriedKey = exit2, keyA
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: exit 2"}},
		{"successor at another key than the failure", func() Slot {
			s := running(keyA)
			s.Attempt.Predecessor = "att_0"
			s.Observed = Observation{Phase: PhaseStarting, AcceptedAt: t0}
			s.Carried, s.CarriedKey = exit2, keyB
			return s
		}, Verdict{SpecRevision: 1, State: Converging}},
		{"failed attempt stopping for its successor", func() Slot {
			s := running(keyA)
			s.Generation, s.Acked = GenStop, GenRun
			s.Observed.Phase, s.Observed.Failure = PhaseFailed, exit2
			return s
		}, Verdict{SpecRevision: 1, State: Waiting, Reason: "crash-loop: exit 2"}},
		{"drifted attempt stopping for a new release", func() Slot {
			s := running(keyB)
			s.Generation, s.Acked = GenStop, GenRun
			s.Observed.Failure = exit2 // it failed once, under the old release
			return s
		}, Verdict{SpecRevision: 1, State: Converging}},
		{"successor ready once", func() Slot {
			s := running(keyA)
			s.Attempt.Predecessor = "att_0"
			s.Observed.EverReady = true
			s.Carried, s.CarriedKey = exit2, keyA
			return s
		}, Verdict{SpecRevision: 1, State: Converging}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := PlanService(ServiceInput{SpecRevision: 1, Desired: desireOf(keyA, "0"), Slots: []Slot{c.slot()}, Now: t0})
			if p.Verdict != c.want {
				t.Fatalf("verdict %s, want %s", p.Verdict, c.want)
			}
		})
	}
}
