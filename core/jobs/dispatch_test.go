package jobs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// fires is how many fire times of "@every 2s" the race test steps through.
const fires = 200

func newDispatcher(t *testing.T, st *store.Store, id string) *jobs.Dispatcher {
	t.Helper()
	d, err := jobs.NewDispatcher(jobs.DispatcherConfig{Store: st, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func allRuns(ctx context.Context, t *testing.T, st *store.Store) map[string]jobs.Run {
	t.Helper()
	var runs []jobs.Run
	if err := st.All(ctx, jobs.RunsCollection, &runs); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]jobs.Run, len(runs))
	for _, r := range runs {
		if _, dup := out[r.ID]; dup {
			t.Fatalf("run %s is stored twice", r.ID)
		}
		out[r.ID] = r
	}
	return out
}

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDispatchersRaceExactlyOnce: two dispatchers step the same "@every 2s" job through 200 fire
// times at once, each with its own injected clock; every fire time is recorded exactly once,
// pending, owned by exactly one of them.
func TestDispatchersRaceExactlyOnce(t *testing.T) {
	ctx := testCtx(t)
	st := storetest.Open(t)
	t0 := utc("2026-12-02T10:00:00Z")
	job := jobs.Job{ID: "report", Schedule: jobs.Schedule{Cron: "@every 2s"}, Created: t0}

	owned := make([]map[string]bool, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w, id := range []string{"a", "b"} {
		owned[w] = map[string]bool{}
		d := newDispatcher(t, st, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 1; i <= fires; i++ {
				res, err := d.Step(ctx, job, t0.Add(time.Duration(2*i)*time.Second))
				if err != nil {
					errs[w] = err
					return
				}
				for _, r := range res.Owned {
					if owned[w][r.ID] {
						errs[w] = &ownedTwice{r.ID}
						return
					}
					owned[w][r.ID] = true
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	runs := allRuns(ctx, t, st)
	if len(runs) != fires {
		t.Fatalf("%d runs recorded, want %d", len(runs), fires)
	}
	for i := 1; i <= fires; i++ {
		id := jobs.RunID(job.ID, t0.Add(time.Duration(2*i)*time.Second))
		r, ok := runs[id]
		if !ok {
			t.Fatalf("fire time %s has no run", id)
		}
		if r.State != jobs.RunPending {
			t.Errorf("run %s is %s, want pending", id, r.State)
		}
		a, b := owned[0][id], owned[1][id]
		if a == b {
			t.Errorf("run %s owned by a: %v, by b: %v; want exactly one", id, a, b)
		}
		if want := map[bool]string{true: "a", false: "b"}[a]; r.RecordedBy != want {
			t.Errorf("run %s recorded by %q, but %q owns it", id, r.RecordedBy, want)
		}
	}
	t.Logf("a owns %d runs, b owns %d", len(owned[0]), len(owned[1]))
}

type ownedTwice struct{ id string }

func (e *ownedTwice) Error() string { return "run " + e.id + " returned as owned twice" }

// TestDispatcherAfterDowntime: a dispatcher restarted after 1000 s of downtime records the 499
// fire times it slept through as missed and runs only the latest; a step repeated after a crash
// between recording and moving the cursor records nothing twice and hands the pending run back
// to the dispatcher that recorded it, and to no other.
func TestDispatcherAfterDowntime(t *testing.T) {
	ctx := testCtx(t)
	st := storetest.Open(t)
	t0 := utc("2026-12-02T10:00:00Z")
	job := jobs.Job{ID: "sweep", Schedule: jobs.Schedule{Cron: "@every 2s"}, Created: t0}

	before := newDispatcher(t, st, "core-1")
	for i := 1; i <= 10; i++ {
		if _, err := before.Step(ctx, job, t0.Add(time.Duration(2*i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	down := t0.Add(20 * time.Second)
	now := down.Add(1000 * time.Second)

	// The restarted dispatcher (same id) records its plan, then "crashes" before moving the cursor.
	after := newDispatcher(t, st, "core-1")
	sched, _ := job.Schedule.Compile()
	plan, err := jobs.Plan(jobs.PlanInput{Schedule: sched, Last: down, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	res, err := after.Record(ctx, job.ID, plan, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Missed != 499 || len(res.Owned) != 1 || res.Existing != 0 {
		t.Fatalf("first record: %d missed, %d owned, %d existing; want 499, 1, 0", res.Missed, len(res.Owned), res.Existing)
	}

	check := func(when string) {
		t.Helper()
		runs := allRuns(ctx, t, st)
		if len(runs) != 510 {
			t.Fatalf("%s: %d runs, want 510", when, len(runs))
		}
		for i := 1; i <= 510; i++ {
			fire := t0.Add(time.Duration(2*i) * time.Second)
			r := runs[jobs.RunID(job.ID, fire)]
			want := jobs.RunMissed
			if i <= 10 || i == 510 {
				want = jobs.RunPending
			}
			if r.State != want {
				t.Fatalf("%s: run at %s is %q, want %q", when, fire.Format(time.RFC3339), r.State, want)
			}
		}
	}
	check("after the first record")

	// Another dispatcher stepping the same instant finds every fire time owned.
	other := newDispatcher(t, st, "core-2")
	res, err = other.Record(ctx, job.ID, plan, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Missed != 0 || len(res.Owned) != 0 || res.Existing != 500 {
		t.Fatalf("another dispatcher: %d missed, %d owned, %d existing; want 0, 0, 500", res.Missed, len(res.Owned), res.Existing)
	}

	// The retried step: nothing new, the pending run is still this dispatcher's, the cursor moves.
	res, err = after.Step(ctx, job, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Missed != 0 || len(res.Owned) != 1 || res.Owned[0].ID != jobs.RunID(job.ID, now) || res.Existing != 500 {
		t.Fatalf("retried step: %d missed, owned %v, %d existing; want 0, [%s], 500", res.Missed, res.Owned, res.Existing, jobs.RunID(job.ID, now))
	}
	check("after the retried step")

	// With the cursor moved, a further step at the same instant plans nothing.
	res, err = other.Step(ctx, job, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Missed != 0 || len(res.Owned) != 0 || res.Existing != 0 {
		t.Fatalf("step after the cursor moved: %+v; want nothing", res)
	}
	check("after a step at the same instant")
}

// TestDispatcherLatestPastDeadline: after an outage longer than the starting deadline, a cron
// job's latest fire time is recorded missed too, and nothing runs.
func TestDispatcherLatestPastDeadline(t *testing.T) {
	ctx := testCtx(t)
	st := storetest.Open(t)
	t0 := utc("2026-12-02T10:00:00Z")
	job := jobs.Job{ID: "hourly", Schedule: jobs.Schedule{Cron: "0 * * * *"}, Created: t0.Add(-90 * time.Minute)}
	d := newDispatcher(t, st, "core-1")
	res, err := d.Step(ctx, job, t0.Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res.Missed != 2 || len(res.Owned) != 0 {
		t.Fatalf("%d missed, %d owned; want 2 missed, none owned", res.Missed, len(res.Owned))
	}
	runs := allRuns(ctx, t, st)
	for _, fire := range []time.Time{t0.Add(-time.Hour), t0} {
		if r := runs[jobs.RunID(job.ID, fire)]; r.State != jobs.RunMissed {
			t.Errorf("run at %s is %q, want missed", fire, r.State)
		}
	}
	if len(runs) != 2 {
		t.Errorf("%d runs, want 2", len(runs))
	}
}
