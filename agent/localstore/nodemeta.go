package localstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Keys of node_meta, the node's small named facts (docs/node-protocol.md section 12).
const (
	// MetaServerFingerprint is the pinned SHA-256 fingerprint of berthd's TLS
	// certificate from the join command, "sha256:<64 hex>"; absent when the
	// node trusts the system CAs instead (section 2.2).
	MetaServerFingerprint = "server_fingerprint"
)

// Meta returns the value stored under key in node_meta and whether one is.
func (s *Store) Meta(ctx context.Context, key string) (string, bool, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM node_meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read node_meta %s: %w", key, err)
	}
	return v, true, nil
}

// SetMeta stores value under key in node_meta, replacing any previous value.
func (s *Store) SetMeta(ctx context.Context, key, value string) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO node_meta (key, value) VALUES (?, ?)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, key, value); err != nil {
		return fmt.Errorf("write node_meta %s: %w", key, err)
	}
	return nil
}
