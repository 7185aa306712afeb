package backups

import (
	"context"
	"log/slog"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/services"
)

// TickInterval is how often [Manager.RunSchedules] asks for the backups and drills the
// services' backup blocks make due (docs/backups.md section 4.3): cron's own resolution.
const TickInterval = time.Minute

// RunSchedules ticks m once a minute, until ctx ends, with every binding of every service of cat
// that has a backup block ([ScheduledBindings]). A tick's error is logged and the next tick goes
// on; every request a tick makes is idempotent, so a repeated or concurrent tick (another
// berthd) is harmless.
func (m *Manager) RunSchedules(ctx context.Context, cat *services.Catalog, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			list, err := ScheduledBindings(ctx, cat)
			if err != nil {
				log.Warn("backup schedules not read", "err", err)
				continue
			}
			if n, err := m.Tick(ctx, list, now); err != nil {
				log.Warn("backup schedule tick", "requested", n, "err", err)
			} else if n > 0 {
				log.Info("scheduled backups and drills requested", "count", n)
			}
		}
	}
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
