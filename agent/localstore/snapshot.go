package localstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// StoreSnapshot persists a verified desired-state body (raw, as received) under
// rev in one transaction, only when rev is greater than every stored one
// (docs/node-protocol.md section 6.1). It reports whether it stored the
// snapshot; false with a nil error means rev was not newer. When it returns
// true the snapshot is durable.
func (s *Store) StoreSnapshot(ctx context.Context, rev int64, raw []byte, now time.Time) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store snapshot rev %d: %w", rev, err)
	}
	defer func() { _ = tx.Rollback() }()
	var cur int64
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(rev), 0) FROM snapshots`).Scan(&cur); err != nil {
		return false, fmt.Errorf("store snapshot rev %d: %w", rev, err)
	}
	if rev <= cur {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots (rev, body, stored_at) VALUES (?,?,?)`,
		rev, raw, formatTime(now)); err != nil {
		return false, fmt.Errorf("store snapshot rev %d: %w", rev, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE rev NOT IN
		(SELECT rev FROM snapshots ORDER BY rev DESC LIMIT ?)`, snapshotsKept); err != nil {
		return false, fmt.Errorf("prune snapshots: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("store snapshot rev %d: %w", rev, err)
	}
	return true, nil
}

// LatestSnapshot returns the newest stored snapshot's rev and raw body, or
// (0, nil, nil) when none was stored yet. The body was verified before it was
// stored; callers parse it with json.Unmarshal.
func (s *Store) LatestSnapshot(ctx context.Context) (int64, []byte, error) {
	var rev int64
	var body []byte
	err := s.db.QueryRowContext(ctx, `SELECT rev, body FROM snapshots ORDER BY rev DESC LIMIT 1`).Scan(&rev, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read latest snapshot: %w", err)
	}
	return rev, body, nil
}

// StoredRev returns the newest stored snapshot's rev, 0 when none.
func (s *Store) StoredRev(ctx context.Context) (int64, error) {
	var rev int64
	if err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(rev), 0) FROM snapshots`).Scan(&rev); err != nil {
		return 0, fmt.Errorf("read stored rev: %w", err)
	}
	return rev, nil
}

// AppliedRev returns the rev of the last snapshot fully applied, 0 when none.
func (s *Store) AppliedRev(ctx context.Context) (int64, error) {
	var rev int64
	err := s.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'applied_rev'`).Scan(&rev)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read applied rev: %w", err)
	}
	return rev, nil
}

// SetAppliedRev records rev as applied. It never lowers the stored value.
func (s *Store) SetAppliedRev(ctx context.Context, rev int64) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('applied_rev', ?)
		ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)`, rev)
	if err != nil {
		return fmt.Errorf("set applied rev %d: %w", rev, err)
	}
	return nil
}
