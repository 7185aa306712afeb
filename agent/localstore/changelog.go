package localstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// ErrLogNotNext is returned by [Store.AppendLog] when the first entry does not
// follow the stored head (its seq is not head + 1 or its prev_hash is not the
// head's hash).
var ErrLogNotNext = errors.New("berth: change-log entries do not follow the stored head")

const changelogSchema = `CREATE TABLE IF NOT EXISTS changelog (
	seq INTEGER PRIMARY KEY,
	hash TEXT NOT NULL,
	body BLOB NOT NULL
)`

// LogHead returns the newest stored change-log entry's seq and hash: 0 and ""
// for an empty copy (docs/node-protocol.md section 7.4).
func (s *Store) LogHead(ctx context.Context) (int64, string, error) {
	var seq int64
	var hash string
	err := s.db.QueryRowContext(ctx, `SELECT seq, hash FROM changelog ORDER BY seq DESC LIMIT 1`).Scan(&seq, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read change-log head: %w", err)
	}
	return seq, hash, nil
}

// AppendLog stores entries, which the caller verified with node.VerifyChain
// against [Store.LogHead], in one transaction. It re-checks inside the
// transaction that the first entry follows the head and returns an error
// wrapping [ErrLogNotNext] otherwise, so two writers cannot interleave.
func (s *Store) AppendLog(ctx context.Context, entries []node.LogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append change log: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var seq int64
	hash := node.ZeroHash
	err = tx.QueryRowContext(ctx, `SELECT seq, hash FROM changelog ORDER BY seq DESC LIMIT 1`).Scan(&seq, &hash)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("append change log: %w", err)
	}
	if entries[0].Seq != seq+1 || entries[0].PrevHash != hash {
		return fmt.Errorf("%w: entry %d after stored head %d", ErrLogNotNext, entries[0].Seq, seq)
	}
	for _, e := range entries {
		body, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode change-log entry %d: %w", e.Seq, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO changelog (seq, hash, body) VALUES (?, ?, ?)`, e.Seq, e.Hash, body); err != nil {
			return fmt.Errorf("store change-log entry %d: %w", e.Seq, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append change log: %w", err)
	}
	return nil
}

// LogEntries returns up to limit stored entries from fromSeq, in order.
func (s *Store) LogEntries(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT body FROM changelog WHERE seq >= ? ORDER BY seq LIMIT ?`, fromSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("read change log: %w", err)
	}
	defer rows.Close()
	var out []node.LogEntry
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			return nil, fmt.Errorf("read change log: %w", err)
		}
		var e node.LogEntry
		if err := json.Unmarshal(body, &e); err != nil {
			return nil, fmt.Errorf("decode stored change-log entry: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read change log: %w", err)
	}
	return out, nil
}

// QuarantineLog moves the node's change-log copy aside after the core
// answered log_diverged (section 7.5): the table is renamed to
// changelog_diverged_<unix nanoseconds of now> and never deleted, and an empty
// copy takes its place so the node refollows from seq 1. It returns the name
// the old copy now has ("" when the copy was empty and nothing was kept).
func (s *Store) QuarantineLog(ctx context.Context, now time.Time) (string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("quarantine change log: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM changelog`).Scan(&n); err != nil {
		return "", fmt.Errorf("quarantine change log: %w", err)
	}
	if n == 0 {
		return "", nil
	}
	name := fmt.Sprintf("changelog_diverged_%d", now.UnixNano())
	if _, err := tx.ExecContext(ctx, `ALTER TABLE changelog RENAME TO `+name); err != nil {
		return "", fmt.Errorf("quarantine change log: %w", err)
	}
	if _, err := tx.ExecContext(ctx, changelogSchema); err != nil {
		return "", fmt.Errorf("quarantine change log: new copy: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("quarantine change log: %w", err)
	}
	return name, nil
}

// QuarantinedLogs returns the names of the copies moved aside, oldest first.
func (s *Store) QuarantinedLogs(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'changelog_diverged_%' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list quarantined change logs: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("list quarantined change logs: %w", err)
		}
		out = append(out, name)
	}
	return out, rows.Err()
}
