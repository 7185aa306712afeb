// Package localstore is the node agent's durable state: its identity, the newest
// verified desired-state snapshots, applied_rev and per-workload records, in one SQLite file.
package localstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// FileName is the store's file inside the agent's data directory.
const FileName = "agent.db"

// snapshotsKept is how many verified snapshots the store keeps; older ones are pruned.
const snapshotsKept = 5

// ErrNotEnrolled is returned by [Store.Identity] when the data directory holds no enrollment.
var ErrNotEnrolled = errors.New("berth: node is not enrolled (run berth-agent enroll first)")

// ErrAlreadyEnrolled is returned by [Store.SaveIdentity] when an identity is already stored.
var ErrAlreadyEnrolled = errors.New("berth: node is already enrolled in this data directory")

// Store is the agent's local SQLite store. It holds one connection, so every
// write is serialised; it is safe for concurrent use.
type Store struct {
	db *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS identity (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	node_id TEXT NOT NULL,
	credential TEXT NOT NULL,
	cluster_public_key TEXT NOT NULL,
	cluster_id TEXT NOT NULL,
	server_url TEXT NOT NULL,
	private_key_path TEXT NOT NULL,
	address TEXT NOT NULL,
	hostname TEXT NOT NULL,
	enrolled_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
	rev INTEGER PRIMARY KEY,
	body BLOB NOT NULL,
	stored_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
	key TEXT PRIMARY KEY,
	value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node_meta (
	key TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
	pos INTEGER PRIMARY KEY AUTOINCREMENT,
	id TEXT NOT NULL UNIQUE,
	body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS workloads (
	workload_id TEXT PRIMARY KEY,
	driver TEXT NOT NULL,
	phase TEXT NOT NULL,
	port INTEGER NOT NULL,
	spec_hash TEXT NOT NULL,
	restart_generation INTEGER NOT NULL,
	restart_count INTEGER NOT NULL,
	last_exit_code INTEGER,
	backoff_step INTEGER NOT NULL,
	next_start_at TEXT NOT NULL,
	started_at TEXT NOT NULL,
	message TEXT NOT NULL
);
`

// Open opens (creating when absent) the store at path with WAL journaling and
// full synchronous commits, so a write that returned survives a crash. The
// file is created owner-only (0600) and its directory 0700.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create store file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("create store file: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("restrict store file: %w", err)
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create store schema: %w", err)
	}
	if _, err := db.ExecContext(ctx, changelogSchema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create store schema: %w", err)
	}
	if err := migrate(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := migrateLeases(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := migrateAttempts(ctx, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	return &Store{db: db}, nil
}

// Close closes the database. The Store is unusable afterwards.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// Identity is what enrollment gives a node (docs/node-protocol.md section 2.5).
// Credential is a secret: never log it.
type Identity struct {
	NodeID           string
	Credential       string
	ClusterPublicKey string // base64 std Ed25519 public key that signs desired state
	ClusterID        string
	ServerURL        string
	PrivateKeyPath   string
	Address          string // host address workloads bind to
	Hostname         string
	EnrolledAt       time.Time
}

// SaveIdentity stores the node's identity once. It returns an error wrapping
// [ErrAlreadyEnrolled] when one is already stored.
func (s *Store) SaveIdentity(ctx context.Context, id Identity) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM identity`).Scan(&n); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("save identity: %w", ErrAlreadyEnrolled)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO identity (id, node_id, credential, cluster_public_key, cluster_id,
		server_url, private_key_path, address, hostname, enrolled_at) VALUES (1,?,?,?,?,?,?,?,?,?)`,
		id.NodeID, id.Credential, id.ClusterPublicKey, id.ClusterID, id.ServerURL, id.PrivateKeyPath,
		id.Address, id.Hostname, formatTime(id.EnrolledAt))
	if err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	return nil
}

// Identity returns the stored identity, or an error wrapping [ErrNotEnrolled].
func (s *Store) Identity(ctx context.Context) (*Identity, error) {
	var id Identity
	var enrolled string
	err := s.db.QueryRowContext(ctx, `SELECT node_id, credential, cluster_public_key, cluster_id, server_url,
		private_key_path, address, hostname, enrolled_at FROM identity WHERE id = 1`).Scan(
		&id.NodeID, &id.Credential, &id.ClusterPublicKey, &id.ClusterID, &id.ServerURL,
		&id.PrivateKeyPath, &id.Address, &id.Hostname, &enrolled)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotEnrolled
	}
	if err != nil {
		return nil, fmt.Errorf("read identity: %w", err)
	}
	id.EnrolledAt = parseTime(enrolled)
	return &id, nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
