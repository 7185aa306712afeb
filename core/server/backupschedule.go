package server

import (
	"context"
	"log/slog"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/services"
)

// backupTickInterval is how often berthd asks for the backups and drills the services'
// backup blocks make due (docs/backups.md section 4.3): cron's own resolution.
const backupTickInterval = time.Minute

// runBackupSchedules ticks m once a minute, until ctx ends, with every binding of every
// service that has a backup block. A tick's error is logged and the next tick goes on;
// every request a tick makes is idempotent, so a repeated or concurrent tick is harmless.
func runBackupSchedules(ctx context.Context, m *backups.Manager, cat *services.Catalog, log *slog.Logger) {
	t := time.NewTicker(backupTickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			list, err := scheduledBindings(ctx, cat)
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

// scheduledBindings lists the bindings of the services with a backup block, skipping
// services being deleted.
func scheduledBindings(ctx context.Context, cat *services.Catalog) ([]backups.Scheduled, error) {
	projects, err := cat.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	var out []backups.Scheduled
	for i := range projects {
		svcs, err := cat.ListServices(ctx, &projects[i])
		if err != nil {
			return nil, err
		}
		for _, s := range svcs {
			if s.Backup == nil || s.Deleting {
				continue
			}
			sched := backups.Schedule{Cron: s.Backup.Cron, Keep: s.Backup.Keep, Drill: s.Backup.Drill}
			for _, b := range s.Bindings {
				out = append(out, backups.Scheduled{ProjectID: projects[i].ID, Service: s.Name, Binding: b.Name, Kind: abibackups.Kind(b.Kind), Schedule: sched})
			}
		}
	}
	return out, nil
}
