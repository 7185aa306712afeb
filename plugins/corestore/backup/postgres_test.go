package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthhq/berth/plugins/corestore/backup"
)

func pgEngine() *backup.Postgres {
	return &backup.Postgres{Host: pg.Host, Port: pg.Port, User: "postgres", Password: pg.Password}
}

// seedShop makes database db with three tables: customers and orders with
// primary keys and an index, and a log table without a key holding
// duplicate rows.
func seedShop(t *testing.T, ctx context.Context, e *backup.Postgres, db string) {
	t.Helper()
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
		`CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, joined timestamptz NOT NULL DEFAULT '2026-01-01')`,
		`CREATE TABLE orders (id bigserial PRIMARY KEY, customer int REFERENCES customers(id), total numeric(12,2), note text)`,
		`CREATE INDEX orders_customer ON orders (customer)`,
		`CREATE TABLE log (line text)`,
		`CREATE TABLE shapes (id int, at point)`, // point has no hash function: md5 of the row text
		`INSERT INTO shapes VALUES (1, '(1,2)'), (2, '(3,4)'), (3, NULL)`,
		`INSERT INTO customers (id, name) SELECT i, 'alice-' || lpad(i::text, 4, '0') FROM generate_series(1, 200) i`,
		`INSERT INTO orders (customer, total, note) SELECT 1 + i % 200, i * 1.25, repeat('x', i % 50) FROM generate_series(1, 3000) i`,
		`INSERT INTO log VALUES ('same'), ('same'), ('other'), (NULL)`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func pgExec(t *testing.T, ctx context.Context, db, q string) {
	t.Helper()
	c, err := pgx.Connect(ctx, pg.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func pgExists(t *testing.T, ctx context.Context, db string) bool {
	t.Helper()
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestPostgresBackupRestore dumps a database with pg_dump -Fc, restores it
// into a new database and into the live one after rows were lost, and
// checks that the figures, the data and the index come back.
func TestPostgresBackupRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := pgEngine()
	seedShop(t, ctx, e, "shop")
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "shop", &archive)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(archive.Bytes(), []byte("PGDMP")) {
		t.Fatalf("archive starts %q, not pg_dump's custom format", archive.Bytes()[:8])
	}
	counts := map[string]int64{}
	for _, it := range fig.Items {
		counts[it.Name] = it.Count
		want := "rhash:"
		if it.Name == "public.shapes" {
			want = "rowsum:"
		}
		if !strings.HasPrefix(it.Digest, want) {
			t.Errorf("%s digest %q, want %s...", it.Name, it.Digest, want)
		}
	}
	want := map[string]int64{"public.customers": 200, "public.orders": 3000, "public.log": 4, "public.shapes": 3}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("figures %s = %d rows, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("figures name %v, want exactly %v", counts, want)
	}

	if err := e.Create(ctx, "shop_copy"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "shop_copy") })
	if err := e.Restore(ctx, "shop_copy", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := e.Measure(ctx, "shop_copy")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(fig, got); len(d) != 0 {
		t.Fatalf("restored copy differs: %v", d)
	}
	c, err := pgx.Connect(ctx, pg.URL("shop_copy"))
	if err != nil {
		t.Fatal(err)
	}
	var idx int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_customer'").Scan(&idx); err != nil || idx != 1 {
		t.Errorf("index orders_customer restored %d times, %v", idx, err)
	}
	c.Close(ctx)

	// Lose rows in the live database, then restore over it.
	pgExec(t, ctx, "shop", "DELETE FROM orders WHERE id > 10; UPDATE customers SET name = 'mallory' WHERE id = 7")
	if lost, _ := e.Measure(ctx, "shop"); len(backup.Compare(fig, lost)) != 2 {
		t.Fatalf("after the damage, differences %v; want orders and customers", backup.Compare(fig, lost))
	}
	if err := e.Restore(ctx, "shop", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{Clean: true}); err != nil {
		t.Fatal(err)
	}
	back, err := e.Measure(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(fig, back); len(d) != 0 {
		t.Fatalf("live database after restore differs: %v", d)
	}
}

// TestPostgresFiguresSeeOneRow changes one column of one row and expects
// exactly that table's digest to differ, with the same row count.
func TestPostgresFiguresSeeOneRow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := pgEngine()
	seedShop(t, ctx, e, "figures")
	before, err := e.Measure(ctx, "figures")
	if err != nil {
		t.Fatal(err)
	}
	pgExec(t, ctx, "figures", "UPDATE orders SET total = total + 0.01 WHERE id = 1234")
	after, err := e.Measure(ctx, "figures")
	if err != nil {
		t.Fatal(err)
	}
	d := backup.Compare(before, after)
	if len(d) != 1 || d[0].Name != "public.orders" || d[0].Want.Count != d[0].Got.Count {
		t.Fatalf("differences %v; want only public.orders with the same count", d)
	}
	// The same on a table measured by the md5 fallback.
	pgExec(t, ctx, "figures", "UPDATE shapes SET at = '(9,9)' WHERE id = 1")
	again, err := e.Measure(ctx, "figures")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(after, again); len(d) != 1 || d[0].Name != "public.shapes" {
		t.Fatalf("differences %v; want only public.shapes", d)
	}
}

// TestPostgresRefusesOtherMajor points the engine at a pg_dump that reports
// major 14 against the PostgreSQL 15 server; the backup is refused before
// anything is written, naming both versions.
func TestPostgresRefusesOtherMajor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	// A stand-in for Debian's postgresql-client-14: only its version line
	// matters, and the engine must not run it further.
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'pg_dump (PostgreSQL) 14.13 (Debian 14.13-1)'; exit 0; fi\necho ran >&2; exit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "pg_dump"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e := pgEngine()
	e.BinDir = dir
	var out bytes.Buffer
	_, err := e.Backup(ctx, "postgres", &out)
	if !errors.Is(err, backup.ErrVersionMismatch) {
		t.Fatalf("backup with pg_dump 14: %v, want ErrVersionMismatch", err)
	}
	if !strings.Contains(err.Error(), "version 14") || !strings.Contains(err.Error(), "PostgreSQL 15") {
		t.Errorf("error %q does not name both versions", err)
	}
	if out.Len() != 0 {
		t.Errorf("%d bytes written despite the refusal", out.Len())
	}
	for in, want := range map[string]int{
		"pg_dump (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n": 15,
		"pg_restore (PostgreSQL) 16.2":                          16,
	} {
		if got, err := backup.ParseToolMajor(in); err != nil || got != want {
			t.Errorf("ParseToolMajor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := backup.ParseToolMajor("pg_dump 15"); err == nil {
		t.Error("ParseToolMajor accepted a line without (PostgreSQL)")
	}
}

// TestPostgresRestoreRefusesTruncatedArchive restores half an archive and
// bytes that are no archive at all.
func TestPostgresRestoreRefusesTruncatedArchive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := pgEngine()
	seedShop(t, ctx, e, "trunc")
	var archive bytes.Buffer
	if _, err := e.Backup(ctx, "trunc", &archive); err != nil {
		t.Fatal(err)
	}
	if err := e.Create(ctx, "trunc_target"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "trunc_target") })
	half := archive.Bytes()[:archive.Len()/2]
	if err := e.Restore(ctx, "trunc_target", bytes.NewReader(half), backup.RestoreOptions{}); err == nil {
		t.Fatal("half an archive restored without an error")
	} else if !errors.Is(err, backup.ErrArchiveInvalid) {
		t.Errorf("half an archive: %v, want ErrArchiveInvalid", err)
	}
	if err := e.Restore(ctx, "trunc_target", strings.NewReader("not an archive at all"), backup.RestoreOptions{}); !errors.Is(err, backup.ErrArchiveInvalid) {
		t.Errorf("garbage: %v, want ErrArchiveInvalid", err)
	}
	got, err := e.Measure(ctx, "trunc_target")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != 0 {
		t.Errorf("a refused restore left tables behind: %v", got.Items)
	}
}

// TestPostgresDrill runs a drill of a good archive (passed, scratch
// dropped) and of an archive in which one customer row was altered on its
// way to storage (failed, naming public.customers only).
func TestPostgresDrill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := pgEngine()
	seedShop(t, ctx, e, "drilled")
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "drilled", &archive)
	if err != nil {
		t.Fatal(err)
	}
	res, err := backup.Drill(ctx, e, bytes.NewReader(archive.Bytes()), fig, "drilled_scratch")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed || !res.Dropped || res.Error != "" {
		t.Fatalf("drill of a good archive: %+v", res)
	}
	if pgExists(t, ctx, "drilled_scratch") {
		t.Fatal("scratch database left behind")
	}

	bad := corrupt(t, archive.Bytes(), "alice-0042", "alicE-0042")
	res, err = backup.Drill(ctx, e, bytes.NewReader(bad), fig, "drilled_scratch2")
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || res.Error != "" || len(res.Differences) != 1 || res.Differences[0].Name != "public.customers" {
		t.Fatalf("drill of a corrupted archive: passed=%v error=%q differences=%v; want failed on public.customers", res.Passed, res.Error, res.Differences)
	}
	if !res.Dropped || pgExists(t, ctx, "drilled_scratch2") {
		t.Fatal("scratch database of the failed drill left behind")
	}
}

// corrupt replaces the one occurrence of old in b with new (same length).
func corrupt(t *testing.T, b []byte, old, new string) []byte {
	t.Helper()
	if bytes.Count(b, []byte(old)) != 1 || len(old) != len(new) {
		t.Fatalf("archive holds %q %d times", old, bytes.Count(b, []byte(old)))
	}
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

// TestPostgresDrillOfEnumColumns: enum values hash by OID, and a restore makes new OIDs, so
// a table with an enum column (or an array of one) must measure the same in a drill as at
// backup time.
func TestPostgresDrillOfEnumColumns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := pgEngine()
	if err := e.Create(ctx, "enums"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "enums") })
	pgExec(t, ctx, "enums", `CREATE TYPE mood AS ENUM ('calm', 'busy');
		CREATE TABLE users (id int PRIMARY KEY, m mood NOT NULL, ms mood[]);
		INSERT INTO users SELECT i, CASE WHEN i % 2 = 0 THEN 'calm'::mood ELSE 'busy' END, ARRAY['busy'::mood] FROM generate_series(1, 50) i`)
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "enums", &archive)
	if err != nil {
		t.Fatal(err)
	}
	res, err := backup.Drill(ctx, e, bytes.NewReader(archive.Bytes()), fig, "enums_scratch")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed || res.Error != "" {
		t.Fatalf("drill of a table with enum columns: passed=%v error=%q differences=%v", res.Passed, res.Error, res.Differences)
	}
}

// TestPostgresRestoreAsOwnerIntoDroppedDatabase: a live restore with Owner set recreates a
// dropped database owned by that role, and the restored tables are the role's, so the
// application's own login reads them.
func TestPostgresRestoreAsOwnerIntoDroppedDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := pgEngine()
	pgExec(t, ctx, "postgres", `CREATE ROLE app_owner LOGIN PASSWORD 'app-secret'`)
	t.Cleanup(func() {
		_ = e.Drop(context.Background(), "owned")
		c, err := pgx.Connect(context.Background(), pg.URL("postgres"))
		if err == nil {
			_, _ = c.Exec(context.Background(), `DROP ROLE IF EXISTS app_owner`)
			c.Close(context.Background())
		}
	})
	pgExec(t, ctx, "postgres", `CREATE DATABASE owned OWNER app_owner`)
	app := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://app_owner:app-secret@%s/owned?sslmode=disable", pg.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := app()
	if _, err := c.Exec(ctx, `CREATE TABLE notes (body text); INSERT INTO notes VALUES ('kept')`); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	var archive bytes.Buffer
	if _, err := e.Backup(ctx, "owned", &archive); err != nil {
		t.Fatal(err)
	}
	if err := e.Drop(ctx, "owned"); err != nil {
		t.Fatal(err)
	}
	owner := *e
	owner.Owner = "app_owner"
	if err := owner.Restore(ctx, "owned", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{Clean: true}); err != nil {
		t.Fatal(err)
	}
	c = app()
	defer c.Close(ctx)
	var body string
	if err := c.QueryRow(ctx, `SELECT body FROM notes`).Scan(&body); err != nil || body != "kept" {
		t.Fatalf("the owner reads %q, %v", body, err)
	}
}
