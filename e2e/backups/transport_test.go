package backups_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http/httptest"
	"testing"

	abibackups "github.com/berthhq/berth/abi/backups"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/plugins/corestore/backup"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

type nopHinter struct{}

func (nopHinter) Hint(string) {}

// transport serves berthd's API with the runner transport and the backup routes over c's
// store and manager, and registers one runner node for the Corestore executor.
type transport struct {
	url, node, cred string
	rc              *runner.Client
	admin           *client.Client
}

func newTransport(t *testing.T, c *core, st *store.Store) *transport {
	t.Helper()
	ctx := context.Background()
	tokens := identity.NewTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := runners.NewRegistry(st, runners.Config{Now: c.clk.Now})
	orch := &api.Orchestration{Leases: leases.NewManager(st, leases.Config{Owner: "brd_test", Now: c.clk.Now}), Runners: reg,
		Operations: c.q, Placement: placement.NewService(st, reg, c.q), Transport: true}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	srv := httptest.NewServer(api.New(api.Config{Runtime: rollout.NewStore(st, services.NewCatalog(st, nil), nil), Idempotency: idempotency.New(st), Catalog: services.NewCatalog(st, nil), Nodes: nodes.NewRegistry(st, nil), Tokens: tokens,
		Hinter: nopHinter{}, PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Orchestration: orch,
		Backups: &api.BackupsConfig{Manager: c.m}}))
	t.Cleanup(srv.Close)
	ac, err := client.New(srv.URL, client.WithToken(admin))
	if err != nil {
		t.Fatal(err)
	}
	e, err := ac.CreateRunnerEnrollment(ctx, client.RunnerEnrollmentRequest{NodeID: "corestore-1", Region: "local"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runner.NewClient(runner.ClientConfig{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	r, err := rc.Register(ctx, e.Token, "corestore-1", abirunner.Declaration{Region: "local", Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &transport{url: srv.URL, node: "corestore-1", cred: r.Credential, rc: rc, admin: ac}
}

func (tr *transport) claim(t *testing.T) (*backup.HTTPCoordinator, abirunner.Operation) {
	t.Helper()
	ops, err := tr.rc.Claim(context.Background(), tr.node, tr.cred, 1)
	if err != nil || len(ops) != 1 {
		t.Fatalf("claim over the transport: %v %v", ops, err)
	}
	op := ops[0]
	return &backup.HTTPCoordinator{BaseURL: tr.url, Credential: tr.cred,
		Lease: abirunner.Lease{NodeID: tr.node, OperationID: op.ID, LeaseToken: op.LeaseToken, Fence: op.Fence}}, op
}

// TestBackupOverTheRunnerTransport runs a PostgreSQL backup, its drill and a restore into
// scratch between the executor and berthd's API over HTTP: the archive is the streamed body
// of the upload call, authenticated by the runner credential and the lease; a lease that is
// not the operation's is refused.
func TestBackupOverTheRunnerTransport(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	c := newCoreOn(t, st)
	tr := newTransport(t, c, st)
	pge := &backup.Postgres{Host: pg.Host, Port: pg.Port, Password: pg.Password}
	seedPostgres(t, pge, "shop_http")

	rec, _, err := c.m.Request(ctx, backups.BackupRequest{ProjectID: project, Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "http"})
	if err != nil {
		t.Fatal(err)
	}
	co, _ := tr.claim(t)
	forged := *co
	forged.Lease.LeaseToken = "brl_forged"
	if _, err := forged.Begin(ctx); err == nil {
		t.Fatal("begin under a forged lease token succeeded")
	}
	if err := backup.RunBackup(ctx, pge, "shop_http", co); err != nil {
		t.Fatal(err)
	}
	got, err := c.m.Get(ctx, project, rec.ID)
	if err != nil || got.State != backups.Succeeded || c.m.VerifyArchive(ctx, got) != nil {
		t.Fatalf("record after the HTTP backup: %+v %v", got, err)
	}

	if _, err := c.m.Drill(ctx, project, "web", "db", "2026-W49"); err != nil {
		t.Fatal(err)
	}
	dco, op := tr.claim(t)
	var p backups.RestorePayload
	_ = jsonUnmarshal(string(op.Payload), &p)
	res, err := backup.RunDrill(ctx, pge, p.Scratch, dco)
	if err != nil || !res.Passed {
		t.Fatalf("drill over HTTP: %+v %v", res, err)
	}
	if got, _ = c.m.Get(ctx, project, rec.ID); got.Drill == nil || got.Drill.Result != backups.DrillPassed {
		t.Fatalf("drill recorded %+v", got.Drill)
	}

	stopped := backups.TargetFunc(func(context.Context, string, string, string) (bool, bool, bool, error) { return true, false, true, nil })
	if _, err := c.m.Restore(ctx, stopped, backups.RestoreRequest{ProjectID: project, BackupID: rec.ID, IntoScratch: true, IdempotencyKey: "r"}); err != nil {
		t.Fatal(err)
	}
	rco, op := tr.claim(t)
	_ = jsonUnmarshal(string(op.Payload), &p)
	t.Cleanup(func() { _ = pge.Drop(context.Background(), p.Scratch) })
	if err := backup.RunRestore(ctx, pge, p.Scratch, true, rco); err != nil {
		t.Fatal(err)
	}
	if o, err := c.q.Get(ctx, op.ID); err != nil || o.State != "succeeded" {
		t.Fatalf("restore operation %+v %v", o, err)
	}
}
