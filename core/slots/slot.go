package slots

import (
	"strconv"
	"time"
)

// Generation is the step a slot's current attempt was last committed at (docs/reconciliation.md
// section 3): run 1, stop 2, remove 3. Each generation is acknowledged by a receipt of the node.
type Generation int

// Slot generations.
const (
	GenNone   Generation = 0 // nothing committed (only in [Slot.Acked]: no receipt yet)
	GenRun    Generation = 1 // the attempt should run
	GenStop   Generation = 2 // the attempt should stop
	GenRemove Generation = 3 // the attempt's workload should be removed from the node
)

// String returns "run", "stop", "remove", "none" or "invalid(<n>)".
func (g Generation) String() string {
	switch g {
	case GenNone:
		return "none"
	case GenRun:
		return "run"
	case GenStop:
		return "stop"
	case GenRemove:
		return "remove"
	}
	return "invalid(" + strconv.Itoa(int(g)) + ")"
}

// Phase is what the node last reported of a slot's run (docs/reconciliation.md section 3).
type Phase string

// Observed phases. The empty phase means the node has reported nothing of this attempt yet.
const (
	PhaseNone     Phase = ""         // no observation accepted for this attempt
	PhaseStarting Phase = "starting" // admitted or started, not (yet) ready
	PhaseRunning  Phase = "running"  // running; Ready says whether the readiness probe passed
	PhaseFailed   Phase = "failed"   // exited or could not start; the backoff applies
	PhaseStopped  Phase = "stopped"  // stopped on the node
)

// Observation is the node's last accepted report about a slot's current attempt.
type Observation struct {
	Phase Phase
	// Ready reports whether the readiness probe passed at the time of the report.
	Ready bool
	// EverReady reports whether the node reported this attempt ready at least once (a latch the
	// reader sets with Ready and never clears for the same attempt).
	EverReady bool
	// AcceptedAt is the core's own clock when it accepted the report (never the node's clock): the
	// failure backoff is measured from it. Zero when Phase is PhaseNone.
	AcceptedAt time.Time
	// Unhealthy reports whether the node reports the run's readiness probe failing (health
	// failing, not merely unknown).
	Unhealthy bool
	// Failure is the newest failure the node reported of this attempt; nil for none.
	Failure *Failure
}

// Attempt is one run of a slot: what it runs (Key), its id, and the attempt it succeeds.
type Attempt struct {
	// ID is [AttemptID](Key, Predecessor).
	ID string
	// Key is the desired attempt key the run was admitted with ([DesiredAttemptKey]).
	Key string
	// Predecessor is the id of the removed attempt this run succeeds; "" for the slot's first run.
	Predecessor string
}

// Slot is the state of one slot `<service>/<replica>` as the decision reads it: the incumbent
// attempt, the generation committed for it, the receipts joined, and the node's observation.
// The zero Slot (Exists false) is "no slot".
type Slot struct {
	// Exists reports whether a slot row exists; false means no slot (the other fields are ignored).
	Exists bool
	// Replica is the slot's replica id, unique within the service ("0", "1", … or "<node>.<i>").
	Replica string
	// NodeID is the node the slot stands on; a slot never moves node.
	NodeID string
	// Attempt is the incumbent attempt.
	Attempt Attempt
	// Generation is the latest generation committed for Attempt (GenRun, GenStop or GenRemove).
	Generation Generation
	// Acked is the highest generation the node acknowledged with a receipt (receipts join in
	// order, so Acked == GenRemove means both terminal receipts, stop and remove, are joined).
	Acked Generation
	// Observed is the node's last accepted observation of Attempt's run.
	Observed Observation
	// Ancestors are the attempts before Attempt, newest first, as returned by [Ancestry]; only
	// the first eight are read.
	Ancestors []Attempt
	// Carried is the last failure of an earlier attempt of the slot, kept across attempts, and
	// CarriedKey the attempt key that failed; nil when no earlier attempt failed. A successor
	// at the same key that has not been ready yet still waits on it.
	Carried    *Failure
	CarriedKey string
}

// MaxAncestors is how far back the failure backoff walks a slot's attempt chain.
const MaxAncestors = 8

// Ancestry returns the predecessors of the attempt with id from, newest first, by following
// Attempt.Predecessor through byID: at most [MaxAncestors], stopping at an id byID lacks and at a
// repeated id (a corrupt chain never loops). byID is read, never changed.
func Ancestry(byID map[string]Attempt, from Attempt) []Attempt {
	var out []Attempt
	seen := map[string]bool{from.ID: true}
	next := from.Predecessor
	for len(out) < MaxAncestors && next != "" && !seen[next] {
		a, ok := byID[next]
		if !ok {
			break
		}
		seen[next] = true
		out = append(out, a)
		next = a.Predecessor
	}
	return out
}

// RestartsOfDesire returns n of the failure backoff: the number of consecutive ancestors (newest
// first, at most [MaxAncestors]) that ran exactly key; the walk stops at the first that ran
// something else.
func RestartsOfDesire(ancestors []Attempt, key string) int {
	n := 0
	for i := 0; i < len(ancestors) && i < MaxAncestors; i++ {
		if ancestors[i].Key != key {
			break
		}
		n++
	}
	return n
}

// Backoff limits (docs/reconciliation.md section 4).
const (
	BackoffBase = 10 * time.Second
	BackoffMax  = 10 * time.Minute
)

// Backoff returns min(10 s · 2^n, 10 min); n below zero counts as zero.
func Backoff(n int) time.Duration {
	if n < 0 {
		n = 0
	}
	d := BackoffBase
	for i := 0; i < n && d < BackoffMax; i++ {
		d *= 2
	}
	return min(d, BackoffMax)
}
