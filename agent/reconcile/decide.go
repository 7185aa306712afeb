package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
)

// Phase is the agent's own view of a workload it manages, persisted in its record.
type Phase string

// Phases of a workload record.
const (
	PhaseStarting Phase = "starting" // record written, Start requested and not yet confirmed
	PhaseRunning  Phase = "running"  // started and, as far as the agent knows, running
	PhaseCrashed  Phase = "crashed"  // exited unasked; restarts when NextStartAt passes
	PhaseFailed   Phase = "failed"   // could not be started (bundle, driver); retries when NextStartAt passes
	PhaseStopped  Phase = "stopped"  // stopped because its desired status is stopped

	// The final phases of a job run's workload (docs/jobs.md section 7): it is never started
	// again, whatever the driver says.
	PhaseSucceeded Phase = "succeeded"  // a job run's process exited 0
	PhaseJobFailed Phase = "job_failed" // a job run's last attempt failed and no retry is left
	PhaseTimedOut  Phase = "timed_out"  // a job run's attempt outlived timeout_s and was stopped
)

// Ended reports whether p is a final phase of a job run's workload.
func (p Phase) Ended() bool {
	return p == PhaseSucceeded || p == PhaseJobFailed || p == PhaseTimedOut
}

// Backoff bounds of the crash path (docs/node-protocol.md section 6.3).
const (
	BackoffMin   = time.Second
	BackoffMax   = 5 * time.Minute
	BackoffReset = 10 * time.Minute // running this long clears the backoff
)

// ActionKind names what the loop must do for one workload.
type ActionKind string

// Action kinds, in the order the loop executes them (section 6.2: stop before start).
const (
	ActRemove  ActionKind = "remove"  // stop (graceful), delete its directories and record
	ActStop    ActionKind = "stop"    // stop (graceful, then forced), keep it as stopped (or as Record's final job phase)
	ActRecord  ActionKind = "record"  // persist Record as is (crash, adoption, backoff reset, stopped)
	ActRestart ActionKind = "restart" // stop, then start from Spec (spec or restart_generation changed)
	ActStart   ActionKind = "start"   // start from Spec
)

var actionOrder = map[ActionKind]int{ActRemove: 0, ActStop: 1, ActRecord: 2, ActRestart: 3, ActStart: 4}

// Action is one step for one workload. Spec is set for start and restart;
// Record is the record to persist for ActRecord, and the current record (nil
// when none) for the others.
type Action struct {
	Kind       ActionKind
	WorkloadID string
	Reason     string
	Spec       *node.WorkloadSpec
	Record     *localstore.Workload
}

// Input is everything the decider looks at. Records and Driver are keyed by workload id.
type Input struct {
	Snapshot *node.DesiredState                // newest stored snapshot; nil when none was stored yet
	Driver   map[string]*runtime.WorkloadState // the driver's List
	Records  map[string]localstore.Workload    // the agent's records
	Now      time.Time
	// Leases is the node's leases by lease id and NodeFailed whether the
	// node is failed after a failed fence: a stateful workload starts only
	// while its lease is startable with exactly the spec's fencing token and
	// the node is not failed (docs/node-protocol.md section 6.4).
	Leases     map[string]lease.Status
	NodeFailed bool
}

// Decision is the decider's answer: the actions to run now, and when to decide
// again at the latest because a backoff ends (zero when nothing waits).
type Decision struct {
	Actions []Action
	WakeAt  time.Time
}

// Decide returns what to do to move the node toward in.Snapshot. It is pure:
// no clock, no I/O. With no snapshot it decides nothing, so workloads adopted
// before the first snapshot arrives are left alone.
func Decide(in Input) Decision {
	var d Decision
	if in.Snapshot == nil {
		return d
	}
	wake := func(t time.Time) {
		if !t.IsZero() && (d.WakeAt.IsZero() || t.Before(d.WakeAt)) {
			d.WakeAt = t
		}
	}
	desired := make(map[string]bool, len(in.Snapshot.Spec.Workloads))
	for i := range in.Snapshot.Spec.Workloads {
		spec := &in.Snapshot.Spec.Workloads[i]
		if spec.WorkloadID == "" || desired[spec.WorkloadID] {
			continue
		}
		desired[spec.WorkloadID] = true
		var rec *localstore.Workload
		if r, ok := in.Records[spec.WorkloadID]; ok {
			rec = &r
		}
		st := in.Driver[spec.WorkloadID]
		act, at := decideOne(spec, rec, st, in.Now)
		if act != nil && spec.Stateful && act.Reason == reasonReplay {
			if ok, _ := StatefulAllowed(spec, in); !ok {
				// Its lease may not start anything now: only adopt the
				// running workload, as a running one is never stopped here.
				act = adopt(rec, st)
			}
		} else if act != nil && spec.Stateful && (act.Kind == ActStart || act.Kind == ActRestart) {
			act = gateStateful(spec, rec, act, in)
		}
		if act != nil {
			d.Actions = append(d.Actions, *act)
		}
		wake(at)
	}
	seen := map[string]bool{}
	for id, rec := range in.Records {
		if desired[id] {
			continue
		}
		seen[id] = true
		r := rec
		d.Actions = append(d.Actions, Action{Kind: ActRemove, WorkloadID: id, Reason: "not in desired state", Record: &r})
	}
	for id := range in.Driver {
		if desired[id] || seen[id] {
			continue
		}
		d.Actions = append(d.Actions, Action{Kind: ActRemove, WorkloadID: id, Reason: "unknown to the desired state"})
	}
	sort.SliceStable(d.Actions, func(i, j int) bool {
		a, b := d.Actions[i], d.Actions[j]
		if actionOrder[a.Kind] != actionOrder[b.Kind] {
			return actionOrder[a.Kind] < actionOrder[b.Kind]
		}
		return a.WorkloadID < b.WorkloadID
	})
	return d
}

// StatefulAllowed reports whether the stateful workload spec may start
// given in's leases (docs/node-protocol.md section 6.4), and why not.
func StatefulAllowed(spec *node.WorkloadSpec, in Input) (bool, string) {
	if in.NodeFailed {
		return false, "the node is failed after a failed fence"
	}
	if spec.LeaseID == "" {
		return false, "stateful workload names no lease"
	}
	st, ok := in.Leases[spec.LeaseID]
	switch {
	case !ok:
		return false, "lease " + spec.LeaseID + " is not held by this node"
	case st.Token != spec.FencingToken:
		return false, fmt.Sprintf("lease %s has token %d, the workload wants %d", spec.LeaseID, st.Token, spec.FencingToken)
	case !st.Startable:
		return false, fmt.Sprintf("lease %s is %s, not held", spec.LeaseID, st.State)
	}
	return true, ""
}

// gateStateful turns a start or restart of a stateful workload that may not
// start into staying stopped: a running one is left as it is (its lease may
// be uncertain, which keeps it running), a stopped one is recorded stopped
// with the reason. No error is reported (section 6.4).
func gateStateful(spec *node.WorkloadSpec, rec *localstore.Workload, act *Action, in Input) *Action {
	ok, why := StatefulAllowed(spec, in)
	if ok {
		return act
	}
	if act.Kind == ActRestart {
		return nil
	}
	msg := "waiting for lease: " + why
	if rec != nil && Phase(rec.Phase) == PhaseStopped && rec.Message == msg {
		return nil
	}
	r := localstore.Workload{WorkloadID: spec.WorkloadID, Driver: spec.Driver, LeaseID: spec.LeaseID}
	if rec != nil {
		r = *rec
	}
	r.Phase = string(PhaseStopped)
	r.Message = msg
	return &Action{Kind: ActRecord, WorkloadID: spec.WorkloadID, Reason: "stateful: " + why, Record: &r}
}

// decideOne decides for one desired workload; it returns at most one action and
// the time to decide again at the latest.
func decideOne(spec *node.WorkloadSpec, rec *localstore.Workload, st *runtime.WorkloadState, now time.Time) (*Action, time.Time) {
	running := st != nil && st.State == runtime.StateRunning
	id := spec.WorkloadID
	if spec.DesiredStatus == node.DesiredStopped {
		if running {
			return &Action{Kind: ActStop, WorkloadID: id, Reason: "desired stopped", Record: rec}, time.Time{}
		}
		if rec != nil && Phase(rec.Phase) != PhaseStopped {
			r := *rec
			r.Phase = string(PhaseStopped)
			return &Action{Kind: ActRecord, WorkloadID: id, Reason: "desired stopped", Record: &r}, time.Time{}
		}
		return nil, time.Time{}
	}

	if spec.Job != nil {
		return decideJob(spec, rec, st, now)
	}
	if rec == nil {
		if running {
			// Running without a record: the agent cannot know its port. Restart
			// it under a fresh record.
			return &Action{Kind: ActRestart, WorkloadID: id, Reason: "running without a record", Spec: spec}, time.Time{}
		}
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "new workload", Spec: spec}, time.Time{}
	}

	changed := rec.SpecHash != SpecHash(spec) || rec.RestartGeneration != spec.RestartGeneration
	phase := Phase(rec.Phase)
	if running {
		if changed {
			return &Action{Kind: ActRestart, WorkloadID: id, Reason: "spec or restart_generation changed", Spec: spec, Record: rec}, time.Time{}
		}
		switch {
		case Replays(rec, st):
			// The driver acted on a start whose result was never recorded:
			// retry it as the same attempt, which the driver replays, so the
			// record gets the start's answer (its handle) without a second start.
			return &Action{Kind: ActStart, WorkloadID: id, Reason: reasonReplay, Spec: spec, Record: rec}, time.Time{}
		case phase != PhaseRunning:
			return adopt(rec, st), time.Time{}
		case rec.BackoffStep > 0:
			resetAt := rec.StartedAt.Add(BackoffReset)
			if !now.Before(resetAt) {
				r := *rec
				r.BackoffStep = 0
				r.NextStartAt = time.Time{}
				return &Action{Kind: ActRecord, WorkloadID: id, Reason: "healthy long enough: reset backoff", Record: &r}, time.Time{}
			}
			return nil, resetAt
		}
		return nil, time.Time{}
	}

	// Not running.
	switch phase {
	case PhaseRunning:
		r := Crash(*rec, st, now)
		return &Action{Kind: ActRecord, WorkloadID: id, Reason: "exited unasked", Record: &r}, r.NextStartAt
	case PhaseCrashed, PhaseFailed:
		if changed {
			return &Action{Kind: ActStart, WorkloadID: id, Reason: "spec or restart_generation changed", Spec: spec, Record: rec}, time.Time{}
		}
		if now.Before(rec.NextStartAt) {
			return nil, rec.NextStartAt
		}
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "backoff over", Spec: spec, Record: rec}, time.Time{}
	default: // starting (interrupted start) or stopped (desired running again)
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "not running", Spec: spec, Record: rec}, time.Time{}
	}
}

// decideJob decides for the workload of a job run (docs/jobs.md section 7), which runs to
// completion instead of being kept running:
//
//   - an exit 0 records the run succeeded, and it is never started again;
//   - a non-zero exit or a signal starts it again after the slot backoff while retries are
//     left ([Crash]), and records it failed once none is;
//   - an attempt running longer than timeout_s is stopped (graceful, then forced) and recorded
//     timed_out;
//   - an ended run stays ended: no restart, no spec change restarts it.
func decideJob(spec *node.WorkloadSpec, rec *localstore.Workload, st *runtime.WorkloadState, now time.Time) (*Action, time.Time) {
	running := st != nil && st.State == runtime.StateRunning
	id := spec.WorkloadID
	if rec == nil {
		if running {
			return &Action{Kind: ActRestart, WorkloadID: id, Reason: "job run running without a record", Spec: spec}, time.Time{}
		}
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "new job run", Spec: spec}, time.Time{}
	}
	phase := Phase(rec.Phase)
	if phase.Ended() {
		if running { // a stop that did not finish before the record was written
			return &Action{Kind: ActStop, WorkloadID: id, Reason: "job run ended", Record: rec}, time.Time{}
		}
		return nil, time.Time{}
	}
	if running {
		if Replays(rec, st) {
			return &Action{Kind: ActStart, WorkloadID: id, Reason: reasonReplay, Spec: spec, Record: rec}, time.Time{}
		}
		if phase != PhaseRunning {
			return adopt(rec, st), time.Time{}
		}
		if t := spec.Job.TimeoutS; t > 0 && !rec.StartedAt.IsZero() {
			deadline := rec.StartedAt.Add(time.Duration(t) * time.Second)
			if !now.Before(deadline) {
				r := *rec
				r.Phase, r.EndedAt = string(PhaseTimedOut), now
				r.Message = fmt.Sprintf("timed out after %ds: stopped", t)
				return &Action{Kind: ActStop, WorkloadID: id, Reason: "job run timed out", Record: &r}, time.Time{}
			}
			return nil, deadline
		}
		return nil, time.Time{}
	}
	switch phase {
	case PhaseRunning:
		r := Crash(*rec, st, now)
		if r.LastExitCode != nil && *r.LastExitCode == 0 {
			r = *rec
			r.Phase, r.EndedAt, r.Message, r.LastExitCode = string(PhaseSucceeded), now, "", intPtr(0)
			return &Action{Kind: ActRecord, WorkloadID: id, Reason: "job run succeeded", Record: &r}, time.Time{}
		}
		if rec.RestartCount < spec.Job.Retries {
			return &Action{Kind: ActRecord, WorkloadID: id, Reason: "job run failed: retry after backoff", Record: &r}, r.NextStartAt
		}
		r.Phase, r.EndedAt, r.NextStartAt, r.RestartCount, r.BackoffStep = string(PhaseJobFailed), now, time.Time{}, rec.RestartCount, rec.BackoffStep
		return &Action{Kind: ActRecord, WorkloadID: id, Reason: "job run failed: no retry left", Record: &r}, time.Time{}
	case PhaseCrashed, PhaseFailed:
		if now.Before(rec.NextStartAt) {
			return nil, rec.NextStartAt
		}
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "job run retry: backoff over", Spec: spec, Record: rec}, time.Time{}
	default: // starting (interrupted start) or stopped
		return &Action{Kind: ActStart, WorkloadID: id, Reason: "job run not started", Spec: spec, Record: rec}, time.Time{}
	}
}

func intPtr(i int) *int { return &i }

// reasonReplay is the reason of a start that retries an interrupted attempt.
const reasonReplay = "retry interrupted start"

// adopt records a running workload the record does not say is running.
func adopt(rec *localstore.Workload, st *runtime.WorkloadState) *Action {
	r := *rec
	r.Phase = string(PhaseRunning)
	r.Message = ""
	if !st.StartedAt.IsZero() {
		r.StartedAt = st.StartedAt
	}
	return &Action{Kind: ActRecord, WorkloadID: r.WorkloadID, Reason: "adopt running workload", Record: &r}
}

// Crash returns rec after an unasked exit observed at now: phase crashed,
// restart count and backoff step incremented, next start after the backoff.
// st may be nil (the driver lost it, e.g. after a reboot).
func Crash(rec localstore.Workload, st *runtime.WorkloadState, now time.Time) localstore.Workload {
	rec.Phase = string(PhaseCrashed)
	rec.RestartCount++
	rec.BackoffStep++
	rec.NextStartAt = now.Add(Backoff(rec.BackoffStep))
	rec.LastExitCode = nil
	code := -1
	if st != nil && st.ExitCode >= 0 {
		c := st.ExitCode
		rec.LastExitCode = &c
		code = c
	}
	f := node.ExitFailure(code, now, failureCount(rec.LastFailure)+1)
	if st != nil && st.ExitReason == runtime.ExitReasonOOM {
		// The driver saw its OOM killer end it: over the memory limit, not a crash of its own.
		f.Kind, f.Message = node.FailureOOM, "killed by the OOM killer over its memory limit"
	}
	rec.LastFailure = &f
	return rec
}

// Fail returns rec after a start that failed at now with msg: phase failed and
// the next attempt after the backoff, and a last failure of kind (start or
// image). The restart count is not changed.
func Fail(rec localstore.Workload, kind node.FailureKind, msg string, now time.Time) localstore.Workload {
	rec.Phase = string(PhaseFailed)
	rec.BackoffStep++
	rec.NextStartAt = now.Add(Backoff(rec.BackoffStep))
	rec.Message = msg
	rec.LastFailure = &node.Failure{Kind: kind, Message: msg, At: now, Count: failureCount(rec.LastFailure) + 1}
	return rec
}

func failureCount(f *node.Failure) int {
	if f == nil {
		return 0
	}
	return f.Count
}

// Backoff is the wait before attempt step (1-based): 1 s doubling, at most 5 min.
func Backoff(step int) time.Duration {
	if step <= 1 {
		return BackoffMin
	}
	d := BackoffMin
	for i := 1; i < step; i++ {
		d *= 2
		if d >= BackoffMax {
			return BackoffMax
		}
	}
	return d
}

// secretRef is what of a workload secret SpecHash covers: which secret and version reaches
// which key, not the sealed bytes (random per sealing).
type secretRef struct {
	Key     string `json:"k"`
	As      string `json:"a"`
	Secret  string `json:"s"`
	Version int    `json:"v"`
}

// SpecHash is the hex SHA-256 of the spec fields whose change needs the
// workload restarted: driver, bundle, command, env, secrets and port.
func SpecHash(spec *node.WorkloadSpec) string {
	var refs []secretRef
	for _, s := range spec.Secrets {
		refs = append(refs, secretRef{s.Key, s.As, s.Secret, s.Version})
	}
	b, _ := json.Marshal(struct {
		Driver  string            `json:"driver"`
		Bundle  string            `json:"bundle"`
		Command []string          `json:"command"`
		Env     map[string]string `json:"env"`
		Port    int               `json:"port"`
		// Container fields: absent when empty, so a process workload keeps its hash.
		Image     string `json:"image,omitempty"`
		User      string `json:"user,omitempty"`
		Memory    int64  `json:"memory_bytes,omitempty"`
		CPUMillis int64  `json:"cpu_millis,omitempty"`
		// Secrets: absent when none, so a workload without secrets keeps its hash.
		Secrets []secretRef `json:"secrets,omitempty"`
		// Volumes: absent when none, so a workload without volumes keeps its hash.
		Volumes []node.Volume `json:"volumes,omitempty"`
	}{spec.Driver, spec.BundleDigest, spec.Command, spec.Env, spec.Port, spec.Image, spec.User, spec.MemoryBytes, spec.CPUMillis, refs, spec.Volumes})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
