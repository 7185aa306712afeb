package jobs

import (
	"fmt"
	"time"
)

// DefaultStartingDeadline is how late a fire time may still start when a job's
// starting_deadline_s is 0: a fire time older than this at the dispatcher's step is recorded
// missed instead of run.
const DefaultStartingDeadline = 300 * time.Second

// CatchUp bounds how far back one step looks: fire times older than this before now are not
// recorded one by one after a downtime (the plan says how far it skipped), so a long outage of
// an "@every 1s" job does not become a storm of records.
const CatchUp = 48 * time.Hour

// MaxRecordsPerStep bounds how many fire times one step records: after a downtime only the
// newest this many fire times of the catch-up window are recorded (the latest may run, the
// others are missed); older ones are counted in [FirePlan.Skipped].
const MaxRecordsPerStep = 1000

// PlanInput is what [Plan] decides on.
type PlanInput struct {
	// Schedule is the job's compiled schedule.
	Schedule Compiled
	// Last is the latest fire time already recorded for the job (the dispatcher's cursor), or
	// the instant the job was created when none is: fire times at or before it are never due.
	// Zero means nothing is due before Now.
	Last time.Time
	// Now is the dispatcher's clock at this step.
	Now time.Time
	// StartingDeadline is how late the latest fire time may start; 0 means
	// [DefaultStartingDeadline], negative is refused.
	StartingDeadline time.Duration
}

// FirePlan is the fire times one step records, oldest first, and where the job's cursor goes.
type FirePlan struct {
	// Missed are fire times in (Last, Now] that will not run: every one but the latest, and the
	// latest too when it is older than the starting deadline.
	Missed []time.Time
	// Due is the latest fire time in (Last, Now] when it is within the starting deadline, or
	// the zero time.
	Due time.Time
	// Skipped counts fire times after Last that are neither due nor in Missed because they
	// fall before the catch-up window or beyond [MaxRecordsPerStep]; all are at or before
	// SkippedThrough. The caller says so once (a log line, an event) instead of recording each.
	Skipped int
	// SkippedThrough bounds the skipped fire times: every one is after Last and at or before
	// it (zero when Skipped is 0).
	SkippedThrough time.Time
	// Cursor is the latest fire time at or before Now (Last when there is none): what the
	// job's cursor becomes once the plan is recorded.
	Cursor time.Time
	// Next is the first fire time after Now: when the dispatcher next has work for this job.
	Next time.Time
}

// Plan decides which fire times of one job are due at in.Now: after a downtime only the latest
// missed fire time runs, and only within the starting deadline; older ones are recorded missed.
// It is pure: no clock, no I/O. Errors wrap [ErrInvalid] (a negative deadline).
//
// Fire times older than [CatchUp] before Now are skipped, and counted exactly for "@every"
// schedules and as at least one otherwise (a cron schedule is not walked through a long
// outage).
func Plan(in PlanInput) (FirePlan, error) {
	deadline := in.StartingDeadline
	if deadline < 0 {
		return FirePlan{}, fmt.Errorf("starting deadline %s is negative: %w", deadline, ErrInvalid)
	}
	if deadline == 0 {
		deadline = DefaultStartingDeadline
	}
	now := in.Now.UTC()
	p := FirePlan{Cursor: in.Last.UTC(), Next: in.Schedule.Next(now)}
	last := in.Last.UTC()
	if last.IsZero() || !last.Before(now) {
		if last.IsZero() {
			p.Cursor = now
		}
		return p, nil
	}
	from := last
	if floor := now.Add(-CatchUp); from.Before(floor) {
		if first := in.Schedule.Next(last); !first.IsZero() && !first.After(floor) {
			p.SkippedThrough = floor
			p.Skipped = countBetween(in.Schedule, last, floor)
		}
		from = floor
	}
	var fires []time.Time
	// At most one fire time a second fits the catch-up window.
	for range int(CatchUp/time.Second) + 1 {
		t := in.Schedule.Next(from)
		if t.IsZero() || t.After(now) {
			break
		}
		fires = append(fires, t)
		from = t
		if len(fires) == 2*MaxRecordsPerStep { // keep memory bounded: drop the older half now
			p.Skipped += MaxRecordsPerStep
			p.SkippedThrough = fires[MaxRecordsPerStep-1]
			fires = append(fires[:0], fires[MaxRecordsPerStep:]...)
		}
	}
	if n := len(fires) - MaxRecordsPerStep; n > 0 {
		p.Skipped += n
		p.SkippedThrough = fires[n-1]
		fires = fires[n:]
	}
	if len(fires) == 0 {
		if !p.SkippedThrough.IsZero() {
			p.Cursor = p.SkippedThrough
		}
		return p, nil
	}
	latest := fires[len(fires)-1]
	p.Missed = fires[:len(fires)-1]
	if now.Sub(latest) <= deadline {
		p.Due = latest
	} else {
		p.Missed = fires
	}
	p.Cursor = latest
	return p, nil
}

// countBetween counts the fire times of c in (after, through], given that there is at least
// one: exactly for "@every", and 1 (meaning at least one) for cron, which is not walked through
// a long outage.
func countBetween(c Compiled, after, through time.Time) int {
	if c.every > 0 {
		return int(through.Sub(c.Next(after))/c.every) + 1
	}
	return 1
}
