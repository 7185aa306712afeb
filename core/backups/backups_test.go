package backups_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	abibackups "github.com/berthhq/berth/abi/backups"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/clocktest"
)

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

type env struct {
	m     *backups.Manager
	q     *operations.Queue
	fs    *blobs.FS
	ev    *events.Log
	clk   *clocktest.Clock
	reg   *prometheus.Registry
	count int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st := storetest.Open(t)
	clk := clocktest.New(t0)
	q := operations.NewQueue(st, operations.Config{Now: clk.Now, Policy: operations.Policy{LeaseTTL: 30 * time.Second, BaseDelay: 5 * time.Second, MaxDelay: 5 * time.Minute, MaxAttempts: 4}})
	if err := q.EnsureIndexes(context.Background()); err != nil {
		t.Fatal(err)
	}
	fs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ev := events.New(st, clk.Now)
	reg := prometheus.NewRegistry()
	m := backups.New(backups.Config{Store: st, Queue: q, Blobs: fs, Events: ev, Registerer: reg, Now: clk.Now})
	return &env{m: m, q: q, fs: fs, ev: ev, clk: clk, reg: reg}
}

func (e *env) claim(t *testing.T) (operations.Claimed, operations.Holder) {
	t.Helper()
	got, err := e.q.Claim(context.Background(), "provider:corestore", 1, nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d operations, %v; want 1", len(got), err)
	}
	c := got[0]
	return c, operations.Holder{NodeID: c.Operation.NodeID, Token: c.LeaseToken, Fence: c.Operation.Fence}
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

var figures = abibackups.Figures{Kind: abibackups.KindPostgres, Items: []abibackups.Item{{Name: "public.orders", Count: 3000, Digest: "rowsum:1:2"}}}

// backupOnce runs one whole backup of shop/web's binding db through the
// manager as the executor would, and returns the record.
func (e *env) backupOnce(t *testing.T, key string, archive []byte) *backups.Record {
	t.Helper()
	return e.backupKeeping(t, key, archive, 0)
}

// backupKeeping is backupOnce for a service whose backup block keeps keep.
func (e *env) backupKeeping(t *testing.T, key string, archive []byte, keep int) *backups.Record {
	t.Helper()
	ctx := context.Background()
	rec, _, err := e.m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: key, Keep: keep})
	if err != nil {
		t.Fatal(err)
	}
	c, h := e.claim(t)
	if c.Operation.ID != rec.OperationID {
		t.Fatalf("claimed %s, want %s", c.Operation.ID, rec.OperationID)
	}
	if _, err := e.m.Begin(ctx, c.Operation.ID, h); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Upload(ctx, c.Operation.ID, h, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	out, err := e.m.Commit(ctx, c.Operation.ID, h, backups.Declared{Digest: digest(archive), Size: int64(len(archive)), Figures: figures}, 24)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Second)
	return out
}

// TestBackupRecordIsTheCommitPoint: a request converges on one operation
// and one record; the record is pending, then running, then succeeded with
// the stored archive's digest, size and figures; the operation succeeds.
func TestBackupRecordIsTheCommitPoint(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	req := backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "k1"}
	rec, created, err := e.m.Request(ctx, req)
	if err != nil || !created || rec.State != backups.Pending {
		t.Fatalf("request: %+v created=%v %v", rec, created, err)
	}
	again, created, err := e.m.Request(ctx, req)
	if err != nil || created || again.ID != rec.ID {
		t.Fatalf("repeat: %+v created=%v %v; want the first record", again, created, err)
	}
	c, h := e.claim(t)
	if c.Operation.Kind != backups.KindBackup || c.Operation.IdempotencyKey == "" {
		t.Fatalf("operation %+v", c.Operation)
	}
	if r, err := e.m.Begin(ctx, c.Operation.ID, h); err != nil || r.State != backups.Running || r.Fence != h.Fence {
		t.Fatalf("begin: %+v %v", r, err)
	}
	archive := bytes.Repeat([]byte("archive bytes "), 10000)
	info, err := e.m.Upload(ctx, c.Operation.ID, h, bytes.NewReader(archive))
	if err != nil || info.SHA256 != digest(archive) || info.Size != int64(len(archive)) {
		t.Fatalf("upload: %+v %v", info, err)
	}
	if r, _ := e.m.Get(ctx, "prj_shop", rec.ID); r.State != backups.Running {
		t.Fatalf("record %s before the commit; a backup exists only once committed", r.State)
	}
	done, err := e.m.Commit(ctx, c.Operation.ID, h, backups.Declared{Digest: digest(archive), Size: int64(len(archive)), Figures: figures}, 24)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.m.Get(ctx, "prj_shop", rec.ID)
	if err != nil || got.State != backups.Succeeded || got.Digest != digest(archive) || got.Size != int64(len(archive)) || len(got.Figures.Items) != 1 || got.Figures.Items[0].Count != 3000 {
		t.Fatalf("committed record %+v, %v", got, err)
	}
	if done.ID != got.ID {
		t.Fatalf("commit returned %s", done.ID)
	}
	op, err := e.q.Get(ctx, c.Operation.ID)
	if err != nil || op.State != operations.Succeeded {
		t.Fatalf("operation after commit: %+v %v", op, err)
	}
	if err := e.m.VerifyArchive(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: "redis", IdempotencyKey: "k2"}); !errors.Is(err, backups.ErrInvalid) {
		t.Fatalf("unknown kind: %v, want ErrInvalid", err)
	}
	if v := testutil.ToFloat64(metric(t, e.reg, "berth_backups_total", "succeeded")); v != 1 {
		t.Fatalf("berth_backups_total{result=succeeded} = %v", v)
	}
}

// TestCommitRefusesADigestTheStoreDidNotSee: the executor declares another
// digest than the bytes that arrived (a partial or altered stream): the
// record is failed at verify, the archive deleted, the operation failed.
func TestCommitRefusesADigestTheStoreDidNotSee(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	rec, _, err := e.m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	c, h := e.claim(t)
	if _, err := e.m.Begin(ctx, c.Operation.ID, h); err != nil {
		t.Fatal(err)
	}
	full := bytes.Repeat([]byte("x"), 4096)
	if _, err := e.m.Upload(ctx, c.Operation.ID, h, bytes.NewReader(full[:1000])); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.Commit(ctx, c.Operation.ID, h, backups.Declared{Digest: digest(full), Size: int64(len(full)), Figures: figures}, 24)
	if !errors.Is(err, backups.ErrCorrupt) || abierrors.CodeOf(err) != abierrors.BackupCorrupt {
		t.Fatalf("commit of a partial archive: %v, want backup_corrupt", err)
	}
	got, _ := e.m.Get(ctx, "prj_shop", rec.ID)
	if got.State != backups.Failed || got.FailedStep != backups.StepVerify || got.Digest != "" {
		t.Fatalf("record %+v; want failed at verify with no digest", got)
	}
	if n := countBlobs(t, e.fs, "backups/"); n != 0 {
		t.Fatalf("%d archives left after a refused commit", n)
	}
	if op, _ := e.q.Get(ctx, c.Operation.ID); op.State != operations.Failed {
		t.Fatalf("operation %s, want failed", op.State)
	}
}

// failingReader yields n bytes and then fails, like a plugin killed in the
// middle of a stream.
type failingReader struct{ n int }

func (f *failingReader) Read(b []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("plugin process exited")
	}
	k := min(len(b), f.n)
	f.n -= k
	return k, nil
}

// TestBrokenUploadFailsTheRecordAndARetryCommits: an upload cut half-way
// leaves a failed record naming upload and no archive; a late commit of a
// dead attempt whose lease was reclaimed is refused; the retry's attempt
// commits under a higher fence.
func TestBrokenUploadFailsTheRecordAndARetryCommits(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	rec, _, err := e.m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	c1, h1 := e.claim(t)
	if _, err := e.m.Begin(ctx, c1.Operation.ID, h1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Upload(ctx, c1.Operation.ID, h1, &failingReader{n: 100 << 10}); err == nil {
		t.Fatal("an upload whose stream broke succeeded")
	}
	got, _ := e.m.Get(ctx, "prj_shop", rec.ID)
	if got.State != backups.Failed || got.FailedStep != backups.StepUpload || !strings.Contains(got.Error, "plugin process exited") {
		t.Fatalf("record after a broken upload: %+v", got)
	}
	if n := countBlobs(t, e.fs, "backups/"); n != 0 {
		t.Fatalf("%d archives after a broken upload", n)
	}
	// The executor died before it could fail the attempt: the lease expires
	// and another attempt claims the operation.
	e.clk.Advance(31 * time.Second)
	c2, h2 := e.claim(t)
	if c2.Operation.ID != c1.Operation.ID || h2.Fence <= h1.Fence {
		t.Fatalf("reclaim %s fence %d after %d", c2.Operation.ID, h2.Fence, h1.Fence)
	}
	if r, err := e.m.Begin(ctx, c2.Operation.ID, h2); err != nil || r.State != backups.Running {
		t.Fatalf("begin of the retry: %+v %v", r, err)
	}
	archive := []byte("a whole archive")
	if _, err := e.m.Upload(ctx, c2.Operation.ID, h2, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Commit(ctx, c1.Operation.ID, h1, backups.Declared{Digest: digest(archive), Size: int64(len(archive))}, 24); !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("commit by the dead attempt: %v, want lease lost", err)
	}
	if _, err := e.m.Commit(ctx, c2.Operation.ID, h2, backups.Declared{Digest: digest(archive), Size: int64(len(archive)), Figures: figures}, 24); err != nil {
		t.Fatal(err)
	}
	got, _ = e.m.Get(ctx, "prj_shop", rec.ID)
	if got.State != backups.Succeeded || got.Fence != h2.Fence || got.FailedStep != "" || e.m.VerifyArchive(ctx, got) != nil {
		t.Fatalf("record after the retry: %+v", got)
	}
	// A repeat of Begin after the commit (the completion was lost) says so.
	if _, err := e.m.Begin(ctx, c2.Operation.ID, h2); err != nil && !errors.Is(err, backups.ErrCommitted) && !errors.Is(err, operations.ErrLeaseLost) {
		t.Fatalf("begin after the commit: %v", err)
	}
}

func countBlobs(t *testing.T, fs *blobs.FS, prefix string) int {
	t.Helper()
	n := 0
	if err := fs.List(context.Background(), prefix, func(blobs.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRetentionKeepsTheNewest keeps the newest two of four backups and
// deletes the others' archives with their records.
func TestRetentionKeepsTheNewest(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var ids []string
	for i, k := range []string{"a", "b", "c", "d"} {
		ids = append(ids, e.backupOnce(t, k, []byte(strings.Repeat(k, 100+i))).ID)
	}
	if err := e.m.Prune(ctx, "prj_shop", "web", "db", 2); err != nil {
		t.Fatal(err)
	}
	list, err := e.m.List(ctx, "prj_shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != ids[3] || list[1].ID != ids[2] {
		t.Fatalf("after keep 2: %v; want %s, %s", recIDs(list), ids[3], ids[2])
	}
	if n := countBlobs(t, e.fs, "backups/"); n != 2 {
		t.Fatalf("%d archives after keep 2", n)
	}
}

// TestCommitKeepsTheServicesKeep: the keep a backup was requested with (the service's
// backup block) is what its commit prunes by, not the committer's default of 24.
func TestCommitKeepsTheServicesKeep(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var ids []string
	for i, k := range []string{"a", "b", "c"} {
		ids = append(ids, e.backupKeeping(t, k, []byte(strings.Repeat(k, 100+i)), 2).ID)
	}
	list, err := e.m.List(ctx, "prj_shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != ids[2] || list[1].ID != ids[1] || list[0].Keep != 2 {
		t.Fatalf("after three backups keeping 2: %v; want %s, %s", recIDs(list), ids[2], ids[1])
	}
	if n := countBlobs(t, e.fs, "backups/"); n != 2 {
		t.Fatalf("%d archives after keep 2", n)
	}
	if _, _, err := e.m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "neg", Keep: -1}); !errors.Is(err, backups.ErrInvalid) {
		t.Fatalf("keep -1: %v, want ErrInvalid", err)
	}
}

func recIDs(list []backups.Record) []string {
	var out []string
	for _, r := range list {
		out = append(out, r.ID+":"+string(r.State))
	}
	return out
}

type target struct{ exists, running, binding bool }

func (tg target) fn() backups.TargetFunc {
	return func(context.Context, string, string, string) (bool, bool, bool, error) {
		return tg.exists, tg.running, tg.binding, nil
	}
}

// TestRestorePreconditions refuses, before anything is enqueued: an unknown
// backup, a missing target, a running target, and an archive altered in
// the blob store (backup_corrupt); it accepts --while-running and
// --into-scratch, idempotently.
func TestRestorePreconditions(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	rec := e.backupOnce(t, "k", []byte("the archive of shop/web db"))
	req := backups.RestoreRequest{ProjectID: "prj_shop", BackupID: rec.ID, IdempotencyKey: "r1"}
	before := len(listOps(t, e.q))
	cases := []struct {
		name string
		tg   target
		req  backups.RestoreRequest
		want error
	}{
		{"unknown backup", target{true, false, true}, backups.RestoreRequest{ProjectID: "prj_shop", BackupID: "bkp_nope", IdempotencyKey: "x"}, backups.ErrNotFound},
		{"other project", target{true, false, true}, backups.RestoreRequest{ProjectID: "prj_other", BackupID: rec.ID, IdempotencyKey: "x"}, backups.ErrNotFound},
		{"missing target", target{false, false, false}, req, backups.ErrTargetMissing},
		{"target without the binding", target{true, false, false}, req, backups.ErrTargetMissing},
		{"running target", target{true, true, true}, req, backups.ErrTargetRunning},
	}
	for _, c := range cases {
		if _, err := e.m.Restore(ctx, c.tg.fn(), c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if n := len(listOps(t, e.q)); n != before {
		t.Fatalf("refused restores enqueued %d operations", n-before)
	}
	op, err := e.m.Restore(ctx, target{true, true, true}.fn(), backups.RestoreRequest{ProjectID: "prj_shop", BackupID: rec.ID, WhileRunning: true, IdempotencyKey: "r1"})
	if err != nil || op.Kind != backups.KindRestore {
		t.Fatalf("restore while running: %+v %v", op, err)
	}
	again, err := e.m.Restore(ctx, target{true, true, true}.fn(), backups.RestoreRequest{ProjectID: "prj_shop", BackupID: rec.ID, WhileRunning: true, IdempotencyKey: "r1"})
	if err != nil || again.ID != op.ID {
		t.Fatalf("repeat: %v %v", again, err)
	}
	scratch, err := e.m.Restore(ctx, target{true, true, true}.fn(), backups.RestoreRequest{ProjectID: "prj_shop", BackupID: rec.ID, IntoScratch: true, IdempotencyKey: "r2"})
	if err != nil || !strings.Contains(scratch.Payload, `"scratch":"db_restore_`) {
		t.Fatalf("into scratch: %+v %v", scratch, err)
	}

	// One byte of the stored archive changes.
	path := filepath.Join(e.fs.Root(), filepath.FromSlash(archiveKeyOf(t, e, rec)))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[3] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.Restore(ctx, target{true, false, true}.fn(), backups.RestoreRequest{ProjectID: "prj_shop", BackupID: rec.ID, IdempotencyKey: "r3"})
	if !errors.Is(err, backups.ErrCorrupt) || abierrors.CodeOf(err) != abierrors.BackupCorrupt {
		t.Fatalf("restore of an altered archive: %v, want backup_corrupt", err)
	}
}

// archiveKeyOf finds the one archive of rec in the blob store.
func archiveKeyOf(t *testing.T, e *env, rec *backups.Record) string {
	t.Helper()
	var keys []string
	_ = e.fs.List(context.Background(), "backups/prj_shop/"+rec.ID+"/", func(i blobs.Info) error { keys = append(keys, i.Key); return nil })
	if len(keys) != 1 {
		t.Fatalf("archives of %s: %v", rec.ID, keys)
	}
	return keys[0]
}

func listOps(t *testing.T, q *operations.Queue) []operations.Operation {
	t.Helper()
	ops, err := q.List(context.Background(), "prj_shop")
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// TestDrillResultEventAndMetric enqueues one drill per period, serves the
// archive verified to the executor, and records a failed drill with the
// differing table, an event and the failure metric; a later passing drill
// replaces it.
func TestDrillResultEventAndMetric(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	archive := []byte("archive for the drill")
	rec := e.backupOnce(t, "k", archive)
	op, err := e.m.Drill(ctx, "prj_shop", "web", "db", "2026-W49")
	if err != nil || op == nil || op.Kind != backups.KindDrill {
		t.Fatalf("drill: %+v %v", op, err)
	}
	if again, _ := e.m.Drill(ctx, "prj_shop", "web", "db", "2026-W49"); again.ID != op.ID {
		t.Fatalf("second drill of the same week is another operation")
	}
	if none, err := e.m.Drill(ctx, "prj_shop", "api", "db", "2026-W49"); none != nil || err != nil {
		t.Fatalf("drill of a binding without backups: %v %v", none, err)
	}
	c, h := e.claim(t)
	rc, got, err := e.m.OpenArchive(ctx, c.Operation.ID, h, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(b, archive) || got.ID != rec.ID {
		t.Fatalf("archive read %q, %v", b, err)
	}
	want := figures.Items[0]
	bad := abibackups.Item{Name: want.Name, Count: want.Count, Digest: "rowsum:9:9"}
	res := abibackups.DrillResult{Passed: false, Scratch: "db_drill_x", Dropped: true,
		Figures:     abibackups.Figures{Kind: abibackups.KindPostgres, Items: []abibackups.Item{bad}},
		Differences: []abibackups.Difference{{Name: want.Name, Want: &want, Got: &bad}}}
	d, err := e.m.RecordDrill(ctx, c.Operation.ID, h, res)
	if err != nil || d.Result != backups.DrillFailed || d.Table != "public.orders" {
		t.Fatalf("record drill: %+v %v", d, err)
	}
	stored, _ := e.m.Get(ctx, "prj_shop", rec.ID)
	if stored.Drill == nil || stored.Drill.Result != backups.DrillFailed || stored.Drill.Table != "public.orders" || len(stored.Drill.Differences) != 1 {
		t.Fatalf("stored drill %+v", stored.Drill)
	}
	evs, err := e.ev.List(ctx, 0, backups.EventDrillFailed, 10)
	if err != nil || len(evs) != 1 || evs[0].Event.Subject.ID != rec.ID || evs[0].Event.Data["table"] != "public.orders" {
		t.Fatalf("events %+v, %v", evs, err)
	}
	if v := testutil.ToFloat64(metric(t, e.reg, "berth_backup_drills_total", "failed")); v != 1 {
		t.Fatalf("berth_backup_drills_total{result=failed} = %v", v)
	}

	op2, err := e.m.Drill(ctx, "prj_shop", "web", "db", "2026-W50")
	if err != nil || op2.ID == op.ID {
		t.Fatalf("next week's drill: %v %v", op2, err)
	}
	c2, h2 := e.claim(t)
	if _, err := e.m.RecordDrill(ctx, c2.Operation.ID, h2, abibackups.DrillResult{Passed: true, Dropped: true, Figures: figures}); err != nil {
		t.Fatal(err)
	}
	if stored, _ = e.m.Get(ctx, "prj_shop", rec.ID); stored.Drill.Result != backups.DrillPassed || stored.Drill.Table != "" {
		t.Fatalf("drill after a pass: %+v", stored.Drill)
	}
}

// metric returns the counter of vector name with result label result.
func metric(t *testing.T, reg *prometheus.Registry, name, result string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "copy"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no %s{result=%q}", name, result)
	return nil
}

// TestScheduleDueAndTick checks the cron arithmetic and that ticks request
// one backup per scheduled time however often they run, and one drill per
// week once a backup exists.
func TestScheduleDueAndTick(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		spec, last, now, want string
	}{
		{"0 3 * * *", "2026-12-01T02:00:00Z", "2026-12-01T03:00:00Z", "2026-12-01T03:00:00Z"},
		{"0 3 * * *", "2026-12-01T03:00:00Z", "2026-12-01T04:00:00Z", ""},
		{"0 3 * * *", "2026-11-01T00:00:00Z", "2026-12-01T05:00:00Z", "2026-12-01T03:00:00Z"}, // the latest missed run only
		{"*/15 * * * *", "2026-12-01T03:00:00Z", "2026-12-01T03:44:00Z", "2026-12-01T03:30:00Z"},
	} {
		got, ok, err := backups.Due(c.spec, at(c.last), at(c.now))
		if err != nil || (c.want == "") == ok || (ok && !got.Equal(at(c.want))) {
			t.Errorf("Due(%q, %s, %s) = %v %v %v; want %q", c.spec, c.last, c.now, got, ok, err, c.want)
		}
	}
	for _, bad := range []backups.Schedule{{Cron: "every day"}, {Cron: "0 3 * * *", Keep: -1}, {Drill: "monthly"}} {
		if err := bad.Validate(); !errors.Is(err, backups.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v", bad, err)
		}
	}

	ctx := context.Background()
	e := newEnv(t)
	list := []backups.Scheduled{{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres,
		Schedule: backups.Schedule{Cron: "0 3 * * *", Keep: 2, Drill: backups.DrillWeekly}}}
	start := at("2026-12-01T02:59:30Z")
	if n, err := e.m.Tick(ctx, list, start); err != nil || n != 0 {
		t.Fatalf("first tick before 03:00: %d %v", n, err)
	}
	for i := range 3 {
		n, err := e.m.Tick(ctx, list, at("2026-12-01T03:00:10Z"))
		if err != nil || (i == 0) != (n == 1) {
			t.Fatalf("tick %d at 03:00:10: %d requests, %v", i, n, err)
		}
	}
	recs, _ := e.m.List(ctx, "prj_shop", "web")
	if len(recs) != 1 || recs[0].Trigger != backups.TriggerSchedule || !recs[0].ScheduledAt.Equal(at("2026-12-01T03:00:00Z")) {
		t.Fatalf("records after the ticks: %+v", recs)
	}
	if ops := listOps(t, e.q); len(ops) != 1 {
		t.Fatalf("%d operations after the ticks, want 1 backup", len(ops))
	}
}

// TestExecutorNodeAloneClaims: with ExecutorNode set, a backup operation is claimable by
// that runner node only.
func TestExecutorNodeAloneClaims(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	q := operations.NewQueue(st, operations.Config{})
	fs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := backups.New(backups.Config{Store: st, Queue: q, Blobs: fs, ExecutorNode: "corestore-1"})
	rec, _, err := m.Request(ctx, backups.BackupRequest{ProjectID: "prj_shop", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := q.Claim(ctx, "builder-7", 5, nil); err != nil || len(got) != 0 {
		t.Fatalf("another runner claimed %d operations, %v", len(got), err)
	}
	got, err := q.Claim(ctx, "corestore-1", 5, nil)
	if err != nil || len(got) != 1 || got[0].Operation.ID != rec.OperationID {
		t.Fatalf("the executor claimed %v, %v", got, err)
	}
}
