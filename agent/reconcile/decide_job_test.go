package reconcile

import (
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
)

// jobSpec is spec with a job run marker of retries and timeoutS.
func jobSpec(id string, retries, timeoutS int) node.WorkloadSpec {
	return spec(id, func(s *node.WorkloadSpec) {
		s.Job = &node.JobRun{RunID: "default/nightly@2026-11-29T10:00:00Z", Retries: retries, TimeoutS: timeoutS}
	})
}

func signalled(id string, sig int) *runtime.WorkloadState {
	return &runtime.WorkloadState{WorkloadID: id, State: runtime.StateExited, ExitCode: 128 + sig, ExitedAt: t0}
}

// TestDecideJobAgainstService is the decision table of docs/jobs.md section 7 beside the
// service rows it differs from: a job's workload that exited is recorded (succeeded, retried,
// failed, timed out) where a service's workload that crashed is restarted.
func TestDecideJobAgainstService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec node.WorkloadSpec
		rec  *localstore.Workload
		st   *runtime.WorkloadState
		// kind is the action wanted ("" for none); phase the phase its record gets.
		kind     ActionKind
		phase    Phase
		restarts int
		wakeAt   time.Time
	}{
		{name: "service exit 0 is a crash: restarted after the backoff", spec: spec("wl_a"),
			rec: ptr(rec("wl_a", PhaseRunning)), st: exited("wl_a", 0),
			kind: ActRecord, phase: PhaseCrashed, restarts: 1, wakeAt: t0.Add(time.Second)},
		{name: "service non-zero exit is a crash: restarted after the backoff", spec: spec("wl_a"),
			rec: ptr(rec("wl_a", PhaseRunning)), st: exited("wl_a", 3),
			kind: ActRecord, phase: PhaseCrashed, restarts: 1, wakeAt: t0.Add(time.Second)},
		{name: "job exit 0 succeeded: recorded, never restarted", spec: jobSpec("wl_a", 3, 0),
			rec: ptr(rec("wl_a", PhaseRunning)), st: exited("wl_a", 0),
			kind: ActRecord, phase: PhaseSucceeded},
		{name: "job succeeded and exited: nothing, however long after", spec: jobSpec("wl_a", 3, 0),
			rec: ptr(rec("wl_a", PhaseSucceeded)), st: exited("wl_a", 0)},
		{name: "job succeeded and the driver forgot it: nothing", spec: jobSpec("wl_a", 3, 0),
			rec: ptr(rec("wl_a", PhaseSucceeded))},
		{name: "job succeeded and its spec changed: still nothing", spec: jobSpec("wl_a", 3, 0),
			rec: ptr(rec("wl_a", PhaseSucceeded, func(r *localstore.Workload) { r.SpecHash = "other" }))},
		{name: "job non-zero exit with a retry left: crashed, started after the slot backoff", spec: jobSpec("wl_a", 1, 0),
			rec: ptr(rec("wl_a", PhaseRunning)), st: exited("wl_a", 2),
			kind: ActRecord, phase: PhaseCrashed, restarts: 1, wakeAt: t0.Add(time.Second)},
		{name: "job retry waits for its backoff", spec: jobSpec("wl_a", 1, 0),
			rec: ptr(rec("wl_a", PhaseCrashed, func(r *localstore.Workload) { r.RestartCount, r.NextStartAt = 1, t0.Add(time.Second) })),
			st:  exited("wl_a", 2), wakeAt: t0.Add(time.Second)},
		{name: "job retry starts once its backoff is over", spec: jobSpec("wl_a", 1, 0),
			rec: ptr(rec("wl_a", PhaseCrashed, func(r *localstore.Workload) { r.RestartCount, r.NextStartAt = 1, t0 })),
			st:  exited("wl_a", 2), kind: ActStart, phase: PhaseCrashed, restarts: 1},
		{name: "job non-zero exit with no retry left: failed for good", spec: jobSpec("wl_a", 1, 0),
			rec: ptr(rec("wl_a", PhaseRunning, func(r *localstore.Workload) { r.RestartCount = 1 })), st: exited("wl_a", 2),
			kind: ActRecord, phase: PhaseJobFailed, restarts: 1},
		{name: "job killed by a signal without retries: failed", spec: jobSpec("wl_a", 0, 0),
			rec: ptr(rec("wl_a", PhaseRunning)), st: signalled("wl_a", 9),
			kind: ActRecord, phase: PhaseJobFailed},
		{name: "job failed: never started again", spec: jobSpec("wl_a", 0, 0),
			rec: ptr(rec("wl_a", PhaseJobFailed)), st: exited("wl_a", 2)},
		{name: "job running within its timeout: wake at the deadline", spec: jobSpec("wl_a", 0, 7200),
			rec: ptr(rec("wl_a", PhaseRunning)), st: running("wl_a"), wakeAt: t0.Add(time.Hour)},
		{name: "job running past its timeout: stopped and recorded timed out", spec: jobSpec("wl_a", 0, 60),
			rec: ptr(rec("wl_a", PhaseRunning)), st: running("wl_a"), kind: ActStop, phase: PhaseTimedOut},
		{name: "service running for long: left running", spec: spec("wl_a"),
			rec: ptr(rec("wl_a", PhaseRunning)), st: running("wl_a")},
		{name: "job timed out but still running (stop interrupted): stopped again", spec: jobSpec("wl_a", 0, 60),
			rec: ptr(rec("wl_a", PhaseTimedOut, func(r *localstore.Workload) { r.EndedAt = t0.Add(-time.Second) })), st: running("wl_a"),
			kind: ActStop, phase: PhaseTimedOut},
		{name: "new job run starts", spec: jobSpec("wl_a", 0, 0), kind: ActStart},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := Input{Snapshot: snap(tt.spec), Now: t0, Records: map[string]localstore.Workload{}, Driver: map[string]*runtime.WorkloadState{}}
			if tt.rec != nil {
				in.Records["wl_a"] = *tt.rec
			}
			if tt.st != nil {
				in.Driver["wl_a"] = tt.st
			}
			d := Decide(in)
			if !d.WakeAt.Equal(tt.wakeAt) {
				t.Errorf("wake at %v, want %v", d.WakeAt, tt.wakeAt)
			}
			if tt.kind == "" {
				if len(d.Actions) != 0 {
					t.Fatalf("actions %+v, want none", d.Actions)
				}
				return
			}
			if len(d.Actions) != 1 || d.Actions[0].Kind != tt.kind {
				t.Fatalf("actions %+v, want one %s", d.Actions, tt.kind)
			}
			r := d.Actions[0].Record
			if tt.phase == "" {
				return
			}
			if r == nil || Phase(r.Phase) != tt.phase || r.RestartCount != tt.restarts {
				t.Fatalf("record %+v, want phase %s with %d restarts", r, tt.phase, tt.restarts)
			}
			if tt.phase.Ended() && r.EndedAt.IsZero() {
				t.Errorf("a final job phase without an end time: %+v", r)
			}
		})
	}
}

// TestDecideJobExitCodes checks what an ended run records of its exit: the code of an exit,
// the signal of a kill.
func TestDecideJobExitCodes(t *testing.T) {
	t.Parallel()
	decide := func(st *runtime.WorkloadState) localstore.Workload {
		t.Helper()
		d := Decide(Input{Snapshot: snap(jobSpec("wl_a", 0, 0)), Now: t0,
			Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)},
			Driver:  map[string]*runtime.WorkloadState{"wl_a": st}})
		if len(d.Actions) != 1 || d.Actions[0].Record == nil {
			t.Fatalf("actions %+v, want one record", d.Actions)
		}
		return *d.Actions[0].Record
	}
	if r := decide(exited("wl_a", 0)); r.LastExitCode == nil || *r.LastExitCode != 0 || r.LastFailure != nil {
		t.Errorf("exit 0 recorded %+v", r)
	}
	if r := decide(exited("wl_a", 4)); r.LastExitCode == nil || *r.LastExitCode != 4 || r.LastFailure == nil || r.LastFailure.Kind != node.FailureExit {
		t.Errorf("exit 4 recorded %+v", r)
	}
	if r := decide(signalled("wl_a", 15)); r.LastFailure == nil || r.LastFailure.Kind != node.FailureSignal || r.LastFailure.Signal != 15 {
		t.Errorf("SIGTERM recorded %+v", r)
	}
}
