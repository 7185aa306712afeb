package jobs

import (
	"strings"
	"time"
)

// RunsCollection holds one document per fire time of every job, per manual run and per one-off
// command (docs/jobs.md section 9):
// its _id is [RunID], inserted before anything is placed, so a fire time is recorded at most
// once whoever computes it.
const RunsCollection = "job_runs"

// CursorsCollection holds one document per scheduled job: the latest fire time a dispatcher
// has recorded for it, where the next step starts. It only saves work: the run ids alone keep a
// fire time from being recorded twice.
const CursorsCollection = "job_cursors"

// RunState is where a run is in its life (docs/jobs.md section 5).
type RunState string

// Run states. pending and running are live; the others are final.
const (
	// RunPending: the fire time is recorded and owned by the dispatcher that inserted it; it is
	// not placed yet.
	RunPending RunState = "pending"
	// RunRunning: the run is placed on a node and its process started.
	RunRunning RunState = "running"
	// RunSucceeded: the run's process exited 0.
	RunSucceeded RunState = "succeeded"
	// RunFailed: the run's process exited non-zero or was killed by a signal, and no retry is
	// left.
	RunFailed RunState = "failed"
	// RunTimedOut: the run outlived the job's timeout_s and was stopped.
	RunTimedOut RunState = "timed_out"
	// RunMissed: the fire time passed while no dispatcher ran, and either a later fire time
	// superseded it or it was older than the starting deadline; it never ran.
	RunMissed RunState = "missed"
	// RunCancelled: an operator cancelled the run (or concurrency: replace stopped it) before
	// it ended on its own.
	RunCancelled RunState = "cancelled"
)

// Final reports whether s is a state a run never leaves.
func (s RunState) Final() bool {
	switch s {
	case RunSucceeded, RunFailed, RunTimedOut, RunMissed, RunCancelled:
		return true
	}
	return false
}

// Run is one document of [RunsCollection].
type Run struct {
	// ID is [RunID] of Job and FireTime.
	ID string `bson:"_id" json:"id"`
	// Job is the job's id.
	Job string `bson:"job" json:"job"`
	// FireTime is the scheduled instant, UTC, whole seconds.
	FireTime time.Time `bson:"fire_time" json:"fire_time"`
	// State is where the run is.
	State RunState `bson:"state" json:"state"`
	// RecordedAt is the dispatcher's clock when it inserted the run.
	RecordedAt time.Time `bson:"recorded_at" json:"recorded_at"`
	// RecordedBy is the id of the dispatcher that inserted the run: the one that owns placing
	// a pending run.
	RecordedBy string `bson:"recorded_by" json:"recorded_by"`
	// Revision is the compare-and-set revision of later state changes; 0 when inserted.
	Revision int64 `bson:"revision" json:"revision"`

	// Trigger is TriggerSchedule (a fire time), TriggerManual (berth job run) or TriggerCommand
	// (berth run: Job then names a service or job, and Command is what runs).
	Trigger string `bson:"trigger,omitempty" json:"trigger,omitempty"`
	// Command is what a TriggerCommand run runs instead of its service's command, in the
	// service's release, env, secrets and bindings; TimeoutS bounds it (0: no bound).
	Command  []string `bson:"command,omitempty" json:"command,omitempty"`
	TimeoutS int      `bson:"timeout_s,omitempty" json:"timeout_s,omitempty"`
	// RequestedBy is who started a manual or command run, "<type>:<id>" as the change log
	// names actors; empty for scheduled runs.
	RequestedBy string `bson:"requested_by,omitempty" json:"requested_by,omitempty"`
	// WorkloadID and NodeID name the workload the run was placed as and its node (section 7);
	// empty until placed.
	WorkloadID string `bson:"workload_id,omitempty" json:"workload_id,omitempty"`
	NodeID     string `bson:"node_id,omitempty" json:"node_id,omitempty"`
	// PlacedAt is the core's clock when the run was placed; StartedAt and EndedAt the node's
	// clock at its first start and at its end.
	PlacedAt  time.Time `bson:"placed_at,omitempty" json:"placed_at,omitzero"`
	StartedAt time.Time `bson:"started_at,omitempty" json:"started_at,omitzero"`
	EndedAt   time.Time `bson:"ended_at,omitempty" json:"ended_at,omitzero"`
	// DurationS is EndedAt - StartedAt in seconds, once ended.
	DurationS float64 `bson:"duration_s,omitempty" json:"duration_s,omitempty"`
	// Attempts counts the starts of its process; ExitCode and Signal say how the last ended.
	Attempts int  `bson:"attempts,omitempty" json:"attempts,omitempty"`
	ExitCode *int `bson:"exit_code,omitempty" json:"exit_code,omitempty"`
	Signal   int  `bson:"signal,omitempty" json:"signal,omitempty"`
	// OutputTail is the end of its output (at most 4 KiB), once ended.
	OutputTail string `bson:"output_tail,omitempty" json:"output_tail,omitempty"`
	// Message says why a run waits (no node fits), was missed, cancelled or failed without an
	// exit.
	Message string `bson:"message,omitempty" json:"message,omitempty"`
}

// Triggers of a run.
const (
	TriggerSchedule = "schedule"
	TriggerManual   = "manual"
	TriggerCommand  = "command"
)

// Name returns the run id without its job's project: "nightly@2026-12-02T03:00:00Z" of
// "default/nightly@2026-12-02T03:00:00Z".
func (r Run) Name() string {
	if _, after, ok := strings.Cut(r.ID, "/"); ok {
		return after
	}
	return r.ID
}

// RunID is the _id of job's run for fire time fire: "<job>@<fire instant, UTC, RFC 3339>",
// such as "nightly@2026-12-02T03:00:00Z". Fire times are whole seconds, so the id is exact.
func RunID(job string, fire time.Time) string {
	return job + "@" + fire.UTC().Format(time.RFC3339)
}

// cursorDoc is one document of [CursorsCollection].
type cursorDoc struct {
	ID       string    `bson:"_id"`
	LastFire time.Time `bson:"last_fire"`
	Revision int64     `bson:"revision"`
}
