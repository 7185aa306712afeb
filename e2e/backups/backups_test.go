// Package backups_test runs service backups end to end: the Corestore
// archive engines against real PostgreSQL 15, FerretDB and versitygw, the
// core's backup manager on the embedded store and a filesystem blob store,
// joined by the executor the Corestore provider runs (docs/backups.md).
package backups_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/plugins/corestore/backup"
)

const project = "prj_shop"

type core struct {
	m   *backups.Manager
	q   *operations.Queue
	fs  *blobs.FS
	ev  *events.Log
	clk *clocktest.Clock
}

func newCore(t *testing.T) *core {
	t.Helper()
	return newCoreOn(t, storetest.Open(t))
}

func newCoreOn(t *testing.T, st *store.Store) *core {
	t.Helper()
	clk := clocktest.New(time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC))
	q := operations.NewQueue(st, operations.Config{Now: clk.Now, Policy: operations.Policy{LeaseTTL: 10 * time.Minute, BaseDelay: 5 * time.Second, MaxDelay: 5 * time.Minute}})
	fs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ev := events.New(st, clk.Now)
	return &core{m: backups.New(backups.Config{Store: st, Queue: q, Blobs: fs, Events: ev, Now: clk.Now}), q: q, fs: fs, ev: ev, clk: clk}
}

// coordinator is the core's side of one claimed operation, called in
// process: the runner transport carries the same calls in production.
type coordinator struct {
	t        *testing.T
	c        *core
	op       operations.Operation
	h        operations.Holder
	backupID string
	// transit, when not nil, alters the archive after the executor hashed
	// it, on its way into the core.
	transit func(io.Reader) io.Reader
}

var _ backup.Coordinator = (*coordinator)(nil)

func (c *core) claim(t *testing.T, kind string) *coordinator {
	t.Helper()
	got, err := c.q.Claim(context.Background(), "provider:corestore", 1, func(o *operations.Operation) bool { return o.Kind == kind })
	if err != nil || len(got) != 1 {
		t.Fatalf("claim %s: %d operations, %v", kind, len(got), err)
	}
	op := got[0].Operation
	co := &coordinator{t: t, c: c, op: op, h: operations.Holder{NodeID: op.NodeID, Token: got[0].LeaseToken, Fence: op.Fence}}
	var p backups.RestorePayload
	_ = jsonUnmarshal(op.Payload, &p)
	co.backupID = p.BackupID
	return co
}

func (co *coordinator) Begin(ctx context.Context) (bool, error) {
	_, err := co.c.m.Begin(ctx, co.op.ID, co.h)
	if errors.Is(err, backups.ErrCommitted) {
		rec, _ := co.c.m.Get(ctx, project, "bkp_"+strings.TrimPrefix(co.op.ID, "op_"))
		return true, co.c.m.CompleteCommitted(ctx, co.op.ID, co.h, rec)
	}
	return false, err
}

func (co *coordinator) Upload(ctx context.Context, r io.Reader) error {
	if co.transit != nil {
		r = co.transit(r)
	}
	_, err := co.c.m.Upload(ctx, co.op.ID, co.h, r)
	return err
}

func (co *coordinator) Commit(ctx context.Context, d backup.Declared) error {
	_, err := co.c.m.Commit(ctx, co.op.ID, co.h, backups.Declared{Digest: d.Digest, Size: d.Size, Figures: d.Figures}, 24)
	return err
}

func (co *coordinator) Fail(ctx context.Context, step string, cause error, retryable bool) error {
	return co.c.m.Fail(ctx, co.op.ID, co.h, step, cause, retryable)
}

func (co *coordinator) Archive(ctx context.Context) (io.ReadCloser, backup.Figures, error) {
	rc, rec, err := co.c.m.OpenArchive(ctx, co.op.ID, co.h, co.backupID)
	if err != nil {
		return nil, backup.Figures{}, err
	}
	return rc, rec.Figures, nil
}

func (co *coordinator) Drilled(ctx context.Context, res backup.DrillResult) error {
	_, err := co.c.m.RecordDrill(ctx, co.op.ID, co.h, res)
	return err
}

func (co *coordinator) Restored(ctx context.Context) error {
	_, err := co.c.q.Complete(ctx, co.op.ID, co.h, nil)
	return err
}

// backupOf runs one on-demand backup of binding through the executor and
// returns the record.
func (c *core) backupOf(t *testing.T, service, binding string, kind abibackups.Kind, e backup.Engine, resource string) *backups.Record {
	t.Helper()
	ctx := context.Background()
	rec, _, err := c.m.Request(ctx, backups.BackupRequest{ProjectID: project, Service: service, Binding: binding, Kind: kind, IdempotencyKey: "now-" + binding})
	if err != nil {
		t.Fatal(err)
	}
	if err := backup.RunBackup(ctx, e, resource, c.claim(t, backups.KindBackup)); err != nil {
		t.Fatal(err)
	}
	got, err := c.m.Get(ctx, project, rec.ID)
	if err != nil || got.State != backups.Succeeded {
		t.Fatalf("backup of %s/%s: %+v %v", service, binding, got, err)
	}
	return got
}

// drill runs the drill of binding's latest backup through the executor.
func (c *core) drill(t *testing.T, service, binding string, kind abibackups.Kind, e backup.Engine, period string) backup.DrillResult {
	t.Helper()
	ctx := context.Background()
	op, err := c.m.Drill(ctx, project, service, binding, period)
	if err != nil || op == nil {
		t.Fatalf("drill of %s/%s: %v %v", service, binding, op, err)
	}
	co := c.claim(t, backups.KindDrill)
	var p backups.RestorePayload
	_ = jsonUnmarshal(co.op.Payload, &p)
	res, err := backup.RunDrill(ctx, e, backup.ScratchResource(kind, p.Scratch), co)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func seedPostgres(t *testing.T, e *backup.Postgres, db string) {
	t.Helper()
	ctx := context.Background()
	if err := e.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), db) })
	c, err := pgx.Connect(ctx, pg.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range []string{
		`CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL)`,
		`CREATE TABLE orders (id bigserial PRIMARY KEY, customer int REFERENCES customers(id), total numeric(12,2))`,
		`INSERT INTO customers SELECT i, 'alice-' || lpad(i::text, 4, '0') FROM generate_series(1, 300) i`,
		`INSERT INTO orders (customer, total) SELECT 1 + i % 300, i * 0.5 FROM generate_series(1, 5000) i`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestBackupAndDrillEveryKind backs up a PostgreSQL database, a MongoDB
// database and an S3 bucket through the executor and the core, drills each
// (restore into scratch, verify, drop), and expects `backup ls` to show a
// passed drill on every record and no scratch resource left behind.
func TestBackupAndDrillEveryKind(t *testing.T) {
	ctx := context.Background()
	c := newCore(t)
	pge := &backup.Postgres{Host: pg.Host, Port: pg.Port, Password: pg.Password}
	seedPostgres(t, pge, "shop_every")
	me := &backup.MongoDB{URI: ferret.URI()}
	mc, err := mongo.Connect(options.Client().ApplyURI(ferret.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	t.Cleanup(func() { _ = mc.Database("shop_cache").Drop(context.Background()) })
	var docs []any
	for i := range 300 {
		docs = append(docs, bson.D{{Key: "_id", Value: int64(i)}, {Key: "k", Value: fmt.Sprint("v", i)}})
	}
	if _, err := mc.Database("shop_cache").Collection("sessions").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	se := &backup.S3{Endpoint: s3srv.Addr, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey}
	if err := se.Create(ctx, "shop-files"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = se.Drop(context.Background(), "shop-files") })
	cl := s3srv.Client(t)
	for i := range 12 {
		body := strings.Repeat(fmt.Sprint(i), 1000+i)
		if _, err := cl.PutObject(ctx, "shop-files", fmt.Sprintf("img/%02d.png", i), strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	type binding struct {
		name     string
		kind     abibackups.Kind
		e        backup.Engine
		resource string
	}
	for _, b := range []binding{{"db", abibackups.KindPostgres, pge, "shop_every"}, {"cache", abibackups.KindMongoDB, me, "shop_cache"}, {"files", abibackups.KindS3, se, "shop-files"}} {
		rec := c.backupOf(t, "web", b.name, b.kind, b.e, b.resource)
		if len(rec.Figures.Items) == 0 || rec.Size == 0 {
			t.Fatalf("%s: recorded %+v", b.name, rec)
		}
		res := c.drill(t, "web", b.name, b.kind, b.e, "2026-W49")
		if !res.Passed || !res.Dropped {
			t.Fatalf("%s drill: %+v", b.name, res)
		}
		if b.kind == abibackups.KindS3 {
			if ok, err := cl.BucketExists(ctx, res.Scratch); err != nil || ok || !strings.Contains(res.Scratch, "-drill-") {
				t.Fatalf("scratch bucket %q exists=%v, %v after the drill", res.Scratch, ok, err)
			}
		}
	}
	list, err := c.m.List(ctx, project, "web")
	if err != nil || len(list) != 3 {
		t.Fatalf("ls: %v %v", list, err)
	}
	for _, r := range list {
		if r.Drill == nil || r.Drill.Result != backups.DrillPassed {
			t.Errorf("%s (%s): drill %+v", r.ID, r.Kind, r.Drill)
		}
	}
}

// corruptingEngine alters one row's bytes in the engine's output, before the
// executor hashes it: the archive path itself is damaged, so the stored
// archive matches its record and only a drill can find out.
type corruptingEngine struct {
	*backup.Postgres
	old, new string
}

func (c *corruptingEngine) Backup(ctx context.Context, db string, w io.Writer) (backup.Figures, error) {
	var buf bytes.Buffer
	fig, err := c.Postgres.Backup(ctx, db, &buf)
	if err != nil {
		return fig, err
	}
	if _, err := w.Write(bytes.Replace(buf.Bytes(), []byte(c.old), []byte(c.new), 1)); err != nil {
		return fig, err
	}
	return fig, nil
}

// TestDrillFailsOnACorruptedRow: a row damaged in the archive path gives a
// backup that stores fine and a drill that fails naming public.customers,
// with an event and the record's drill result; an archive altered after the
// executor hashed it is refused at commit (backup_corrupt) and never
// recorded succeeded.
func TestDrillFailsOnACorruptedRow(t *testing.T) {
	ctx := context.Background()
	c := newCore(t)
	pge := &backup.Postgres{Host: pg.Host, Port: pg.Port, Password: pg.Password}
	seedPostgres(t, pge, "shop_corrupt")
	bad := &corruptingEngine{Postgres: pge, old: "alice-0123", new: "alicE-0123"}
	rec := c.backupOf(t, "web", "db", abibackups.KindPostgres, bad, "shop_corrupt")
	res := c.drill(t, "web", "db", abibackups.KindPostgres, pge, "2026-W49")
	if res.Passed || len(res.Differences) != 1 || res.Differences[0].Name != "public.customers" || !res.Dropped {
		t.Fatalf("drill: %+v", res)
	}
	got, _ := c.m.Get(ctx, project, rec.ID)
	if got.Drill == nil || got.Drill.Result != backups.DrillFailed || got.Drill.Table != "public.customers" {
		t.Fatalf("record drill %+v", got.Drill)
	}
	evs, err := c.ev.List(ctx, 0, backups.EventDrillFailed, 10)
	if err != nil || len(evs) != 1 || evs[0].Event.Data["table"] != "public.customers" {
		t.Fatalf("events %+v %v", evs, err)
	}

	// In transit: the executor's digest is of the good bytes, the store sees others.
	req, _, err := c.m.Request(ctx, backups.BackupRequest{ProjectID: project, Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "transit"})
	if err != nil {
		t.Fatal(err)
	}
	co := c.claim(t, backups.KindBackup)
	co.transit = func(r io.Reader) io.Reader {
		b, err := io.ReadAll(r)
		if err != nil {
			return r
		}
		return bytes.NewReader(bytes.Replace(b, []byte("alice-0200"), []byte("alicE-0200"), 1))
	}
	if err := backup.RunBackup(ctx, pge, "shop_corrupt", co); !errors.Is(err, backups.ErrCorrupt) {
		t.Fatalf("backup altered in transit: %v, want backup_corrupt", err)
	}
	got, _ = c.m.Get(ctx, project, req.ID)
	if got.State != backups.Failed || got.FailedStep != backups.StepVerify {
		t.Fatalf("record %+v; want failed at verify", got)
	}
}

// cutReader hands over n bytes and then cancels its operation's context, as
// a provider killed in the middle of the stream would stop sending.
type cutReader struct {
	r      io.Reader
	n      int
	cancel context.CancelFunc
}

func (c *cutReader) Read(b []byte) (int, error) {
	if c.n <= 0 {
		c.cancel()
		return 0, errors.New("provider process killed")
	}
	k, err := c.r.Read(b[:min(len(b), c.n)])
	c.n -= k
	return k, err
}

// TestKilledBackupFailsThenRetriesAndRestores cuts a backup mid-stream (the
// record is failed at upload, no archive kept), lets the retry commit (its
// stored archive re-hashes to the record), then loses data in the live
// database, restores the backup into it and gets every row back.
func TestKilledBackupFailsThenRetriesAndRestores(t *testing.T) {
	ctx := context.Background()
	c := newCore(t)
	pge := &backup.Postgres{Host: pg.Host, Port: pg.Port, Password: pg.Password}
	seedPostgres(t, pge, "shop_killed")
	rec, _, err := c.m.Request(ctx, backups.BackupRequest{ProjectID: project, Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	co := c.claim(t, backups.KindBackup)
	actx, cancel := context.WithCancel(ctx)
	co.transit = func(r io.Reader) io.Reader { return &cutReader{r: r, n: 20 << 10, cancel: cancel} }
	if err := backup.RunBackup(actx, pge, "shop_killed", co); err == nil {
		t.Fatal("a backup cut mid-stream succeeded")
	}
	got, _ := c.m.Get(ctx, project, rec.ID)
	if got.State != backups.Failed || got.FailedStep != backups.StepUpload {
		t.Fatalf("record after the cut: %+v", got)
	}
	n := 0
	_ = c.fs.List(ctx, "backups/", func(blobs.Info) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d archives kept after the cut", n)
	}
	c.clk.Advance(6 * time.Second) // the retry's backoff
	if err := backup.RunBackup(ctx, pge, "shop_killed", c.claim(t, backups.KindBackup)); err != nil {
		t.Fatal(err)
	}
	got, _ = c.m.Get(ctx, project, rec.ID)
	if got.State != backups.Succeeded || got.FailedStep != "" {
		t.Fatalf("record after the retry: %+v", got)
	}
	if err := c.m.VerifyArchive(ctx, got); err != nil {
		t.Fatalf("the committed archive does not hash to its record: %v", err)
	}

	pgExec(t, "shop_killed", "DELETE FROM orders WHERE id % 2 = 0; UPDATE customers SET name = 'gone' WHERE id < 50")
	stopped := backups.TargetFunc(func(context.Context, string, string, string) (bool, bool, bool, error) { return true, false, true, nil })
	if _, err := c.m.Restore(ctx, stopped, backups.RestoreRequest{ProjectID: project, BackupID: rec.ID, IdempotencyKey: "r"}); err != nil {
		t.Fatal(err)
	}
	if err := backup.RunRestore(ctx, pge, "shop_killed", false, c.claim(t, backups.KindRestore)); err != nil {
		t.Fatal(err)
	}
	after, err := pge.Measure(ctx, "shop_killed")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(got.Figures, after); len(d) != 0 {
		t.Fatalf("after the restore: %v", d)
	}
}

func pgExec(t *testing.T, db, q string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pg.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, q); err != nil {
		t.Fatal(err)
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
