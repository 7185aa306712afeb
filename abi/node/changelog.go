package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gowebpki/jcs"
)

// Change-log message types (docs/node-protocol.md section 7).
const (
	TypeLogEntries Type = "log_entries" // core to node
	TypeLogAck     Type = "log_ack"     // node to core
)

// MaxLogBatch is the most entries one log_entries message carries (section 7).
const MaxLogBatch = 500

// ZeroHash is the prev_hash of entry 1: 64 zeros.
var ZeroHash = strings.Repeat("0", 64)

// Change-log ops.
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// LogEntry is one change of cluster state (section 7). Seq is gap-free from
// 1; Payload is the full new document for create and update and {} for
// delete (secrets in it are ciphertext only); PrevHash is the previous
// entry's Hash (ZeroHash for seq 1); Hash is the lowercase hex SHA-256 of the
// RFC 8785 form of the entry without its hash member ([LogEntry.ComputeHash]).
type LogEntry struct {
	Seq        int64           `json:"seq"`
	Term       int64           `json:"term"`
	Time       time.Time       `json:"time"`
	ActorType  string          `json:"actor_type"`
	ActorID    string          `json:"actor_id"`
	EntityType string          `json:"entity_type"`
	EntityID   string          `json:"entity_id"`
	Op         string          `json:"op"`
	Payload    json.RawMessage `json:"payload"`
	// IdempotencyKey is the Idempotency-Key of the API request that made the change, when it
	// carried one; absent otherwise, so entries without one hash as before (section 7).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	PrevHash       string `json:"prev_hash"`
	Hash           string `json:"hash,omitempty"`
}

// LogEntries carries up to [MaxLogBatch] consecutive entries from FromSeq.
type LogEntries struct {
	FromSeq int64      `json:"from_seq"`
	Entries []LogEntry `json:"entries"`
}

// LogAck acknowledges that the node verified and stored every entry up to
// Seq, whose hash is Hash (section 5.6).
type LogAck struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

// ErrLogChain is returned by [VerifyChain] when an entry's hash, link or
// sequence is wrong.
var ErrLogChain = errors.New("berth: change-log chain does not verify")

// ComputeHash returns the hash of e: hex SHA-256 over the RFC 8785 form of e
// without its hash member. Time is serialised as RFC 3339 with nanoseconds in
// UTC, so callers should store times in UTC.
func (e LogEntry) ComputeHash() (string, error) {
	c := e
	c.Hash = ""
	if len(c.Payload) == 0 {
		c.Payload = json.RawMessage("{}")
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode log entry %d: %w", e.Seq, err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("canonical form of log entry %d: %w", e.Seq, err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// VerifyChain checks entries in order against the follower's head
// (prevSeq, prevHash; 0 and "" or ZeroHash for an empty copy): each seq is the
// previous plus one, each prev_hash the previous hash, each hash recomputes.
// It returns how many leading entries verified and, when not all did, an
// error wrapping [ErrLogChain] naming the first bad one.
func VerifyChain(prevSeq int64, prevHash string, entries []LogEntry) (int, error) {
	if prevHash == "" {
		prevHash = ZeroHash
	}
	for i, e := range entries {
		if e.Seq != prevSeq+1 {
			return i, fmt.Errorf("%w: entry seq %d follows %d", ErrLogChain, e.Seq, prevSeq)
		}
		if e.PrevHash != prevHash {
			return i, fmt.Errorf("%w: entry %d prev_hash %q, previous hash %q", ErrLogChain, e.Seq, e.PrevHash, prevHash)
		}
		h, err := e.ComputeHash()
		if err != nil {
			return i, fmt.Errorf("%w: %w", ErrLogChain, err)
		}
		if h != e.Hash {
			return i, fmt.Errorf("%w: entry %d hash %q, computed %q", ErrLogChain, e.Seq, e.Hash, h)
		}
		prevSeq, prevHash = e.Seq, e.Hash
	}
	return len(entries), nil
}
