package backups

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/services"
)

// TickInterval is how often [Manager.RunSchedules] asks for the backups and drills the
// services' backup blocks make due (docs/backups.md section 4.3): cron's own resolution.
const TickInterval = time.Minute

// SchedulePass requests the backups and restore drills whose schedules are due now (berthd
// runs it as the platform task "backups.schedule" every TickInterval) and returns TickInterval
// as the wait before the next pass. Every request it makes is idempotent, so a repeated or
// concurrent pass (another berthd) requests each backup once.
func (m *Manager) SchedulePass(ctx context.Context, cat *services.Catalog, log *slog.Logger) (time.Duration, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	list, err := ScheduledBindings(ctx, cat)
	if err != nil {
		return TickInterval, fmt.Errorf("read the backup schedules: %w", err)
	}
	n, err := m.Tick(ctx, list, time.Now())
	if err != nil {
		return TickInterval, fmt.Errorf("request scheduled backups (%d requested): %w", n, err)
	}
	if n > 0 {
		log.Info("scheduled backups and drills requested", "count", n)
	}
	return TickInterval, nil
}

// ScheduledBindings lists the bindings of the services of cat with a backup block, skipping
// services being deleted.
func ScheduledBindings(ctx context.Context, cat *services.Catalog) ([]Scheduled, error) {
	projects, err := cat.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	var out []Scheduled
	for i := range projects {
		svcs, err := cat.ListServices(ctx, &projects[i])
		if err != nil {
			return nil, err
		}
		for _, s := range svcs {
			if s.Backup == nil || s.Deleting {
				continue
			}
			sched := Schedule{Cron: s.Backup.Cron, Keep: s.Backup.Keep, Drill: s.Backup.Drill}
			for _, b := range s.Bindings {
				out = append(out, Scheduled{ProjectID: projects[i].ID, Service: s.Name, Binding: b.Name, Kind: abibackups.Kind(b.Kind), Schedule: sched})
			}
		}
	}
	return out, nil
}
