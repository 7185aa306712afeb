// Package jobs owns when a job fires and the record that makes each fire time run at most once:
// the fire-time function over cron schedules with a time zone, and the run documents in job_runs.
package jobs

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// ErrInvalid is returned (wrapped) by [Schedule.Validate], [Schedule.Compile] and [Plan] when a
// schedule, a time zone or a starting deadline is refused; the message says which and why.
var ErrInvalid = abierrors.New(abierrors.ValidationFailed, "invalid job schedule")

// starBit is robfig/cron's marker of a field written as "*" or "?" (every value, no step).
const starBit = 1 << 63

// maxSegments bounds how many constant-offset stretches of a time zone [Compiled.Next] walks
// before it gives up: about two a year in zones with daylight saving, and robfig/cron's own
// search gives up after five years.
const maxSegments = 64

// Schedule is a job's `schedule` and `time_zone` (docs/jobs.md section 1).
type Schedule struct {
	// Cron is a five-field cron expression ("30 2 * * *"), a descriptor ("@daily", "@hourly")
	// or "@every <duration>" ("@every 2s"; whole seconds, at least one). Required. A
	// "CRON_TZ=" or "TZ=" prefix is refused: the zone goes in TimeZone.
	Cron string `json:"schedule" bson:"schedule"`
	// TimeZone is the IANA zone the cron fields are read in ("Europe/Berlin"). Empty means UTC;
	// "Local" is refused (it would depend on the host berthd runs on). Ignored by "@every".
	TimeZone string `json:"time_zone,omitempty" bson:"time_zone,omitempty"`
}

// Validate reports why s is refused (wrapping [ErrInvalid]), or nil.
func (s Schedule) Validate() error {
	_, err := s.Compile()
	return err
}

// Compiled is a parsed [Schedule], ready to answer [Compiled.Next] many times. The zero value
// never fires.
type Compiled struct {
	spec  *cron.SpecSchedule // nil for @every; Location is UTC: it is searched in wall-clock time
	every time.Duration      // > 0 for @every
	loc   *time.Location
	// wall reports whether the hour field names hours (not "*"): such a schedule fires once per
	// wall-clock time, at the end of a spring-forward gap when that time does not exist; one
	// whose hour is "*" fires at every instant whose local time matches (docs/jobs.md section 3).
	wall bool
}

// Compile parses s. Errors wrap [ErrInvalid].
func (s Schedule) Compile() (Compiled, error) {
	spec := strings.TrimSpace(s.Cron)
	if spec == "" {
		return Compiled{}, fmt.Errorf("schedule is empty: %w", ErrInvalid)
	}
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return Compiled{}, fmt.Errorf("schedule %q: give the zone in time_zone, not as a prefix: %w", s.Cron, ErrInvalid)
	}
	loc := time.UTC
	if s.TimeZone != "" {
		if s.TimeZone == "Local" {
			return Compiled{}, fmt.Errorf("time_zone %q depends on the host: name an IANA zone: %w", s.TimeZone, ErrInvalid)
		}
		l, err := time.LoadLocation(s.TimeZone)
		if err != nil {
			return Compiled{}, fmt.Errorf("time_zone %q: %w: %w", s.TimeZone, ErrInvalid, err)
		}
		loc = l
	}
	parsed, err := cron.ParseStandard(spec)
	if err != nil {
		return Compiled{}, fmt.Errorf("schedule %q: %w: %w", s.Cron, ErrInvalid, err)
	}
	switch p := parsed.(type) {
	case cron.ConstantDelaySchedule:
		if p.Delay < time.Second {
			return Compiled{}, fmt.Errorf("schedule %q: @every needs at least one second: %w", s.Cron, ErrInvalid)
		}
		return Compiled{every: p.Delay, loc: loc}, nil
	case *cron.SpecSchedule:
		c := *p
		c.Location = time.UTC
		return Compiled{spec: &c, loc: loc, wall: c.Hour&starBit == 0}, nil
	default:
		return Compiled{}, fmt.Errorf("schedule %q: parsed to an unexpected %T: %w", s.Cron, parsed, ErrInvalid)
	}
}

// Next returns the first fire time of spec strictly after after, in UTC, or the zero time when
// spec is invalid ([Schedule.Validate] says why) or never fires again. It is pure; callers
// that ask many times should [Schedule.Compile] once and call [Compiled.Next].
func Next(spec Schedule, after time.Time) time.Time {
	c, err := spec.Compile()
	if err != nil {
		return time.Time{}
	}
	return c.Next(after)
}

// Next returns the first fire time strictly after after, in UTC, or the zero time when there is
// none (within about five years). Fire times are whole seconds. The rules (docs/jobs.md section 3):
//
//  1. "@every d" fires at the instants that are whole multiples of d since the Unix epoch, so
//     every dispatcher computes the same fire times whatever instant it asks from.
//  2. A schedule whose hour field is "*" fires at every instant whose wall-clock time in the
//     zone matches: both passes of a repeated (fall-back) hour, nothing for wall times a
//     spring-forward gap skips.
//  3. Any other schedule fires once per matching wall-clock time: a time inside a
//     spring-forward gap fires at the first instant after the gap (several such times fire
//     once, together); a time that occurs twice in a fall-back hour fires at its first
//     occurrence only.
//
// It is pure and safe for concurrent use.
func (c Compiled) Next(after time.Time) time.Time {
	if c.every > 0 {
		d := c.every.Nanoseconds()
		n := after.UnixNano()
		k := n / d
		if n < 0 && n%d != 0 {
			k-- // floor division for instants before 1970
		}
		return time.Unix(0, (k+1)*d).UTC()
	}
	if c.spec == nil {
		return time.Time{}
	}
	from := after.Truncate(time.Second)
	if from.After(after) { // Truncate rounds toward zero time; keep from <= after
		from = from.Add(-time.Second)
	}
	t := from.In(c.loc)
	start, end := t.ZoneBounds()
	_, off := t.Zone()
	lo := civil(from, off) // exclusive lower bound, in wall-clock time
	if c.wall && !start.IsZero() {
		// Wall times the previous stretch already showed (the second pass of a fall-back hour)
		// fired there.
		if prevEnd := civil(start, offsetAt(start.Add(-time.Second), c.loc)); prevEnd.Add(-time.Second).After(lo) {
			lo = prevEnd.Add(-time.Second)
		}
	}
	for range maxSegments {
		m := c.spec.Next(lo)
		if m.IsZero() {
			return time.Time{}
		}
		if end.IsZero() {
			return m.Add(-time.Duration(off) * time.Second).UTC()
		}
		hi := civil(end, off) // exclusive upper bound of this stretch
		if m.Before(hi) {
			return m.Add(-time.Duration(off) * time.Second).UTC()
		}
		nextOff := offsetAt(end, c.loc)
		nextLo := civil(end, nextOff)
		if c.wall && nextLo.After(hi) && m.Before(nextLo) {
			// m is a wall time inside the gap [hi, nextLo): it fires when the gap ends.
			return end.UTC()
		}
		lo = nextLo.Add(-time.Second)
		if c.wall && hi.After(nextLo) {
			lo = hi.Add(-time.Second) // the repeated wall times fired in the previous stretch
		}
		t = end.In(c.loc)
		off = nextOff
		_, end = t.ZoneBounds()
	}
	return time.Time{}
}

// civil returns the wall-clock time of instant t at offset off (seconds east of UTC), written
// as a UTC time: wall-clock arithmetic without daylight saving.
func civil(t time.Time, off int) time.Time {
	return t.UTC().Add(time.Duration(off) * time.Second)
}

// offsetAt returns loc's offset at instant t, in seconds east of UTC.
func offsetAt(t time.Time, loc *time.Location) int {
	_, off := t.In(loc).Zone()
	return off
}
