package localstore

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
)

// Keys of node_meta, the node's small named facts (docs/node-protocol.md section 12).
const (
	// MetaServerFingerprint is the pinned SHA-256 fingerprint of berthd's TLS
	// certificate from the join command, "sha256:<64 hex>"; absent when the
	// node trusts the system CAs instead (section 2.2).
	MetaServerFingerprint = "server_fingerprint"
	// MetaRemovedAt is set (RFC 3339) when the core ended a session with
	// node_removed: the agent never dials again from this data directory
	// (section 10).
	MetaRemovedAt = "removed_at"
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

// MetaSigningKeyID is the key_id of the pinned cluster signing key after a
// rotation (docs/node-protocol.md section 5.21).
const MetaSigningKeyID = "signing_key_id"

// SetClusterKey replaces the pinned cluster signing key after a verified
// signing_key_rotate (section 5.21), in one transaction with its key id in
// node_meta, so a restarted agent verifies with the new key. ErrNotEnrolled
// when no identity is stored.
func (s *Store) SetClusterKey(ctx context.Context, pub ed25519.PublicKey) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pin signing key: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `UPDATE identity SET cluster_public_key = ? WHERE id = 1`, base64.StdEncoding.EncodeToString(pub))
	if err != nil {
		return fmt.Errorf("pin signing key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotEnrolled
	}
	sum := sha256.Sum256(pub)
	if _, err := tx.ExecContext(ctx, `INSERT INTO node_meta (key, value) VALUES (?, ?)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, MetaSigningKeyID, hex.EncodeToString(sum[:])); err != nil {
		return fmt.Errorf("pin signing key: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pin signing key: %w", err)
	}
	return nil
}
