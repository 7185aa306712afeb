package localstore

import (
	"context"
	"fmt"
	"strconv"
)

// MetaDroppedEvents counts events dropped from the full buffer and not yet
// reported in a hello (docs/node-protocol.md section 6.5).
const MetaDroppedEvents = "dropped_events"

// BufferedEvent is one event waiting to be sent: its position in the buffer,
// its evt_ id, and its JSON body.
type BufferedEvent struct {
	Pos  int64
	ID   string
	Body []byte
}

// BufferEvent appends an event to the buffer, bounded at max entries: on
// overflow the oldest are deleted and added to the dropped count
// (section 6.5). An id already buffered is ignored. max <= 0 means no bound.
func (s *Store) BufferEvent(ctx context.Context, id string, body []byte, max int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("buffer event: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO events (id, body) VALUES (?, ?)`, id, body); err != nil {
		return fmt.Errorf("buffer event %s: %w", id, err)
	}
	if max > 0 {
		var n int64
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
			return fmt.Errorf("buffer event: %w", err)
		}
		if over := n - int64(max); over > 0 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE pos IN (SELECT pos FROM events ORDER BY pos LIMIT ?)`, over); err != nil {
				return fmt.Errorf("drop oldest events: %w", err)
			}
			var cur string
			_ = tx.QueryRowContext(ctx, `SELECT value FROM node_meta WHERE key = ?`, MetaDroppedEvents).Scan(&cur)
			prev, _ := strconv.ParseInt(cur, 10, 64)
			if _, err := tx.ExecContext(ctx, `INSERT INTO node_meta (key, value) VALUES (?, ?)
				ON CONFLICT(key) DO UPDATE SET value = excluded.value`, MetaDroppedEvents, strconv.FormatInt(prev+over, 10)); err != nil {
				return fmt.Errorf("count dropped events: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("buffer event: %w", err)
	}
	return nil
}

// PendingEvents returns up to limit buffered events, oldest first.
func (s *Store) PendingEvents(ctx context.Context, limit int) ([]BufferedEvent, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT pos, id, body FROM events ORDER BY pos LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("read buffered events: %w", err)
	}
	defer rows.Close()
	var out []BufferedEvent
	for rows.Next() {
		var e BufferedEvent
		if err := rows.Scan(&e.Pos, &e.ID, &e.Body); err != nil {
			return nil, fmt.Errorf("read buffered events: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// DeleteEvent removes a sent event from the buffer; a missing one is not an error.
func (s *Store) DeleteEvent(ctx context.Context, pos int64) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE pos = ?`, pos); err != nil {
		return fmt.Errorf("delete sent event: %w", err)
	}
	return nil
}

// DroppedEvents returns the number of events dropped and not yet reported.
func (s *Store) DroppedEvents(ctx context.Context) (int64, error) {
	v, _, err := s.Meta(ctx, MetaDroppedEvents)
	if err != nil {
		return 0, err
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n, nil
}

// ReportedDroppedEvents subtracts n, the count a welcomed hello carried,
// from the dropped count; drops since that hello stay counted.
func (s *Store) ReportedDroppedEvents(ctx context.Context, n int64) error {
	if n <= 0 {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE node_meta SET value = CAST(MAX(CAST(value AS INTEGER) - ?, 0) AS TEXT) WHERE key = ?`,
		n, MetaDroppedEvents); err != nil {
		return fmt.Errorf("reset dropped events: %w", err)
	}
	return nil
}
