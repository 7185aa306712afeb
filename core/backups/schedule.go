package backups

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/store"
)

// SchedulesCollection holds one document per scheduled service binding:
// the last scheduled time a backup was requested for and the last drill
// period.
const SchedulesCollection = "backup_schedules"

// DefaultKeep is how many settled backups a schedule keeps when Keep is 0.
const DefaultKeep = 24

// CatchUp bounds how far back a schedule looks for a missed time: a core
// that was down longer runs the latest missed backup once, never a storm.
const CatchUp = 48 * time.Hour

// Drill frequencies of a schedule.
const (
	DrillNone   = ""
	DrillDaily  = "daily"
	DrillWeekly = "weekly"
)

// Schedule is a service's `backup:` block (docs/backups.md section 4.3):
// `{cron: "0 3 * * *", keep: 24, drill: weekly}`.
type Schedule struct {
	// Cron is a standard five-field cron expression, in UTC; empty: no
	// scheduled backups (drills and keep still apply to backups on demand).
	Cron string `json:"cron,omitempty" bson:"cron"`
	// Keep is how many settled backups of each binding to keep; zero means
	// [DefaultKeep], negative is refused.
	Keep int `json:"keep,omitempty" bson:"keep"`
	// Drill is DrillNone, DrillDaily or DrillWeekly.
	Drill string `json:"drill,omitempty" bson:"drill"`
}

// Validate reports why s is refused (ErrInvalid), or nil.
func (s Schedule) Validate() error {
	if s.Cron != "" {
		if _, err := cron.ParseStandard(s.Cron); err != nil {
			return fmt.Errorf("backup.cron %q: %w: %w", s.Cron, ErrInvalid, err)
		}
	}
	if s.Keep < 0 || s.Keep > 1000 {
		return fmt.Errorf("backup.keep %d is outside 0 to 1000: %w", s.Keep, ErrInvalid)
	}
	switch s.Drill {
	case DrillNone, DrillDaily, DrillWeekly:
	default:
		return fmt.Errorf("backup.drill %q is not daily or weekly: %w", s.Drill, ErrInvalid)
	}
	return nil
}

// KeepOrDefault is Keep with zero read as DefaultKeep.
func (s Schedule) KeepOrDefault() int {
	if s.Keep == 0 {
		return DefaultKeep
	}
	return s.Keep
}

// Due returns the latest time of spec in (last, now], looking back at most
// [CatchUp] from now, and whether there is one. It is pure.
func Due(spec string, last, now time.Time) (time.Time, bool, error) {
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("backup.cron %q: %w: %w", spec, ErrInvalid, err)
	}
	from := last.UTC()
	if floor := now.UTC().Add(-CatchUp); from.Before(floor) {
		from = floor
	}
	var due time.Time
	// At most one time per minute of the catch-up window.
	for i := 0; i < int(CatchUp/time.Minute)+1; i++ {
		next := sched.Next(from)
		if next.IsZero() || next.After(now.UTC()) {
			break
		}
		due, from = next, next
	}
	return due, !due.IsZero(), nil
}

// DrillPeriod is the period a drill of frequency freq at now belongs to
// ("2026-12-01" daily, "2026-W49" weekly), or "" for none.
func DrillPeriod(freq string, now time.Time) string {
	switch freq {
	case DrillDaily:
		return now.UTC().Format("2006-01-02")
	case DrillWeekly:
		return ISOWeek(now)
	}
	return ""
}

// Scheduled is one service binding under a schedule, as the caller read it
// from the service's spec.
type Scheduled struct {
	ProjectID string
	Service   string
	Binding   string
	Kind      abibackups.Kind
	Schedule  Schedule
}

type scheduleDoc struct {
	ID          string    `bson:"_id"`
	Last        time.Time `bson:"last"`
	DrillPeriod string    `bson:"drill_period"`
}

func scheduleID(s Scheduled) string { return s.ProjectID + "/" + s.Service + "/" + s.Binding }

// Tick requests the backups and drills that are due at now for every
// service binding of list and returns how many it requested. Every request
// is idempotent (keys from the scheduled time and the drill period), so two
// cores ticking at once, or a tick repeated after a crash, converge on one
// operation each. A binding's error is logged and the others go on; the
// first one is returned.
func (m *Manager) Tick(ctx context.Context, list []Scheduled, now time.Time) (int, error) {
	coll := m.st.Collection(SchedulesCollection)
	var first error
	n := 0
	for _, s := range list {
		if err := s.Schedule.Validate(); err != nil {
			first = errors.Join(first, err)
			continue
		}
		var doc scheduleDoc
		err := store.FindByID(ctx, coll, scheduleID(s), &doc)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return n, fmt.Errorf("backups: schedule of %s: %w", scheduleID(s), err)
		}
		doc.ID = scheduleID(s)
		changed := false
		if s.Schedule.Cron != "" {
			last := doc.Last
			if last.IsZero() {
				last = now.Add(-time.Minute) // a new schedule starts now, it does not back-date
			}
			if t, ok, _ := Due(s.Schedule.Cron, last, now); ok {
				if _, _, err := m.Request(ctx, BackupRequest{ProjectID: s.ProjectID, Service: s.Service, Binding: s.Binding, Kind: s.Kind, ScheduledAt: t, Keep: s.Schedule.KeepOrDefault()}); err != nil {
					m.log.Warn("scheduled backup not requested", "service", s.Service, "binding", s.Binding, "err", err)
					first = errors.Join(first, err)
					continue
				}
				doc.Last, changed = t, true
				n++
			} else if doc.Last.IsZero() {
				doc.Last, changed = now.UTC(), true
			}
		}
		if p := DrillPeriod(s.Schedule.Drill, now); p != "" && p != doc.DrillPeriod {
			op, err := m.Drill(ctx, s.ProjectID, s.Service, s.Binding, p)
			if err != nil {
				first = errors.Join(first, err)
			} else if op != nil {
				doc.DrillPeriod, changed = p, true
				n++
			}
		}
		if changed {
			if _, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: doc.ID}}, doc, options.Replace().SetUpsert(true)); err != nil {
				return n, fmt.Errorf("backups: schedule of %s: %w", doc.ID, err)
			}
		}
	}
	return n, first
}
