package jobs_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/berthhq/berth/core/jobs"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// In 2026 Europe/Berlin springs forward on 29 March (02:00 CET becomes 03:00 CEST, 01:00Z) and
// falls back on 25 October (03:00 CEST becomes 02:00 CET, 01:00Z: 02:00-02:59 twice);
// America/New_York springs forward on 8 March (02:00 EST becomes 03:00 EDT, 07:00Z) and falls
// back on 1 November (02:00 EDT becomes 01:00 EST, 06:00Z: 01:00-01:59 twice).
var nextCases = []struct {
	name, cron, zone, after, want string
}{
	{"utc by default", "0 3 * * *", "", "2026-03-28T12:00:00Z", "2026-03-29T03:00:00Z"},
	{"berlin ordinary day", "30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", "2026-03-28T01:30:00Z"},
	{"berlin gap fires when the gap ends", "30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
	{"berlin after the gap fire, the next day", "30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
	{"berlin several gap times fire once", "*/15 2 * * *", "Europe/Berlin", "2026-03-29T00:50:00Z", "2026-03-29T01:00:00Z"},
	{"berlin several gap times, then the next day", "*/15 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"},
	{"berlin gap time and the hour after fire once together", "0 2,3 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"},
	{"berlin 03:00 exists on the spring day", "0 3 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
	{"berlin hourly skips no real hour in spring", "0 * * * *", "Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z"},
	{"berlin fall-back fires at the first pass", "30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z"},
	{"berlin fall-back does not fire again", "30 2 * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
	{"berlin asked inside the second pass", "30 2 * * *", "Europe/Berlin", "2026-10-25T01:10:00Z", "2026-10-26T01:30:00Z"},
	{"berlin every minute of hour 2 stops after the first pass", "* 2 * * *", "Europe/Berlin", "2026-10-25T00:59:00Z", "2026-10-26T01:00:00Z"},
	{"berlin hourly fires in both passes", "0 * * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z"},
	{"berlin daily midnight unaffected", "@daily", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-25T23:00:00Z"},
	{"new york gap fires when the gap ends", "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z"},
	{"new york after the gap fire", "30 2 * * *", "America/New_York", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"},
	{"new york hourly in spring", "0 * * * *", "America/New_York", "2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z"},
	{"new york fall-back fires at the first pass", "30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", "2026-11-01T05:30:00Z"},
	{"new york fall-back does not fire again", "30 1 * * *", "America/New_York", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
	{"new york asked inside the second pass", "30 1 * * *", "America/New_York", "2026-11-01T06:10:00Z", "2026-11-02T06:30:00Z"},
	{"new york half-hourly fires in both passes", "*/30 * * * *", "America/New_York", "2026-11-01T05:45:00Z", "2026-11-01T06:00:00Z"},
	{"leap day in utc", "0 12 29 2 *", "", "2026-03-01T00:00:00Z", "2028-02-29T12:00:00Z"},
	{"leap day in berlin", "0 12 29 2 *", "Europe/Berlin", "2026-03-01T00:00:00Z", "2028-02-29T11:00:00Z"},
	{"leap day to the next leap day", "0 12 29 2 *", "", "2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"},
	{"every 2s from a whole second", "@every 2s", "", "2026-12-02T10:00:00Z", "2026-12-02T10:00:02Z"},
	{"every 2s from between fire times", "@every 2s", "", "2026-12-02T10:00:01.5Z", "2026-12-02T10:00:02Z"},
	{"every 2s from an odd second", "@every 2s", "Europe/Berlin", "2026-12-02T10:00:03Z", "2026-12-02T10:00:04Z"},
	{"every 2s across the berlin gap", "@every 2s", "Europe/Berlin", "2026-03-29T00:59:59Z", "2026-03-29T01:00:00Z"},
	{"every 1m is on the minute", "@every 1m", "", "2026-12-02T10:00:59.999Z", "2026-12-02T10:01:00Z"},
	{"sub-second after rounds down", "0 3 * * *", "", "2026-03-29T02:59:59.9Z", "2026-03-29T03:00:00Z"},
	{"berlin 02:00 in the gap fires when the gap ends", "0 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
	{"berlin 01:59 before the gap is unaffected", "59 1 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T00:59:00Z"},
	{"berlin 02:00 in the fall-back hour fires at its first pass", "0 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T00:00:00Z"},
	{"berlin 02:00 fall-back, then the next day", "0 2 * * *", "Europe/Berlin", "2026-10-25T00:00:00Z", "2026-10-26T01:00:00Z"},
	{"new york 02:00 in the gap fires when the gap ends", "0 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z"},
	{"new york 02:59 in the gap fires when the gap ends", "59 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z"},
	{"new york 01:00 in the fall-back hour fires at its first pass", "0 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", "2026-11-01T05:00:00Z"},
	{"new york 01:00 fall-back, then the next day", "0 1 * * *", "America/New_York", "2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"},
	{"leap day in new york", "30 23 29 2 *", "America/New_York", "2027-03-01T00:00:00Z", "2028-03-01T04:30:00Z"},
	{"the 29th skips february of a common year", "0 0 29 * *", "", "2027-01-29T00:00:00Z", "2027-03-29T00:00:00Z"},
	{"the 29th of february of a leap year", "0 0 29 * *", "", "2028-01-29T00:00:00Z", "2028-02-29T00:00:00Z"},
	{"every 1h into a leap day", "@every 1h", "", "2028-02-28T23:30:00Z", "2028-02-29T00:00:00Z"},
	{"every 1h out of a leap day", "@every 1h", "America/New_York", "2028-02-29T23:59:59Z", "2028-03-01T00:00:00Z"},
	{"every 90m is on epoch multiples, not the hour", "@every 90m", "", "2026-12-02T10:00:00Z", "2026-12-02T10:30:00Z"},
}

func TestNext(t *testing.T) {
	t.Parallel()
	for _, tc := range nextCases {
		t.Run(tc.name, func(t *testing.T) {
			got := jobs.Next(jobs.Schedule{Cron: tc.cron, TimeZone: tc.zone}, utc(tc.after))
			if want := utc(tc.want); !got.Equal(want) {
				t.Errorf("Next(%q in %q, %s) = %s, want %s", tc.cron, tc.zone, tc.after, got.Format(time.RFC3339), tc.want)
			}
			if got.Location() != time.UTC {
				t.Errorf("Next returned %s in %s, want UTC", got, got.Location())
			}
		})
	}
}

// TestNextSequenceAcrossTransitions walks a whole year of fire times of fixed-time schedules and
// checks each wall time fires exactly once per day and fire times strictly increase.
func TestNextSequenceAcrossTransitions(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"Europe/Berlin", "America/New_York"} {
		for _, spec := range []string{"30 2 * * *", "30 1 * * *", "0 0 * * *"} {
			c, err := jobs.Schedule{Cron: spec, TimeZone: zone}.Compile()
			if err != nil {
				t.Fatal(err)
			}
			from := utc("2026-01-01T00:00:00Z")
			prev := from
			n := 0
			for range 400 {
				next := c.Next(prev)
				if !next.After(prev) {
					t.Fatalf("%s in %s: Next(%s) = %s does not advance", spec, zone, prev, next)
				}
				if next.Year() > 2026 {
					break
				}
				prev = next
				n++
			}
			if n != 365 {
				t.Errorf("%s in %s fired %d times in 2026, want 365 (once a day)", spec, zone, n)
			}
		}
	}
}

// TestEveryIgnoresDaylightSaving: "@every 1h" fires every real hour, 25 times over the New York
// fall-back day and 23 times over the Berlin spring-forward day, whatever the zone.
func TestEveryIgnoresDaylightSaving(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		zone, day string
		want      int
	}{{"America/New_York", "2026-11-01", 25}, {"Europe/Berlin", "2026-03-29", 23}, {"Europe/Berlin", "2026-10-25", 25}} {
		loc, err := time.LoadLocation(tc.zone)
		if err != nil {
			t.Fatal(err)
		}
		start, _ := time.ParseInLocation("2006-01-02", tc.day, loc)
		end := start.AddDate(0, 0, 1)
		c := compile(t, "@every 1h", tc.zone)
		n := 0
		for f := c.Next(start.Add(-time.Second)); f.Before(end) && n < 100; f = c.Next(f) {
			n++
		}
		if n != tc.want {
			t.Errorf("@every 1h in %s on %s fired %d times, want %d", tc.zone, tc.day, n, tc.want)
		}
	}
}

// TestRobfigDiffers records where robfig/cron's own Next breaks the rules Next implements: the
// reason Next searches wall-clock time itself.
func TestRobfigDiffers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, spec, after, ours string }{
		{"berlin gap", "CRON_TZ=Europe/Berlin 30 2 * * *", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"},
		{"new york gap", "CRON_TZ=America/New_York 30 2 * * *", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z"},
		{"berlin fall-back second pass", "CRON_TZ=Europe/Berlin 30 2 * * *", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
		{"new york fall-back second pass", "CRON_TZ=America/New_York 30 1 * * *", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
	} {
		s, err := cron.ParseStandard(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		theirs := s.Next(utc(tc.after)).UTC()
		t.Logf("%s: robfig/cron fires at %s, the rule says %s", tc.name, theirs.Format(time.RFC3339), tc.ours)
		if theirs.Equal(utc(tc.ours)) {
			t.Errorf("%s: robfig/cron now agrees with the rule (%s); Next's own search may be unnecessary", tc.name, theirs)
		}
	}
}

func TestScheduleValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s  jobs.Schedule
		ok bool
	}{
		{jobs.Schedule{Cron: "0 3 * * *"}, true},
		{jobs.Schedule{Cron: "@every 2s"}, true},
		{jobs.Schedule{Cron: "@hourly", TimeZone: "Europe/Berlin"}, true},
		{jobs.Schedule{Cron: ""}, false},
		{jobs.Schedule{Cron: "CRON_TZ=Europe/Berlin 0 3 * * *"}, false},
		{jobs.Schedule{Cron: "TZ=UTC 0 3 * * *"}, false},
		{jobs.Schedule{Cron: "0 3 * * *", TimeZone: "Local"}, false},
		{jobs.Schedule{Cron: "0 3 * * *", TimeZone: "Mars/Olympus"}, false},
		{jobs.Schedule{Cron: "61 3 * * *"}, false},
		{jobs.Schedule{Cron: "0 0 3 * * *"}, false}, // six fields: seconds are not taken
	} {
		err := tc.s.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.s, err, tc.ok)
		}
		if err != nil && !errors.Is(err, jobs.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, does not wrap ErrInvalid", tc.s, err)
		}
		if !tc.ok && !jobs.Next(tc.s, utc("2026-01-01T00:00:00Z")).IsZero() {
			t.Errorf("Next of invalid %+v is not zero", tc.s)
		}
	}
}

// TestNextAgainstReference compares Next, around both transitions of two zones, with a
// brute-force reading of the rules over every minute: a schedule whose hour field is "*" fires
// at each minute instant whose local time matches; any other fires, for each matching wall-clock
// minute, at the first instant whose local time is that minute or later (its only or first
// occurrence, or the end of the gap that skips it).
func TestNextAgainstReference(t *testing.T) {
	t.Parallel()
	specs := []string{"30 2 * * *", "*/15 2 * * *", "0 * * * *", "*/30 * * * *", "0 1-3 * * *", "* 2 * * *", "45 1,2 * * *", "0 */2 * * *", "59 1 * * *", "0 3 * * *"}
	windows := []struct{ zone, day string }{
		{"Europe/Berlin", "2026-03-28"}, {"Europe/Berlin", "2026-10-24"},
		{"America/New_York", "2026-03-07"}, {"America/New_York", "2026-10-31"},
	}
	for _, w := range windows {
		loc, err := time.LoadLocation(w.zone)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := time.ParseInLocation("2006-01-02", w.day, loc)
		start, end := d, d.AddDate(0, 0, 3) // three local days with the transition in the middle
		var instants []time.Time
		for i := start; i.Before(end); i = i.Add(time.Minute) {
			instants = append(instants, i.UTC())
		}
		wallOf := func(i time.Time) time.Time {
			l := i.In(loc)
			return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), 0, 0, time.UTC)
		}
		for _, spec := range specs {
			parsed, err := cron.ParseStandard(spec)
			if err != nil {
				t.Fatal(err)
			}
			ref := *parsed.(*cron.SpecSchedule)
			ref.Location = time.UTC
			matches := func(wall time.Time) bool { return ref.Next(wall.Add(-time.Second)).Equal(wall) }
			hourStar := strings.HasPrefix(strings.Fields(spec)[1], "*") && !strings.Contains(strings.Fields(spec)[1], "/")

			want := map[time.Time]bool{}
			if hourStar {
				for _, i := range instants {
					if matches(wallOf(i)) {
						want[i] = true
					}
				}
			} else {
				for c := wallOf(start); c.Before(wallOf(end)); c = c.Add(time.Minute) {
					if !matches(c) {
						continue
					}
					for _, i := range instants {
						if !wallOf(i).Before(c) {
							want[i] = true
							break
						}
					}
				}
			}
			var got []time.Time
			c := compile(t, spec, w.zone)
			for f := c.Next(start.Add(-time.Second)); f.Before(end) && len(got) < 5000; f = c.Next(f) {
				got = append(got, f)
			}
			gotSet := map[time.Time]bool{}
			for _, f := range got {
				gotSet[f] = true
				if !want[f] {
					t.Errorf("%s in %s around %s: Next fires at %s (%s), the rules do not", spec, w.zone, w.day, f.Format(time.RFC3339), f.In(loc).Format("15:04 MST"))
				}
			}
			for f := range want {
				if !gotSet[f] {
					t.Errorf("%s in %s around %s: the rules fire at %s (%s), Next does not", spec, w.zone, w.day, f.Format(time.RFC3339), f.In(loc).Format("15:04 MST"))
				}
			}
		}
	}
}

func TestNextNever(t *testing.T) {
	t.Parallel()
	if got := jobs.Next(jobs.Schedule{Cron: "0 0 30 2 *"}, utc("2026-01-01T00:00:00Z")); !got.IsZero() {
		t.Errorf("30 February fires at %s", got)
	}
}
