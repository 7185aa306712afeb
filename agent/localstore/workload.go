package localstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Workload is the agent's record of one workload it manages: what it started,
// on which port, and its crash backoff. The reconcile loop owns these records.
type Workload struct {
	WorkloadID        string
	Driver            string
	Phase             string // reconcile phase, e.g. "running", "crashed"; see package reconcile
	Port              int    // TCP port on the node address; 0 when none was allocated
	SpecHash          string // hash of the spec fields whose change needs a restart
	RestartGeneration int64  // restart_generation the workload was last started with
	RestartCount      int    // restarts after crashes, never reset
	LastExitCode      *int   // nil when unknown
	BackoffStep       int    // consecutive failures since the last reset; 0 means no backoff
	NextStartAt       time.Time
	StartedAt         time.Time
	Message           string // last error, reported in status
	// DriverHandle is the runtime driver's opaque handle of the workload,
	// as returned by Start, persisted so a restarted agent can Recover the
	// workload (docs/plugins.md section 3.3). The agent never parses it.
	DriverHandle DriverHandle
	// LeaseID is the lease a stateful workload was started under; empty for
	// a workload that is not stateful. The self-fence of that lease stops it
	// (docs/node-protocol.md section 8.5).
	LeaseID string
	// StartAttempt counts the driver starts the agent began for this
	// workload; the start's idempotency key is derived from it, and a start
	// interrupted before its result was recorded (phase starting) is retried
	// with the same attempt, so the driver replays it (docs/plugins.md
	// section 3.4). Zero before the first start.
	StartAttempt int64
	// FenceToken is the fencing token the current attempt's start was sent
	// with: the lease's token for a stateful workload, StartRev otherwise. A
	// retried attempt sends it again.
	FenceToken int64
	// StartRev is the desired-state revision the current attempt began at:
	// the token of the workload's own fence (its stops, its network calls,
	// and its start when it has no lease).
	StartRev int64
	// LastFailure is the workload's most recent failure (exit, signal,
	// start, image), reported in status (docs/node-protocol.md section
	// 5.3.1); nil when it has not failed. Probe failures are not recorded
	// here: the prober keeps them while they last.
	LastFailure *node.Failure
	// EndedAt is when a job run's workload ended for good (succeeded, failed or timed out:
	// docs/jobs.md section 7); zero for a service's workload and while the run goes on.
	EndedAt time.Time
}

// DriverHandle is a runtime driver's handle as the agent stores it: a
// version and bytes it never parses. The zero value means none.
type DriverHandle struct {
	Version int    `json:"version"`
	Data    []byte `json:"data"`
}

// migrate adds what stores made by an older agent lack.
func migrate(ctx context.Context, db *sql.DB) error {
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
		has = has || name == "driver_handle"
	}
	_ = rows.Close()
	if has {
		return nil
	}
	if _, err := db.ExecContext(ctx, `ALTER TABLE workloads ADD COLUMN driver_handle TEXT NOT NULL DEFAULT ''`); err != nil {
		return fmt.Errorf("migrate store: add driver_handle: %w", err)
	}
	return nil
}

// migrateAttempts adds the start attempt, fence token and start revision columns that
// stores made by an older agent lack.
func migrateAttempts(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info('workloads')`)
	if err != nil {
		return fmt.Errorf("migrate store: %w", err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			_ = rows.Close()
			return fmt.Errorf("migrate store: %w", err)
		}
		have[name] = true
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrate store: %w", err)
	}
	for _, col := range []string{"start_attempt", "fence_token", "start_rev"} {
		if have[col] {
			continue
		}
		if _, err := db.ExecContext(ctx, `ALTER TABLE workloads ADD COLUMN `+col+` INTEGER NOT NULL DEFAULT 0`); err != nil {
			return fmt.Errorf("migrate store: add %s: %w", col, err)
		}
	}
	for _, col := range []string{"last_failure", "ended_at"} {
		if have[col] {
			continue
		}
		if _, err := db.ExecContext(ctx, `ALTER TABLE workloads ADD COLUMN `+col+` TEXT NOT NULL DEFAULT ''`); err != nil {
			return fmt.Errorf("migrate store: add %s: %w", col, err)
		}
	}
	return nil
}

func encodeFailure(f *node.Failure) string {
	if f == nil {
		return ""
	}
	raw, _ := json.Marshal(f) // plain struct: cannot fail
	return string(raw)
}

func decodeFailure(s string) *node.Failure {
	if s == "" {
		return nil
	}
	var f node.Failure
	if json.Unmarshal([]byte(s), &f) != nil {
		return nil // a corrupt failure reads as none: the next one replaces it
	}
	return &f
}

func encodeHandle(h DriverHandle) string {
	if h.Version == 0 && len(h.Data) == 0 {
		return ""
	}
	raw, _ := json.Marshal(h) // plain struct: cannot fail
	return string(raw)
}

func decodeHandle(s string) DriverHandle {
	var h DriverHandle
	if s != "" {
		_ = json.Unmarshal([]byte(s), &h) // a corrupt handle reads as none: the workload is then found by List
	}
	return h
}

// PutWorkload inserts or replaces the record of w.WorkloadID.
func (s *Store) PutWorkload(ctx context.Context, w Workload) error {
	var exit sql.NullInt64
	if w.LastExitCode != nil {
		exit = sql.NullInt64{Int64: int64(*w.LastExitCode), Valid: true}
	}
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO workloads (workload_id, driver, phase, port,
		spec_hash, restart_generation, restart_count, last_exit_code, backoff_step, next_start_at,
		started_at, message, driver_handle, lease_id, start_attempt, fence_token, start_rev, last_failure, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		w.WorkloadID, w.Driver, w.Phase, w.Port, w.SpecHash, w.RestartGeneration, w.RestartCount, exit,
		w.BackoffStep, formatTime(w.NextStartAt), formatTime(w.StartedAt), w.Message, encodeHandle(w.DriverHandle), w.LeaseID,
		w.StartAttempt, w.FenceToken, w.StartRev, encodeFailure(w.LastFailure), formatTime(w.EndedAt))
	if err != nil {
		return fmt.Errorf("put workload %s: %w", w.WorkloadID, err)
	}
	return nil
}

// DeleteWorkload removes the record of id; a missing record is not an error.
func (s *Store) DeleteWorkload(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM workloads WHERE workload_id = ?`, id); err != nil {
		return fmt.Errorf("delete workload %s: %w", id, err)
	}
	return nil
}

// Workloads returns every workload record, ordered by id.
func (s *Store) Workloads(ctx context.Context) ([]Workload, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT workload_id, driver, phase, port, spec_hash,
		restart_generation, restart_count, last_exit_code, backoff_step, next_start_at, started_at, message, driver_handle, lease_id,
		start_attempt, fence_token, start_rev, last_failure, ended_at FROM workloads ORDER BY workload_id`)
	if err != nil {
		return nil, fmt.Errorf("list workloads: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Workload
	for rows.Next() {
		var w Workload
		var exit sql.NullInt64
		var next, started, handle, failure, ended string
		if err := rows.Scan(&w.WorkloadID, &w.Driver, &w.Phase, &w.Port, &w.SpecHash, &w.RestartGeneration,
			&w.RestartCount, &exit, &w.BackoffStep, &next, &started, &w.Message, &handle, &w.LeaseID,
			&w.StartAttempt, &w.FenceToken, &w.StartRev, &failure, &ended); err != nil {
			return nil, fmt.Errorf("list workloads: %w", err)
		}
		if exit.Valid {
			c := int(exit.Int64)
			w.LastExitCode = &c
		}
		w.NextStartAt = parseTime(next)
		w.StartedAt = parseTime(started)
		w.DriverHandle = decodeHandle(handle)
		w.LastFailure = decodeFailure(failure)
		w.EndedAt = parseTime(ended)
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list workloads: %w", err)
	}
	return out, nil
}
