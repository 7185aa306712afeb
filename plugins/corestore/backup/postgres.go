package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Postgres is the engine of one PostgreSQL server, reached with an admin
// role that may create and drop databases (docs/backups.md section 3.1).
// Archives are pg_dump's custom format (-Fc), written by Debian's client of
// the server's own major version.
type Postgres struct {
	Host     string // server host; empty: 127.0.0.1
	Port     int    // server port; zero: 5432
	User     string // admin role; empty: postgres
	Password string // admin password (handed to the tools in the environment, never on a command line)
	SSLMode  string // libpq sslmode; empty: disable
	// BinDir holds pg_dump and pg_restore; empty: Debian's
	// /usr/lib/postgresql/<server major>/bin.
	BinDir string
	// Compress is pg_dump's compression level for the archive's data
	// (1 to 9); zero or negative stores rows uncompressed, which is the
	// fastest dump and restore and lets a drill see a damaged row as a
	// figure of its table rather than as a broken zlib stream.
	Compress int
	// Owner, when set, is the role a restore into a live database acts as (pg_restore
	// --role), so the restored objects belong to the binding's role and not to the admin
	// (with --no-owner they would otherwise be the admin's, out of the application's reach);
	// a live database that is missing is created owned by Owner first. Empty: the admin's.
	Owner string
}

var _ Engine = (*Postgres)(nil)

// Kind implements Engine.
func (p *Postgres) Kind() Kind { return KindPostgres }

func (p *Postgres) host() string {
	if p.Host == "" {
		return "127.0.0.1"
	}
	return p.Host
}

func (p *Postgres) port() int {
	if p.Port == 0 {
		return 5432
	}
	return p.Port
}

func (p *Postgres) user() string {
	if p.User == "" {
		return "postgres"
	}
	return p.User
}

func (p *Postgres) sslmode() string {
	if p.SSLMode == "" {
		return "disable"
	}
	return p.SSLMode
}

// connect opens an admin connection to database db.
func (p *Postgres) connect(ctx context.Context, db string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d sslmode=%s", p.host(), p.port(), p.sslmode()))
	if err != nil {
		return nil, fmt.Errorf("postgres config: %w", err)
	}
	cfg.User, cfg.Password, cfg.Database = p.user(), p.Password, db
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres %s database %s: %w: %w", net.JoinHostPort(p.host(), strconv.Itoa(p.port())), db, ErrUnreachable, err)
	}
	return c, nil
}

// env is the tools' environment: the connection in libpq variables, so the
// password never reaches a command line.
func (p *Postgres) env(db string) []string {
	env := []string{"PGHOST=" + p.host(), "PGPORT=" + strconv.Itoa(p.port()), "PGUSER=" + p.user(),
		"PGPASSWORD=" + p.Password, "PGSSLMODE=" + p.sslmode(), "PGDATABASE=" + db, "PGCONNECT_TIMEOUT=10"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// serverMajor reads the server's major version (15 for 150004).
func serverMajor(ctx context.Context, c *pgx.Conn) (int, error) {
	var num string
	if err := c.QueryRow(ctx, "SHOW server_version_num").Scan(&num); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, fmt.Errorf("server_version_num %q: %w", num, err)
	}
	return n / 10000, nil
}

var toolVersion = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// ParseToolMajor reads the major version from a PostgreSQL tool's --version
// line ("pg_dump (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)" is 15).
func ParseToolMajor(out string) (int, error) {
	m := toolVersion.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("unrecognised version output %q", strings.TrimSpace(out))
	}
	return strconv.Atoi(m[1])
}

// tool returns the path of pg_dump or pg_restore for a server of major
// version major, after checking the tool reports that same major.
func (p *Postgres) tool(ctx context.Context, name string, major int) (string, error) {
	dir := p.BinDir
	if dir == "" {
		dir = fmt.Sprintf("/usr/lib/postgresql/%d/bin", major)
	}
	path := filepath.Join(dir, name)
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s for PostgreSQL %d is not usable at %s (apt-get install postgresql-client-%d): %w: %w", name, major, path, major, ErrVersionMismatch, err)
	}
	got, err := ParseToolMajor(string(out))
	if err != nil {
		return "", fmt.Errorf("%s at %s: %w: %w", name, path, ErrVersionMismatch, err)
	}
	if got != major {
		return "", fmt.Errorf("%s at %s is version %d but the server is PostgreSQL %d; install postgresql-client-%d: %w", name, path, got, major, major, ErrVersionMismatch)
	}
	return path, nil
}

// Backup implements Engine: it opens a repeatable-read transaction, exports
// its snapshot, and measures every table inside that snapshot while pg_dump
// -Fc dumps the same snapshot, so the figures describe exactly the archive.
func (p *Postgres) Backup(ctx context.Context, db string, w io.Writer) (Figures, error) {
	c, err := p.connect(ctx, db)
	if err != nil {
		return Figures{}, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	major, err := serverMajor(ctx, c)
	if err != nil {
		return Figures{}, err
	}
	dump, err := p.tool(ctx, "pg_dump", major)
	if err != nil {
		return Figures{}, err
	}
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Figures{}, fmt.Errorf("begin snapshot of %s: %w", db, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	var snap string
	if err := tx.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&snap); err != nil {
		return Figures{}, fmt.Errorf("export snapshot of %s: %w", db, err)
	}
	// pg_dump and the measurement run at once, on the same snapshot: the
	// server scans each table twice, but no longer one pass after the other.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(dctx, dump, "--format=custom", "--snapshot="+snap, "--no-password",
		"--compress="+strconv.Itoa(max(p.Compress, 0)))
	cmd.Env = p.env(db)
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &limited{w: &stderr, n: 8 << 10}
	if err := cmd.Start(); err != nil {
		return Figures{}, fmt.Errorf("pg_dump %s: %w", db, err)
	}
	fig, merr := measure(ctx, tx)
	if merr != nil {
		cancel()
	}
	werr := cmd.Wait()
	if merr != nil {
		return Figures{}, fmt.Errorf("measure %s: %w", db, merr)
	}
	if werr != nil {
		return Figures{}, fmt.Errorf("pg_dump %s: %w: %s", db, werr, strings.TrimSpace(stderr.String()))
	}
	return fig, nil
}

// Restore implements Engine with pg_restore in one transaction, stopping at
// the first error; Clean drops the archive's objects first. The target
// database must exist.
func (p *Postgres) Restore(ctx context.Context, db string, r io.Reader, opt RestoreOptions) error {
	if p.Owner != "" && opt.Clean {
		if err := p.ensureOwned(ctx, db); err != nil {
			return err
		}
	}
	c, err := p.connect(ctx, db)
	if err != nil {
		return err
	}
	major, err := serverMajor(ctx, c)
	c.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	restore, err := p.tool(ctx, "pg_restore", major)
	if err != nil {
		return err
	}
	args := []string{"--dbname=" + db, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--no-password"}
	if opt.Clean {
		args = append(args, "--clean", "--if-exists")
		if p.Owner != "" {
			args = append(args, "--role="+p.Owner)
		}
	}
	cmd := exec.CommandContext(ctx, restore, args...)
	cmd.Env = p.env(db)
	cmd.Stdin = r
	var stderr bytes.Buffer
	cmd.Stderr = &limited{w: &stderr, n: 8 << 10}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "input file does not appear to be a valid archive") ||
			strings.Contains(msg, "could not read input file") || strings.Contains(msg, "could not read from input file") || strings.Contains(msg, "unexpected end of file") ||
			strings.Contains(msg, "did not find magic string") || strings.Contains(msg, "could not find block") {
			return fmt.Errorf("pg_restore %s: %w: %s", db, ErrArchiveInvalid, msg)
		}
		return fmt.Errorf("pg_restore %s: %w: %s", db, err, msg)
	}
	return nil
}

// Measure implements Engine in a repeatable-read transaction.
func (p *Postgres) Measure(ctx context.Context, db string) (Figures, error) {
	c, err := p.connect(ctx, db)
	if err != nil {
		return Figures{}, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Figures{}, fmt.Errorf("begin measure of %s: %w", db, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	return measure(ctx, tx)
}

// measure computes the figures of every ordinary and partitioned table
// outside the system schemas: the row count, and a digest that does not
// depend on row order, computed by the server as exact numeric sums over
// all rows ([measureTable]).
func measure(ctx context.Context, tx pgx.Tx) (Figures, error) {
	rows, err := tx.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
		ORDER BY 1, 2`)
	if err != nil {
		return Figures{}, fmt.Errorf("list tables: %w", err)
	}
	var tables [][2]string
	for rows.Next() {
		var s, t string
		if err := rows.Scan(&s, &t); err != nil {
			rows.Close()
			return Figures{}, err
		}
		tables = append(tables, [2]string{s, t})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Figures{}, fmt.Errorf("list tables: %w", err)
	}
	fig := Figures{Kind: KindPostgres, Items: []Item{}}
	for _, t := range tables {
		it, err := measureTable(ctx, tx, t[0], t[1])
		if err != nil {
			return Figures{}, err
		}
		fig.Items = append(fig.Items, it)
	}
	sortItems(fig.Items)
	return fig, nil
}

// measureTable computes one table's figures. It first tries the server's
// 64-bit record hash (hash_record_extended, seeds 0 and 1: no text
// conversion, several times faster than md5 of the row text), inside a
// savepoint because a table with a column type that has no hash function
// refuses it; that table then falls back to md5 of each row's text. The
// digest's prefix says which was used ("rhash:" or "rowsum:"), and the same
// table measures the same way on a restore.
func measureTable(ctx context.Context, tx pgx.Tx, schema, table string) (Item, error) {
	name := pgx.Identifier{schema, table}.Sanitize()
	var n int64
	var a, b string
	// Enum values hash by their OID, which differs in every database the type is created in
	// (a restore makes new ones), and so do composite, domain and range types built on them
	// and the OID and reg* types: such a table measures by the row text, which names values.
	var oidBound int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		AND (t.typtype <> 'b' OR t.typname = 'oid' OR t.typname LIKE 'reg%'
			OR (e.oid IS NOT NULL AND (e.typtype <> 'b' OR e.typname = 'oid' OR e.typname LIKE 'reg%')))`, name).Scan(&oidBound); err != nil {
		return Item{}, fmt.Errorf("measure table %s.%s: column types: %w", schema, table, err)
	}
	if oidBound > 0 {
		return measureRowText(ctx, tx, schema, table)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Item{}, fmt.Errorf("measure table %s.%s: %w", schema, table, err)
	}
	err = sp.QueryRow(ctx, `SELECT count(*), coalesce(sum(hash_record_extended(t, 0)::numeric), 0)::text,
		coalesce(sum(hash_record_extended(t, 1)::numeric), 0)::text FROM `+name+` AS t`).Scan(&n, &a, &b)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return Item{}, fmt.Errorf("measure table %s.%s: %w", schema, table, err)
		}
		return Item{Name: schema + "." + table, Count: n, Digest: "rhash:" + a + ":" + b}, nil
	}
	if rerr := sp.Rollback(ctx); rerr != nil {
		return Item{}, fmt.Errorf("measure table %s.%s: %w", schema, table, rerr)
	}
	return measureRowText(ctx, tx, schema, table)
}

// measureRowText computes one table's figures from md5 of each row's text ("rowsum:").
func measureRowText(ctx context.Context, tx pgx.Tx, schema, table string) (Item, error) {
	name := pgx.Identifier{schema, table}.Sanitize()
	var n int64
	var a, b string
	q := `SELECT count(*),
		coalesce(sum(('x' || substr(h, 1, 16))::bit(64)::bigint::numeric), 0)::text,
		coalesce(sum(('x' || substr(h, 17, 16))::bit(64)::bigint::numeric), 0)::text
		FROM (SELECT md5(t::text) AS h FROM ` + name + ` AS t) AS rows`
	if err := tx.QueryRow(ctx, q).Scan(&n, &a, &b); err != nil {
		return Item{}, fmt.Errorf("measure table %s.%s: %w", schema, table, err)
	}
	return Item{Name: schema + "." + table, Count: n, Digest: "rowsum:" + a + ":" + b}, nil
}

// Create implements Engine (CREATE DATABASE owned by the admin role).
func (p *Postgres) Create(ctx context.Context, db string) error {
	c, err := p.connect(ctx, "postgres")
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P04" {
			return fmt.Errorf("create database %s: %w", db, ErrExists)
		}
		return fmt.Errorf("create database %s: %w", db, err)
	}
	return nil
}

// ensureOwned creates database db owned by [Postgres.Owner] when it does not exist (a
// live database dropped by accident is what a restore repairs); an existing one is left as
// it is.
func (p *Postgres) ensureOwned(ctx context.Context, db string) error {
	c, err := p.connect(ctx, "postgres")
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n); err != nil {
		return fmt.Errorf("look up database %s: %w", db, err)
	}
	if n > 0 {
		return nil
	}
	q := "CREATE DATABASE " + pgx.Identifier{db}.Sanitize() + " OWNER " + pgx.Identifier{p.Owner}.Sanitize()
	if _, err := c.Exec(ctx, q); err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P04" {
			return nil // made meanwhile
		}
		return fmt.Errorf("create database %s for the restore: %w", db, err)
	}
	return nil
}

// Drop implements Engine (DROP DATABASE ... WITH (FORCE), ending sessions).
func (p *Postgres) Drop(ctx context.Context, db string) error {
	c, err := p.connect(ctx, "postgres")
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db, err)
	}
	return nil
}

// limited keeps the first n bytes written to it and drops the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(len(b), l.n)
		l.n -= k
		if _, err := l.w.Write(b[:k]); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}
