package slots

import "time"

// DefaultProgressDeadline is how long a rollout may go without progress before it is failed,
// when the service states no progress_deadline_s (docs/reconciliation.md section 7.2).
const DefaultProgressDeadline = 600 * time.Second

// ReasonProgressDeadline refuses a rollout that made no progress within its deadline.
const ReasonProgressDeadline Reason = "progress-deadline"

// Progress is how far a rollout has come, as the sweep keeps it beside the verdict: the service
// and spec revisions it is about, the number of desired slots that ran the desired attempt
// ready at the last progress, when that was, and whether the deadline passed.
type Progress struct {
	ServiceRevision int64     `bson:"service_revision" json:"service_revision"`
	SpecRevision    int64     `bson:"spec_revision" json:"spec_revision"`
	Ready           int       `bson:"ready" json:"ready"`
	At              time.Time `bson:"at" json:"at"`
	// Failed reports whether the rollout went past its deadline without progress; it stays so
	// until the revisions change or the service converges.
	Failed bool `bson:"failed,omitempty" json:"failed,omitempty"`
	// Done reports whether the rollout converged once; from then on no deadline applies to
	// these revisions.
	Done bool `bson:"done,omitempty" json:"done,omitempty"`
}

// ProgressInput is one sweep's view of a rollout for [NextProgress].
type ProgressInput struct {
	// Prev is the stored progress; nil when none was stored.
	Prev *Progress
	// ServiceRevision and SpecRevision are what the service runs now.
	ServiceRevision, SpecRevision int64
	// Ready counts the desired slots that run the desired attempt and were observed ready.
	Ready int
	// Verdict is the verdict the plan decided.
	Verdict Verdict
	// Deadline is the service's progress deadline; zero or below means [DefaultProgressDeadline].
	Deadline time.Duration
	Now      time.Time
	// Start is when the rollout started: when the revisions were written. A new rollout's
	// clock starts there, not at the sweep that first saw it; zero (or after Now) means Now.
	Start time.Time
}

// NextProgress returns the progress to keep and the verdict to write (docs/reconciliation.md
// section 7.2). A change of either revision starts a new rollout with its clock at Start; more
// ready slots than at the last progress move the clock to Now; a converged verdict finishes the
// rollout (and clears a failure), after which no deadline applies to the same revisions. A
// rollout that is not finished nor refused for another reason, and went Deadline without
// progress, is failed: its verdict is refused(progress-deadline), and
// failed reports whether it became failed in this call (the caller emits the event and rolls back
// once). Pure: equal inputs give equal outputs.
func NextProgress(in ProgressInput) (next Progress, v Verdict, failed bool) {
	deadline := in.Deadline
	if deadline <= 0 {
		deadline = DefaultProgressDeadline
	}
	v = in.Verdict
	start := in.Start
	if start.IsZero() || start.After(in.Now) {
		start = in.Now
	}
	p := Progress{ServiceRevision: in.ServiceRevision, SpecRevision: in.SpecRevision, Ready: in.Ready, At: start}
	if prev := in.Prev; prev != nil && prev.ServiceRevision == in.ServiceRevision && prev.SpecRevision == in.SpecRevision {
		p = *prev
		if in.Ready > p.Ready {
			p.Ready, p.At = in.Ready, in.Now
		}
	}
	switch {
	case v.State == Converged:
		if !p.Done || p.Failed {
			p.Done, p.Failed, p.At = true, false, in.Now
		}
		return p, v, false
	case p.Done || v.State == Refused:
		// A finished rollout has no deadline: a later crash of its slots is not a rollout's.
		return p, v, false
	case v.State == Waiting && v.Reason == ReasonRolloutPaused:
		// A paused rollout is not failing; resuming writes a new revision, which starts the
		// deadline again.
		return p, v, false
	}
	if !p.Failed && in.Now.Sub(p.At) >= deadline {
		p.Failed, failed = true, true
	}
	if p.Failed {
		v = Verdict{SpecRevision: v.SpecRevision, State: Refused, Reason: ReasonProgressDeadline}
	}
	return p, v, failed
}
