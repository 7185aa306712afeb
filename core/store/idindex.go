package store

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the SQLite driver the embedded FerretDB uses too
)

// FerretDB v1.24's SQLite backend looks documents up by _id with the
// expression _ferretdb_sjson->'$._id', but indexes _id as
// _ferretdb_sjson->"_id". SQLite matches index expressions by their text, so
// it never uses that index: every read, update or delete by _id scans the
// table and parses the JSON of every row (measured: EXPLAIN QUERY PLAN says
// SCAN, and a lookup grows with the collection). The embedded store therefore
// keeps, on every FerretDB table, an index on the exact expression FerretDB
// queries with. FerretDB does not know about it: it only changes SQLite's
// plan, uniqueness is still FerretDB's own index, and dropping a collection
// drops the table with its indexes.

// idIndexPeriod is how often new tables (collections created since) get
// their index.
const idIndexPeriod = 2 * time.Second

// idIndexSuffix names the extra index of a table: "<table>_berth_id".
const idIndexSuffix = "_berth_id"

// tableName is the shape of FerretDB's generated table names; anything else
// is left alone.
var tableName = regexp.MustCompile(`^[a-z0-9_]+$`)

// idIndexer adds the _id lookup index to the tables of one SQLite file.
type idIndexer struct {
	db  *sql.DB
	log *slog.Logger
}

// openIDIndexer opens the SQLite file dir/<database>.sqlite beside FerretDB.
// The file may not exist yet (an empty store); indexing then starts with its
// first collection.
func openIDIndexer(dir, database string, log *slog.Logger) (*idIndexer, error) {
	path := filepath.Join(dir, database+".sqlite")
	dsn := (&url.URL{Scheme: "file", Path: path, RawQuery: "_pragma=busy_timeout(10000)"}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s for its _id indexes: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	return &idIndexer{db: db, log: log}, nil
}

// ensure creates the missing _id lookup indexes and returns how many it
// created. A database without FerretDB's metadata table yet has none to index.
func (x *idIndexer) ensure(ctx context.Context) (int, error) {
	rows, err := x.db.QueryContext(ctx, `SELECT table_name FROM _ferretdb_collections`)
	if err != nil {
		if isNoSuchTable(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("store: list embedded tables: %w", err)
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return 0, fmt.Errorf("store: list embedded tables: %w", err)
		}
		if tableName.MatchString(t) {
			tables = append(tables, t)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("store: list embedded tables: %w", err)
	}
	existing := map[string]bool{}
	irows, err := x.db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'index'`)
	if err != nil {
		return 0, fmt.Errorf("store: list embedded indexes: %w", err)
	}
	for irows.Next() {
		var n string
		if err := irows.Scan(&n); err != nil {
			irows.Close()
			return 0, fmt.Errorf("store: list embedded indexes: %w", err)
		}
		existing[n] = true
	}
	irows.Close()
	created := 0
	for _, t := range tables {
		if existing[t+idIndexSuffix] {
			continue
		}
		q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (_ferretdb_sjson->'$._id')`, t+idIndexSuffix, t)
		if _, err := x.db.ExecContext(ctx, q); err != nil {
			if isNoSuchTable(err) {
				continue // dropped meanwhile
			}
			return created, fmt.Errorf("store: index _id of %s: %w", t, err)
		}
		created++
	}
	return created, nil
}

// run keeps the indexes in place until ctx ends: new collections appear
// whenever Berth first writes to them.
func (x *idIndexer) run(ctx context.Context) {
	t := time.NewTicker(idIndexPeriod)
	defer t.Stop()
	for {
		if n, err := x.ensure(ctx); err != nil && ctx.Err() == nil {
			x.log.Warn("store: could not add _id lookup indexes to the embedded store", "err", err)
		} else if n > 0 {
			x.log.Debug("store: added _id lookup indexes", "tables", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (x *idIndexer) close() error { return x.db.Close() }

func isNoSuchTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}
