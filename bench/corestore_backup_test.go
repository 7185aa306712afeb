package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/plugins/corestore/backup"
)

// pgBenchMiB is the size of the database BenchmarkCorestorePostgres backs
// up; BERTH_BENCH_PG_MIB overrides it (for a quick look, never for figures).
func pgBenchMiB(b *testing.B) int {
	if v := os.Getenv("BERTH_BENCH_PG_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("BERTH_BENCH_PG_MIB=%q", v)
		}
		return n
	}
	return 1024
}

// BenchmarkCorestorePostgres backs up and restores a PostgreSQL 15 database
// of about 1 GiB (one table of ~1 KiB rows and its primary key) through
// Berth's path, and runs pg_dump and pg_restore directly on the same server
// with the same format for comparison. Berth's path: the Corestore engine's
// pg_dump -Fc on an exported snapshot with the figures measured in it,
// streamed into the blob store (hashed and counted in flight) through the
// backup manager's begin, upload and commit on the embedded store; the
// restore reads the archive back verified and runs pg_restore. Direct:
// pg_dump -Fc -Z0 to a file, pg_restore from it. Figures, in MB/s of
// pg_database_size: berth_backup, berth_restore, direct_dump,
// direct_restore, and the ratios berth/direct (1 is "as fast as the tools
// alone"); figures_alone_s is the server's time to measure the figures
// without a dump beside it. The scenario runs once whatever b.N.
func BenchmarkCorestorePostgres(b *testing.B) {
	ctx := context.Background()
	pg := pgtest.Start(b)
	e := &backup.Postgres{Host: pg.Host, Port: pg.Port, User: pgtest.Superuser, Password: pg.Password}
	if err := e.Create(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	rows := pgBenchMiB(b) << 20 / 1100
	c, err := pgx.Connect(ctx, pg.URL("bench"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id bigint PRIMARY KEY, payload text NOT NULL);
		INSERT INTO items SELECT i, repeat(md5(i::text), 30) FROM generate_series(1, %d) i`, rows)); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Exec(ctx, "VACUUM ANALYZE items"); err != nil {
		b.Fatal(err)
	}
	var size int64
	if err := c.QueryRow(ctx, "SELECT pg_database_size('bench')").Scan(&size); err != nil {
		b.Fatal(err)
	}
	c.Close(ctx)
	mb := float64(size) / 1e6

	dir := filepath.Join(b.TempDir(), "data")
	unlock, err := store.LockDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unlock() })
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close(context.Background()) })
	fs, err := blobs.NewFS(filepath.Join(dir, "blobs"))
	if err != nil {
		b.Fatal(err)
	}
	q := operations.NewQueue(st, operations.Config{Policy: operations.Policy{LeaseTTL: 30 * time.Minute}})
	m := backups.New(backups.Config{Store: st, Queue: q, Blobs: fs})

	b.ResetTimer()
	// Berth's backup.
	start := time.Now()
	rec, _, err := m.Request(ctx, backups.BackupRequest{ProjectID: "prj_bench", Service: "web", Binding: "db", Kind: abibackups.KindPostgres, IdempotencyKey: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	claimed, err := q.Claim(ctx, "provider:corestore", 1, nil)
	if err != nil || len(claimed) != 1 {
		b.Fatalf("claim: %v %v", claimed, err)
	}
	h := operations.Holder{NodeID: claimed[0].Operation.NodeID, Token: claimed[0].LeaseToken, Fence: claimed[0].Operation.Fence}
	if _, err := m.Begin(ctx, rec.OperationID, h); err != nil {
		b.Fatal(err)
	}
	pr, pw := io.Pipe()
	sum := sha256.New()
	var fig abibackups.Figures
	var n int64
	go func() {
		cw := &countWriter{w: io.MultiWriter(pw, sum)}
		f, err := e.Backup(ctx, "bench", cw)
		fig, n = f, cw.n
		pw.CloseWithError(err)
	}()
	if _, err := m.Upload(ctx, rec.OperationID, h, pr); err != nil {
		b.Fatal(err)
	}
	if _, err := m.Commit(ctx, rec.OperationID, h, backups.Declared{Digest: "sha256:" + hex.EncodeToString(sum.Sum(nil)), Size: n, Figures: fig}, 0); err != nil {
		b.Fatal(err)
	}
	berthBackup := time.Since(start)

	// Berth's restore, into a new database.
	if err := e.Create(ctx, "bench_berth"); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	op, err := m.Restore(ctx, backups.TargetFunc(func(context.Context, string, string, string) (bool, bool, bool, error) { return true, false, true, nil }),
		backups.RestoreRequest{ProjectID: "prj_bench", BackupID: rec.ID, IntoScratch: true, IdempotencyKey: "bench-restore"})
	if err != nil {
		b.Fatal(err)
	}
	claimed, err = q.Claim(ctx, "provider:corestore", 1, nil)
	if err != nil || len(claimed) != 1 || claimed[0].Operation.ID != op.ID {
		b.Fatalf("claim restore: %v %v", claimed, err)
	}
	h = operations.Holder{NodeID: claimed[0].Operation.NodeID, Token: claimed[0].LeaseToken, Fence: claimed[0].Operation.Fence}
	rc, _, err := m.OpenArchive(ctx, op.ID, h, rec.ID)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Restore(ctx, "bench_berth", rc, backup.RestoreOptions{}); err != nil {
		b.Fatal(err)
	}
	rc.Close()
	berthRestore := time.Since(start)
	got, err := e.Measure(ctx, "bench_berth")
	if err != nil {
		b.Fatal(err)
	}
	if d := backup.Compare(fig, got); len(d) != 0 {
		b.Fatalf("restored database differs: %v", d)
	}

	// The figures alone (measured during Berth's backup, concurrently with pg_dump).
	start = time.Now()
	if _, err := e.Measure(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	measure := time.Since(start)

	// The tools alone, same server, same format.
	file := filepath.Join(b.TempDir(), "direct.dump")
	env := append(os.Environ(), "PGHOST="+pg.Host, "PGPORT="+strconv.Itoa(pg.Port), "PGUSER="+pgtest.Superuser, "PGPASSWORD="+pg.Password)
	start = time.Now()
	dump := exec.Command(filepath.Join(pg.BinDir, "pg_dump"), "-Fc", "-Z0", "-f", file, "bench")
	dump.Env = env
	if out, err := dump.CombinedOutput(); err != nil {
		b.Fatalf("pg_dump: %v: %s", err, out)
	}
	directDump := time.Since(start)
	if err := e.Create(ctx, "bench_direct"); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	restore := exec.Command(filepath.Join(pg.BinDir, "pg_restore"), "--no-owner", "--single-transaction", "-d", "bench_direct", file)
	restore.Env = env
	if out, err := restore.CombinedOutput(); err != nil {
		b.Fatalf("pg_restore: %v: %s", err, out)
	}
	directRestore := time.Since(start)
	b.StopTimer()

	rate := func(d time.Duration) float64 { return mb / d.Seconds() }
	b.ReportMetric(mb, "database_MB")
	b.ReportMetric(measure.Seconds(), "figures_alone_s")
	b.ReportMetric(rate(berthBackup), "berth_backup_MB/s")
	b.ReportMetric(rate(berthRestore), "berth_restore_MB/s")
	b.ReportMetric(rate(directDump), "direct_dump_MB/s")
	b.ReportMetric(rate(directRestore), "direct_restore_MB/s")
	b.ReportMetric(directDump.Seconds()/berthBackup.Seconds(), "backup_ratio")
	b.ReportMetric(directRestore.Seconds()/berthRestore.Seconds(), "restore_ratio")
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
