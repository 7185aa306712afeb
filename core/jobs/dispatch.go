package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berthhq/berth/core/store"
)

// Job is what the dispatcher needs of a scheduled job.
type Job struct {
	// ID names the job; run ids start with it.
	ID string
	// Schedule is when it fires.
	Schedule Schedule
	// StartingDeadline is the job's starting_deadline_s; 0 means [DefaultStartingDeadline],
	// negative is refused.
	StartingDeadline time.Duration
	// Created is when the job was declared: fire times at or before it are never due. Zero
	// means the job's first step starts its schedule at that step's now.
	Created time.Time
}

// DispatcherConfig configures [NewDispatcher]. Store is required.
type DispatcherConfig struct {
	// Store is the state store the runs and cursors are written to.
	Store *store.Store
	// ID names this dispatcher in the runs it records ([Run.RecordedBy]); keep it stable across
	// restarts of one berthd, so a retried insert whose answer was lost is recognised as its
	// own. Empty means "dispatcher".
	ID string
	// Logger receives one line per step that recorded missed or skipped fire times. Nil
	// discards.
	Logger *slog.Logger
}

// Dispatcher records the fire times of scheduled jobs (docs/jobs.md section 4). It is safe for
// concurrent use, and several dispatchers (in one or several processes) may step the same job at
// once: each fire time is recorded exactly once.
type Dispatcher struct {
	st  *store.Store
	id  string
	log *slog.Logger
}

// NewDispatcher returns a dispatcher over cfg.Store.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	if cfg.Store == nil {
		return nil, errors.New("jobs: a dispatcher needs a store")
	}
	if cfg.ID == "" {
		cfg.ID = "dispatcher"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{st: cfg.Store, id: cfg.ID, log: cfg.Logger}, nil
}

// StepResult is what one [Dispatcher.Step] recorded.
type StepResult struct {
	// Owned are the pending runs this dispatcher recorded (or had recorded in a try whose
	// answer was lost): it owns placing them. At most one per step.
	Owned []Run
	// Missed counts the fire times this step recorded missed.
	Missed int
	// Existing counts the fire times of the plan someone else had recorded already (another
	// dispatcher, or an earlier try of this step).
	Existing int
	// Skipped and SkippedThrough are [FirePlan.Skipped] and [FirePlan.SkippedThrough]: fire
	// times not recorded one by one.
	Skipped        int
	SkippedThrough time.Time
	// Next is the job's first fire time after now: when a step next has work.
	Next time.Time
}

// Step records job's fire times due at now, in three steps, each idempotent:
//
//  1. read the job's cursor by _id (the latest fire time recorded; job.Created when none);
//  2. [Plan] from it, and insert one run per planned fire time, oldest first: missed ones in
//     state missed, the due one (if any) pending. An insert that finds its _id taken means the
//     fire time is owned already and is counted in Existing;
//  3. move the cursor forward to the plan's cursor (a compare-and-set that never moves it back).
//
// A step that fails part way may be repeated with the same now: it records nothing twice. Two
// dispatchers stepping at once record each fire time once between them; which of them owns a
// pending run is the one whose insert landed. Errors: wrapping [ErrInvalid] for a refused
// schedule or deadline, or the store's error.
func (d *Dispatcher) Step(ctx context.Context, job Job, now time.Time) (StepResult, error) {
	sched, err := job.Schedule.Compile()
	if err != nil {
		return StepResult{}, fmt.Errorf("jobs: step %s: %w", job.ID, err)
	}
	var cur cursorDoc
	last := job.Created
	switch err := d.st.Get(ctx, CursorsCollection, job.ID, &cur); {
	case err == nil:
		last = cur.LastFire
	case !errors.Is(err, store.ErrNotFound):
		return StepResult{}, fmt.Errorf("jobs: step %s: read cursor: %w", job.ID, err)
	}
	plan, err := Plan(PlanInput{Schedule: sched, Last: last, Now: now, StartingDeadline: job.StartingDeadline})
	if err != nil {
		return StepResult{}, fmt.Errorf("jobs: step %s: %w", job.ID, err)
	}
	res, err := d.Record(ctx, job.ID, plan, now)
	if err != nil {
		return res, err
	}
	if err := d.advance(ctx, job.ID, plan.Cursor); err != nil {
		return res, err
	}
	if res.Missed > 0 || res.Skipped > 0 {
		d.log.Info("job fire times missed", "job", job.ID, "missed", res.Missed, "skipped", res.Skipped,
			"skipped_through", res.SkippedThrough, "due", len(res.Owned) > 0)
	}
	return res, nil
}

// Record inserts the runs of plan for job, oldest first: each of plan.Missed in state missed,
// plan.Due (when set) pending, recorded by this dispatcher at now. A fire time whose run exists
// is left as it is and counted in Existing, except a pending run this dispatcher recorded
// itself, which is returned in Owned again (its earlier insert's answer was lost). It does not
// move the job's cursor ([Dispatcher.Step] does). Idempotent; one insert per fire time.
func (d *Dispatcher) Record(ctx context.Context, job string, plan FirePlan, now time.Time) (StepResult, error) {
	res := StepResult{Skipped: plan.Skipped, SkippedThrough: plan.SkippedThrough, Next: plan.Next}
	for _, fire := range plan.Missed {
		inserted, _, err := d.insert(ctx, job, fire, RunMissed, now)
		if err != nil {
			return res, err
		}
		if inserted {
			res.Missed++
		} else {
			res.Existing++
		}
	}
	if !plan.Due.IsZero() {
		inserted, run, err := d.insert(ctx, job, plan.Due, RunPending, now)
		if err != nil {
			return res, err
		}
		switch {
		case inserted:
			res.Owned = append(res.Owned, run)
		case run.RecordedBy == d.id && run.State == RunPending:
			res.Owned = append(res.Owned, run)
			res.Existing++
		default:
			res.Existing++
		}
	}
	return res, nil
}

// insert records job's run for fire in state. It reports whether this call inserted it; when
// the _id was taken it returns the stored run instead.
func (d *Dispatcher) insert(ctx context.Context, job string, fire time.Time, state RunState, now time.Time) (bool, Run, error) {
	run := Run{ID: RunID(job, fire), Job: job, FireTime: fire.UTC(), State: state, RecordedAt: now.UTC(), RecordedBy: d.id, Trigger: TriggerSchedule}
	err := d.st.Insert(ctx, RunsCollection, run)
	if err == nil {
		return true, run, nil
	}
	if !store.IsDuplicateKey(err) {
		return false, Run{}, fmt.Errorf("jobs: record run %s: %w", run.ID, err)
	}
	var stored Run
	if state == RunPending { // only a due run may be ours to place: read who holds it
		if err := d.st.Get(ctx, RunsCollection, run.ID, &stored); err != nil {
			return false, Run{}, fmt.Errorf("jobs: read recorded run %s: %w", run.ID, err)
		}
	}
	return false, stored, nil
}

// errCursorMoved is the conflict advance retries on: another dispatcher created or moved the
// cursor between this one's read and write.
var errCursorMoved = errors.New("jobs: cursor moved")

// advance moves job's cursor forward to to; never back. One compare-and-set on the cursor
// document, retried with the store's one retry policy when another dispatcher wins the race.
func (d *Dispatcher) advance(ctx context.Context, job string, to time.Time) error {
	if to.IsZero() {
		return nil
	}
	err := store.RetryOnConflict(ctx, func() error {
		var cur cursorDoc
		err := d.st.Get(ctx, CursorsCollection, job, &cur)
		if errors.Is(err, store.ErrNotFound) {
			err = d.st.Insert(ctx, CursorsCollection, cursorDoc{ID: job, LastFire: to.UTC()})
			if store.IsDuplicateKey(err) {
				return errCursorMoved
			}
			return err
		}
		if err != nil {
			return err
		}
		if !cur.LastFire.Before(to) {
			return nil
		}
		_, err = d.st.SetIfRevision(ctx, CursorsCollection, job, cur.Revision, store.Fields{"last_fire": to.UTC()})
		if errors.Is(err, store.ErrConflict) {
			return errCursorMoved
		}
		return err
	}, errCursorMoved)
	if err != nil {
		return fmt.Errorf("jobs: advance cursor of %s to %s: %w", job, to.UTC().Format(time.RFC3339), err)
	}
	return nil
}
