package reconcile

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func spec(id string, mods ...func(*node.WorkloadSpec)) node.WorkloadSpec {
	s := node.WorkloadSpec{WorkloadID: id, Driver: "process", Command: []string{"./app"}, DesiredStatus: node.DesiredRunning, RestartGeneration: 1}
	for _, m := range mods {
		m(&s)
	}
	return s
}

func snap(specs ...node.WorkloadSpec) *node.DesiredState {
	return &node.DesiredState{Rev: 7, Spec: node.Spec{Workloads: specs}}
}

func rec(id string, phase Phase, mods ...func(*localstore.Workload)) localstore.Workload {
	s := spec(id)
	r := localstore.Workload{WorkloadID: id, Driver: "process", Phase: string(phase), Port: 40000,
		SpecHash: SpecHash(&s), RestartGeneration: 1, StartedAt: t0.Add(-time.Hour)}
	for _, m := range mods {
		m(&r)
	}
	return r
}

func running(id string) *runtime.WorkloadState {
	return &runtime.WorkloadState{WorkloadID: id, State: runtime.StateRunning, PID: 10, StartedAt: t0.Add(-time.Hour)}
}

func exited(id string, code int) *runtime.WorkloadState {
	return &runtime.WorkloadState{WorkloadID: id, State: runtime.StateExited, ExitCode: code, ExitedAt: t0}
}

type want struct {
	kind   ActionKind
	id     string
	record *localstore.Workload // checked when set
}

func intp(i int) *int { return &i }

func TestDecide(t *testing.T) {
	t.Parallel()
	crashed1 := rec("wl_a", PhaseCrashed, func(r *localstore.Workload) {
		r.RestartCount, r.BackoffStep, r.NextStartAt, r.LastExitCode = 1, 1, t0.Add(time.Second), intp(3)
		r.LastFailure = &node.Failure{Kind: node.FailureExit, ExitCode: intp(3), At: t0, Count: 1}
	})
	tests := []struct {
		name   string
		in     Input
		want   []want
		wakeAt time.Time
	}{
		{name: "no snapshot decides nothing, even for unknown running workloads",
			in: Input{Driver: map[string]*runtime.WorkloadState{"wl_x": running("wl_x")},
				Records: map[string]localstore.Workload{"wl_x": rec("wl_x", PhaseRunning)}}},
		{name: "new workload starts",
			in:   Input{Snapshot: snap(spec("wl_a"))},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "running and recorded: nothing",
			in: Input{Snapshot: snap(spec("wl_a")), Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}}},
		{name: "adopted after agent restart mid-start: record only, no restart",
			in: Input{Snapshot: snap(spec("wl_a")), Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseStarting)}},
			want: []want{{kind: ActRecord, id: "wl_a", record: ptr(rec("wl_a", PhaseRunning))}}},
		{name: "interrupted attempt the driver ran: the same attempt again, to replay",
			in: Input{Snapshot: snap(spec("wl_a")), Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseStarting, func(r *localstore.Workload) { r.StartAttempt = 3 })}},
			want: []want{{kind: ActStart, id: "wl_a", record: ptr(rec("wl_a", PhaseStarting, func(r *localstore.Workload) { r.StartAttempt = 3 }))}}},
		{name: "running without a record restarts under a fresh record",
			in:   Input{Snapshot: snap(spec("wl_a")), Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")}},
			want: []want{{kind: ActRestart, id: "wl_a"}}},
		{name: "restart_generation change restarts",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.RestartGeneration = 2 })),
				Driver:  map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActRestart, id: "wl_a"}}},
		{name: "env change restarts",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.Env = map[string]string{"A": "1"} })),
				Driver:  map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActRestart, id: "wl_a"}}},
		{name: "exit unasked is a crash with backoff 1 s",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0, Driver: map[string]*runtime.WorkloadState{"wl_a": exited("wl_a", 3)},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want:   []want{{kind: ActRecord, id: "wl_a", record: &crashed1}},
			wakeAt: t0.Add(time.Second)},
		{name: "vanished from the driver (reboot) is a crash with unknown exit",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0,
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActRecord, id: "wl_a", record: ptr(rec("wl_a", PhaseCrashed, func(r *localstore.Workload) {
				r.RestartCount, r.BackoffStep, r.NextStartAt = 1, 1, t0.Add(time.Second)
				r.LastFailure = &node.Failure{Kind: node.FailureExit, At: t0, Count: 1}
			}))}},
			wakeAt: t0.Add(time.Second)},
		{name: "crashed within backoff waits",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0.Add(500 * time.Millisecond),
				Driver: map[string]*runtime.WorkloadState{"wl_a": exited("wl_a", 3)}, Records: map[string]localstore.Workload{"wl_a": crashed1}},
			wakeAt: t0.Add(time.Second)},
		{name: "crashed after backoff starts",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0.Add(time.Second),
				Driver: map[string]*runtime.WorkloadState{"wl_a": exited("wl_a", 3)}, Records: map[string]localstore.Workload{"wl_a": crashed1}},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "failed start after backoff retries",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0.Add(2 * time.Second),
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseFailed, func(r *localstore.Workload) {
					r.BackoffStep, r.NextStartAt = 2, t0.Add(2*time.Second)
				})}},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "crashed with a new spec starts at once",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.RestartGeneration = 5 })), Now: t0,
				Records: map[string]localstore.Workload{"wl_a": crashed1}},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "backoff resets after 10 minutes running",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0, Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning, func(r *localstore.Workload) {
					r.BackoffStep, r.StartedAt, r.RestartCount = 4, t0.Add(-BackoffReset), 4
				})}},
			want: []want{{kind: ActRecord, id: "wl_a", record: ptr(rec("wl_a", PhaseRunning, func(r *localstore.Workload) {
				r.BackoffStep, r.StartedAt, r.RestartCount = 0, t0.Add(-BackoffReset), 4
			}))}}},
		{name: "backoff not reset before 10 minutes",
			in: Input{Snapshot: snap(spec("wl_a")), Now: t0, Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning, func(r *localstore.Workload) {
					r.BackoffStep, r.StartedAt = 4, t0.Add(-time.Minute)
				})}},
			wakeAt: t0.Add(9 * time.Minute)},
		{name: "desired stopped and running: stop",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped })),
				Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")}, Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActStop, id: "wl_a"}}},
		{name: "desired stopped, exited, recorded running: record stopped, not a crash",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped })),
				Driver: map[string]*runtime.WorkloadState{"wl_a": exited("wl_a", 0)}, Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActRecord, id: "wl_a", record: ptr(rec("wl_a", PhaseStopped))}}},
		{name: "desired stopped and already stopped: nothing",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped })),
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseStopped)}}},
		{name: "desired stopped, never started: nothing",
			in: Input{Snapshot: snap(spec("wl_a", func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped }))}},
		{name: "stopped then desired running again: start",
			in:   Input{Snapshot: snap(spec("wl_a")), Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseStopped)}},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "undesired workloads are removed first, in id order; unknown driver workloads too",
			in: Input{Snapshot: snap(spec("wl_new")),
				Driver:  map[string]*runtime.WorkloadState{"wl_old": running("wl_old"), "wl_stray": exited("wl_stray", 0)},
				Records: map[string]localstore.Workload{"wl_old": rec("wl_old", PhaseRunning), "wl_gone": rec("wl_gone", PhaseCrashed)}},
			want: []want{{kind: ActRemove, id: "wl_gone"}, {kind: ActRemove, id: "wl_old"}, {kind: ActRemove, id: "wl_stray"}, {kind: ActStart, id: "wl_new"}}},
		{name: "empty snapshot removes everything",
			in: Input{Snapshot: snap(), Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")},
				Records: map[string]localstore.Workload{"wl_a": rec("wl_a", PhaseRunning)}},
			want: []want{{kind: ActRemove, id: "wl_a"}}},
		{name: "duplicate workload ids in a snapshot count once",
			in:   Input{Snapshot: snap(spec("wl_a"), spec("wl_a"))},
			want: []want{{kind: ActStart, id: "wl_a"}}},
		{name: "earliest backoff wins the wake time",
			in: Input{Snapshot: snap(spec("wl_a"), spec("wl_b")), Now: t0,
				Records: map[string]localstore.Workload{
					"wl_a": rec("wl_a", PhaseCrashed, func(r *localstore.Workload) { r.NextStartAt = t0.Add(time.Minute) }),
					"wl_b": rec("wl_b", PhaseFailed, func(r *localstore.Workload) { r.NextStartAt = t0.Add(time.Second) }),
				}},
			wakeAt: t0.Add(time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := Decide(tt.in)
			if len(d.Actions) != len(tt.want) {
				t.Fatalf("got %d actions %+v, want %d", len(d.Actions), d.Actions, len(tt.want))
			}
			for i, w := range tt.want {
				a := d.Actions[i]
				if a.Kind != w.kind || a.WorkloadID != w.id {
					t.Errorf("action %d = %s %s, want %s %s", i, a.Kind, a.WorkloadID, w.kind, w.id)
				}
				if (a.Kind == ActStart || a.Kind == ActRestart) && (a.Spec == nil || a.Spec.WorkloadID != w.id) {
					t.Errorf("action %d: start without its spec", i)
				}
				if w.record != nil && !reflect.DeepEqual(a.Record, w.record) {
					t.Errorf("action %d record\n got %+v\nwant %+v", i, a.Record, w.record)
				}
			}
			if !d.WakeAt.Equal(tt.wakeAt) {
				t.Errorf("WakeAt = %v, want %v", d.WakeAt, tt.wakeAt)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestBackoff(t *testing.T) {
	t.Parallel()
	for step, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		9: 256 * time.Second, 10: 5 * time.Minute, 40: 5 * time.Minute} {
		if got := Backoff(step); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", step, got, want)
		}
	}
}

func TestFail(t *testing.T) {
	t.Parallel()
	r := Fail(rec("wl_a", PhaseStarting), node.FailureStart, "boom", t0)
	if Phase(r.Phase) != PhaseFailed || r.BackoffStep != 1 || r.RestartCount != 0 || !r.NextStartAt.Equal(t0.Add(time.Second)) || r.Message != "boom" {
		t.Fatalf("Fail = %+v", r)
	}
	if f := r.LastFailure; f == nil || f.Kind != node.FailureStart || f.Message != "boom" || !f.At.Equal(t0) || f.Count != 1 {
		t.Fatalf("Fail's last failure = %+v", f)
	}
	// A second failure counts on; a crash after it keeps counting and says how it exited.
	r = Fail(r, node.FailureImage, "no bundle", t0)
	if r.LastFailure.Count != 2 || r.LastFailure.Kind != node.FailureImage {
		t.Fatalf("second Fail's last failure = %+v", r.LastFailure)
	}
	r = Crash(r, &runtime.WorkloadState{State: runtime.StateExited, ExitCode: 137}, t0)
	if f := r.LastFailure; f.Kind != node.FailureSignal || f.Signal != 9 || f.ExitCode != nil || f.Count != 3 {
		t.Fatalf("Crash after a signal: last failure = %+v", f)
	}
	// The driver saw the OOM killer end it: kind oom, still signal 9.
	r = Crash(r, &runtime.WorkloadState{State: runtime.StateExited, ExitCode: 137, ExitReason: runtime.ExitReasonOOM}, t0)
	if f := r.LastFailure; f.Kind != node.FailureOOM || f.Signal != 9 || f.Count != 4 || !strings.Contains(f.Message, "memory limit") {
		t.Fatalf("Crash by the OOM killer: last failure = %+v", f)
	}
}
