package backups_test

import (
	"context"
	"testing"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/plugins/corestore/backup"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

// TestWorkerRunsBackupDrillAndRestore runs the Corestore provider's worker as a runner node
// against berthd's API: it claims the backup, the drill and a restore into scratch as they
// are requested, and each settles (the backup succeeded, the drill passed, the restore
// operation succeeded) without anyone driving the executor by hand.
func TestWorkerRunsBackupDrillAndRestore(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	c := newCoreOn(t, st)
	tr := newTransport(t, c, st)
	pge := &backup.Postgres{Host: pg.Host, Port: pg.Port, Password: pg.Password}
	seedPostgres(t, pge, "shop_worker")
	e, err := tr.admin.CreateRunnerEnrollment(ctx, client.RunnerEnrollmentRequest{NodeID: "corestore-2", Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	w, err := backup.NewWorker(ctx, backup.WorkerConfig{BaseURL: tr.url,
		Agent: runner.AgentConfig{Client: tr.rc, NodeID: "corestore-2", RegistrationToken: e.Token, Credentials: &runner.MemoryCredentials{},
			Declaration: abirunner.Declaration{Region: "local", Capacity: 1}, PollInterval: 20 * time.Millisecond,
			OnError: func(err error) {
				select {
				case errs <- err:
				default:
				}
			}},
		Resolve: func(_ context.Context, _, service, binding string, kind backup.Kind) (backup.Target, error) {
			return backup.Target{Engine: pge, Resource: "shop_worker"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	// The in-process registration of newTransport holds corestore-1; it claims nothing here.

	rec, _, err := c.m.Request(ctx, backups.BackupRequest{ProjectID: project, Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "w"})
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 2*time.Minute, "backup committed", func() (bool, string) {
		got, err := c.m.Get(ctx, project, rec.ID)
		return err == nil && got.State == backups.Succeeded, string(got.State)
	})
	if _, err := c.m.Drill(ctx, project, "web", "db", "2026-W49"); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 2*time.Minute, "drill recorded", func() (bool, string) {
		got, err := c.m.Get(ctx, project, rec.ID)
		return err == nil && got.Drill != nil, "no drill yet"
	})
	if got, _ := c.m.Get(ctx, project, rec.ID); got.Drill.Result != backups.DrillPassed {
		t.Fatalf("drill %+v", got.Drill)
	}
	stopped := backups.TargetFunc(func(context.Context, string, string, string) (bool, bool, bool, error) { return true, false, true, nil })
	op, err := c.m.Restore(ctx, stopped, backups.RestoreRequest{ProjectID: project, BackupID: rec.ID, IntoScratch: true, IdempotencyKey: "wr"})
	if err != nil {
		t.Fatal(err)
	}
	var p backups.RestorePayload
	_ = jsonUnmarshal(op.Payload, &p)
	t.Cleanup(func() { _ = pge.Drop(context.Background(), p.Scratch) })
	proctest.WaitFor(t, 2*time.Minute, "restore settled", func() (bool, string) {
		o, err := c.q.Get(ctx, op.ID)
		return err == nil && o.State.Terminal(), string(o.State)
	})
	if o, _ := c.q.Get(ctx, op.ID); o.State != operations.Succeeded {
		t.Fatalf("restore operation %s: %s", o.State, o.LastError)
	}
	select {
	case err := <-errs:
		t.Fatalf("worker reported: %v", err)
	default:
	}
}
