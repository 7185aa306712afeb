package jobs_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthhq/berth/core/jobs"
)

func compile(t *testing.T, spec, zone string) jobs.Compiled {
	t.Helper()
	c, err := jobs.Schedule{Cron: spec, TimeZone: zone}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPlan(t *testing.T) {
	t.Parallel()
	t0 := utc("2026-12-02T10:00:00Z")
	every2 := compile(t, "@every 2s", "")
	hourly := compile(t, "0 * * * *", "")
	for _, tc := range []struct {
		name       string
		in         jobs.PlanInput
		due        time.Time
		missed     int
		firstMiss  time.Time
		cursor     time.Time
		skipped    int
		skippedThr time.Time
	}{
		{name: "a new job starts at now", in: jobs.PlanInput{Schedule: every2, Now: t0}, cursor: t0},
		{name: "nothing new", in: jobs.PlanInput{Schedule: every2, Last: t0, Now: t0.Add(time.Second)}, cursor: t0},
		{name: "cursor ahead of the clock", in: jobs.PlanInput{Schedule: every2, Last: t0.Add(time.Minute), Now: t0}, cursor: t0.Add(time.Minute)},
		{name: "one fire time", in: jobs.PlanInput{Schedule: every2, Last: t0, Now: t0.Add(2 * time.Second)},
			due: t0.Add(2 * time.Second), cursor: t0.Add(2 * time.Second)},
		{name: "downtime: only the latest runs", in: jobs.PlanInput{Schedule: every2, Last: t0, Now: t0.Add(1000 * time.Second)},
			due: t0.Add(1000 * time.Second), missed: 499, firstMiss: t0.Add(2 * time.Second), cursor: t0.Add(1000 * time.Second)},
		{name: "latest older than the default deadline", in: jobs.PlanInput{Schedule: hourly, Last: t0.Add(-2 * time.Hour), Now: t0.Add(30 * time.Minute)},
			missed: 2, firstMiss: t0.Add(-time.Hour), cursor: t0},
		{name: "latest exactly at the deadline runs", in: jobs.PlanInput{Schedule: hourly, Last: t0.Add(-2 * time.Hour), Now: t0.Add(300 * time.Second)},
			due: t0, missed: 1, firstMiss: t0.Add(-time.Hour), cursor: t0},
		{name: "a job's own deadline", in: jobs.PlanInput{Schedule: hourly, Last: t0.Add(-time.Hour), Now: t0.Add(61 * time.Second), StartingDeadline: time.Minute},
			missed: 1, firstMiss: t0, cursor: t0},
		{name: "a long outage of every 1s is bounded", in: jobs.PlanInput{Schedule: compile(t, "@every 1s", ""), Last: t0.Add(-72 * time.Hour), Now: t0},
			due: t0, missed: jobs.MaxRecordsPerStep - 1, firstMiss: t0.Add(-(jobs.MaxRecordsPerStep - 1) * time.Second), cursor: t0,
			skipped: 72*3600 - jobs.MaxRecordsPerStep, skippedThr: t0.Add(-jobs.MaxRecordsPerStep * time.Second)},
		{name: "a long outage of a cron job", in: jobs.PlanInput{Schedule: hourly, Last: t0.Add(-72 * time.Hour), Now: t0.Add(10 * time.Second)},
			due: t0, missed: 47, firstMiss: t0.Add(-47 * time.Hour), cursor: t0, skipped: 1, skippedThr: t0.Add(10*time.Second - jobs.CatchUp)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := jobs.Plan(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !p.Due.Equal(tc.due) {
				t.Errorf("Due = %s, want %s", p.Due, tc.due)
			}
			if len(p.Missed) != tc.missed {
				t.Errorf("%d missed, want %d", len(p.Missed), tc.missed)
			}
			if len(p.Missed) > 0 && !p.Missed[0].Equal(tc.firstMiss) {
				t.Errorf("first missed %s, want %s", p.Missed[0], tc.firstMiss)
			}
			for i := 1; i < len(p.Missed); i++ {
				if !p.Missed[i].After(p.Missed[i-1]) {
					t.Fatalf("missed out of order at %d: %s after %s", i, p.Missed[i], p.Missed[i-1])
				}
			}
			if n := len(p.Missed); n > 0 && !p.Due.IsZero() && !p.Due.After(p.Missed[n-1]) {
				t.Errorf("due %s is not after the last missed %s", p.Due, p.Missed[n-1])
			}
			if !p.Cursor.Equal(tc.cursor) {
				t.Errorf("Cursor = %s, want %s", p.Cursor, tc.cursor)
			}
			if p.Skipped != tc.skipped || !p.SkippedThrough.Equal(tc.skippedThr) {
				t.Errorf("skipped %d through %s, want %d through %s", p.Skipped, p.SkippedThrough, tc.skipped, tc.skippedThr)
			}
			if want := tc.in.Schedule.Next(tc.in.Now); !p.Next.Equal(want) {
				t.Errorf("Next = %s, want %s", p.Next, want)
			}
		})
	}
	if _, err := jobs.Plan(jobs.PlanInput{Schedule: every2, Last: t0, Now: t0.Add(time.Minute), StartingDeadline: -time.Second}); !errors.Is(err, jobs.ErrInvalid) {
		t.Errorf("negative deadline: %v, want ErrInvalid", err)
	}
}

func TestRunID(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	got := jobs.RunID("nightly", time.Date(2026, 12, 2, 4, 0, 0, 0, berlin))
	if want := "nightly@2026-12-02T03:00:00Z"; got != want {
		t.Errorf("RunID = %q, want %q", got, want)
	}
}

// TestPlanStepsCoverEveryFireTime: a run of steps at random instants (a fixed seed), each
// starting from the cursor the previous one returned, records every fire time of the schedule
// exactly once (missed or due), and a fire time is due only when it is the latest of its step
// and within the deadline.
func TestPlanStepsCoverEveryFireTime(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(38, 1))
	t0 := utc("2026-03-27T00:00:00Z")
	for _, s := range []jobs.Schedule{
		{Cron: "@every 2s"}, {Cron: "@every 7s"}, {Cron: "*/5 * * * *", TimeZone: "Europe/Berlin"},
		{Cron: "30 2 * * *", TimeZone: "Europe/Berlin"}, {Cron: "0 * * * *", TimeZone: "America/New_York"},
	} {
		c := compile(t, s.Cron, s.TimeZone)
		seen := map[time.Time]bool{}
		cursor, now := t0, t0
		for step := 0; step < 300; step++ {
			now = now.Add(time.Duration(rng.IntN(1800)) * time.Second)
			p, err := jobs.Plan(jobs.PlanInput{Schedule: c, Last: cursor, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			if p.Skipped != 0 {
				t.Fatalf("%s: step %d skipped %d", s.Cron, step, p.Skipped)
			}
			rec := append([]time.Time(nil), p.Missed...)
			if !p.Due.IsZero() {
				if now.Sub(p.Due) > jobs.DefaultStartingDeadline {
					t.Fatalf("%s: due %s is older than the deadline at %s", s.Cron, p.Due, now)
				}
				rec = append(rec, p.Due)
			}
			for _, f := range rec {
				if seen[f] {
					t.Fatalf("%s: fire time %s recorded twice", s.Cron, f)
				}
				if !f.After(cursor) || f.After(now) {
					t.Fatalf("%s: fire time %s outside (%s, %s]", s.Cron, f, cursor, now)
				}
				seen[f] = true
			}
			cursor = p.Cursor
		}
		n := 0
		for f := c.Next(t0); !f.After(cursor); f = c.Next(f) {
			if !seen[f] {
				t.Fatalf("%s: fire time %s was never recorded", s.Cron, f)
			}
			n++
		}
		if n != len(seen) {
			t.Fatalf("%s: %d fire times recorded, the schedule has %d up to the cursor", s.Cron, len(seen), n)
		}
	}
}
