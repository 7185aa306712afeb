package localstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Keys of node_meta for leases and self-fencing (docs/node-protocol.md sections 8.4, 8.5 and 12).
const (
	// MetaHostBootID is the kernel boot id (/proc/sys/kernel/random/boot_id)
	// of the host at the agent's last start.
	MetaHostBootID = "host_boot_id"
	// MetaFailed is set (RFC 3339 time) while the node is failed after a
	// fence it could not confirm; cleared when an operator acknowledged
	// every failed fence.
	MetaFailed = "failed"
)

const leaseSchema = `
CREATE TABLE IF NOT EXISTS leases (
	lease_id TEXT PRIMARY KEY,
	resource_type TEXT NOT NULL,
	resource_id TEXT NOT NULL,
	mode TEXT NOT NULL,
	token INTEGER NOT NULL,
	state TEXT NOT NULL,
	duration_ms INTEGER NOT NULL,
	valid_until_ns INTEGER,
	boot_id TEXT NOT NULL,
	fence TEXT NOT NULL,
	fence_reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (
	pos INTEGER PRIMARY KEY AUTOINCREMENT,
	lease_id TEXT NOT NULL,
	token INTEGER NOT NULL,
	reason TEXT NOT NULL,
	workloads TEXT NOT NULL,
	outcome TEXT NOT NULL,
	at TEXT NOT NULL,
	acked_at TEXT NOT NULL DEFAULT ''
);
`

// LeaseRow is one lease as the node persists it. ValidUntilNS is the end of
// the validity on CLOCK_BOOTTIME, in nanoseconds, and nil when the lease has
// none; BootID is the kernel boot id that clock belongs to.
type LeaseRow struct {
	LeaseID      string
	ResourceType string
	ResourceID   string
	Mode         string
	Token        int64
	State        string
	DurationMS   int64
	ValidUntilNS *int64
	BootID       string
	Fence        string // "", "fencing", "fenced" or "failed"
	FenceReason  string
}

// Fence outcomes of a fence record.
const (
	FenceOutcomeFenced = "fenced"
	FenceOutcomeFailed = "failed"
)

// FenceRecord is one finished self-fence (docs/node-protocol.md section
// 8.5): the lease, its token, the reason (expired or revoked), the bound
// workloads, when it ended and how. A failed one stays unacknowledged
// (AckedAt zero) until an operator's fence_ack.
type FenceRecord struct {
	LeaseID     string
	Token       int64
	Reason      string
	WorkloadIDs []string
	Outcome     string
	At          time.Time
	AckedAt     time.Time
}

// PutLease inserts or replaces the row of r.LeaseID.
func (s *Store) PutLease(ctx context.Context, r LeaseRow) error {
	var vu sql.NullInt64
	if r.ValidUntilNS != nil {
		vu = sql.NullInt64{Int64: *r.ValidUntilNS, Valid: true}
	}
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO leases (lease_id, resource_type, resource_id, mode,
		token, state, duration_ms, valid_until_ns, boot_id, fence, fence_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
		r.LeaseID, r.ResourceType, r.ResourceID, r.Mode, r.Token, r.State, r.DurationMS, vu, r.BootID, r.Fence, r.FenceReason)
	if err != nil {
		return fmt.Errorf("put lease %s: %w", r.LeaseID, err)
	}
	return nil
}

// Leases returns every lease row, ordered by lease id.
func (s *Store) Leases(ctx context.Context) ([]LeaseRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT lease_id, resource_type, resource_id, mode, token, state,
		duration_ms, valid_until_ns, boot_id, fence, fence_reason FROM leases ORDER BY lease_id`)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []LeaseRow
	for rows.Next() {
		var r LeaseRow
		var vu sql.NullInt64
		if err := rows.Scan(&r.LeaseID, &r.ResourceType, &r.ResourceID, &r.Mode, &r.Token, &r.State,
			&r.DurationMS, &vu, &r.BootID, &r.Fence, &r.FenceReason); err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		if vu.Valid {
			v := vu.Int64
			r.ValidUntilNS = &v
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}

// RecordFence appends a finished fence. A failed one also sets the node's
// failed mark ([MetaFailed]) in the same transaction, so the mark survives
// a restart whatever happens next.
func (s *Store) RecordFence(ctx context.Context, f FenceRecord) error {
	wl, err := json.Marshal(f.WorkloadIDs)
	if err != nil {
		return fmt.Errorf("record fence of %s: %w", f.LeaseID, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record fence of %s: %w", f.LeaseID, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO fences (lease_id, token, reason, workloads, outcome, at)
		VALUES (?,?,?,?,?,?)`, f.LeaseID, f.Token, f.Reason, string(wl), f.Outcome, formatTime(f.At)); err != nil {
		return fmt.Errorf("record fence of %s: %w", f.LeaseID, err)
	}
	if f.Outcome == FenceOutcomeFailed {
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_meta (key, value) VALUES (?, ?)
			ON CONFLICT(key) DO UPDATE SET value = excluded.value`, MetaFailed, formatTime(f.At)); err != nil {
			return fmt.Errorf("mark the node failed: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record fence of %s: %w", f.LeaseID, err)
	}
	return nil
}

// Fences returns the fence records, oldest first; with failedOnly, only the
// failed ones not yet acknowledged.
func (s *Store) Fences(ctx context.Context, failedOnly bool) ([]FenceRecord, error) {
	q := `SELECT lease_id, token, reason, workloads, outcome, at, acked_at FROM fences`
	if failedOnly {
		q += ` WHERE outcome = 'failed' AND acked_at = ''`
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY pos`)
	if err != nil {
		return nil, fmt.Errorf("list fences: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []FenceRecord
	for rows.Next() {
		var f FenceRecord
		var wl, at, acked string
		if err := rows.Scan(&f.LeaseID, &f.Token, &f.Reason, &wl, &f.Outcome, &at, &acked); err != nil {
			return nil, fmt.Errorf("list fences: %w", err)
		}
		if err := json.Unmarshal([]byte(wl), &f.WorkloadIDs); err != nil {
			return nil, fmt.Errorf("list fences: workloads of %s: %w", f.LeaseID, err)
		}
		f.At, f.AckedAt = parseTime(at), parseTime(acked)
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list fences: %w", err)
	}
	return out, nil
}

// AckFences marks the failed fences of leaseIDs acknowledged at at and, in
// the same transaction, clears the node's failed mark when no
// unacknowledged failed fence remains. It returns the lease ids of the
// failed fences that remain. Ids without a failed fence are ignored.
func (s *Store) AckFences(ctx context.Context, leaseIDs []string, at time.Time) ([]string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("acknowledge fences: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, id := range leaseIDs {
		if _, err := tx.ExecContext(ctx, `UPDATE fences SET acked_at = ? WHERE lease_id = ? AND outcome = 'failed' AND acked_at = ''`,
			formatTime(at), id); err != nil {
			return nil, fmt.Errorf("acknowledge fence of %s: %w", id, err)
		}
	}
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT lease_id FROM fences WHERE outcome = 'failed' AND acked_at = '' ORDER BY lease_id`)
	if err != nil {
		return nil, fmt.Errorf("acknowledge fences: %w", err)
	}
	var remaining []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("acknowledge fences: %w", err)
		}
		remaining = append(remaining, id)
	}
	_ = rows.Close()
	if len(remaining) == 0 {
		if _, err := tx.ExecContext(ctx, `DELETE FROM node_meta WHERE key = ?`, MetaFailed); err != nil {
			return nil, fmt.Errorf("clear the failed mark: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("acknowledge fences: %w", err)
	}
	return remaining, nil
}

// migrateLeases adds the lease tables and the workloads' lease_id column to
// stores made by an older agent.
func migrateLeases(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, leaseSchema); err != nil {
		return fmt.Errorf("create lease tables: %w", err)
	}
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info('workloads')`)
	if err != nil {
		return fmt.Errorf("migrate store: %w", err)
	}
	has := false
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			_ = rows.Close()
			return fmt.Errorf("migrate store: %w", err)
		}
		has = has || name == "lease_id"
	}
	_ = rows.Close()
	if has {
		return nil
	}
	if _, err := db.ExecContext(ctx, `ALTER TABLE workloads ADD COLUMN lease_id TEXT NOT NULL DEFAULT ''`); err != nil {
		return fmt.Errorf("migrate store: add lease_id: %w", err)
	}
	return nil
}
