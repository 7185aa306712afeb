package changelog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/berthhq/berth/abi/node"
)

// OutboxField is the field of a written document that holds its changes not
// yet in the log ([]Pending); written in the same single-document write as
// the change itself (docs/node-protocol.md section 7.2).
const OutboxField = "log_outbox"

// FrameOverheadBytes is what one log_entries frame spends besides its
// entries: the envelope (version, type, message id) and from_seq, with room
// to spare. An entry is at most node.MaxMessageBytes - FrameOverheadBytes.
const FrameOverheadBytes = 1024

// MaxEntryBytes is the largest entry, as encoded JSON, the log accepts: one
// such entry alone fills a log_entries frame to at most
// node.MaxMessageBytes (docs/node-protocol.md sections 3.2 and 7.8). A write
// whose entry would be larger is refused before it is stored
// ([ErrEntryTooLarge]), so what goes into the log is below the frame limit
// by construction, whatever the API's body cap.
const MaxEntryBytes = node.MaxMessageBytes - FrameOverheadBytes

// ErrEntryTooLarge is returned by [Prepare] (and so by every write that
// records its change) when the change's entry would exceed [MaxEntryBytes].
// The API answers it with code change_too_large (413).
var ErrEntryTooLarge = errors.New("berth: change is too large for one change-log entry")

// Actor is who made a change: the principal's kind and id, and the
// Idempotency-Key of the request that made it (empty when it had none).
type Actor struct {
	Type, ID       string
	IdempotencyKey string
}

type actorKey struct{}

// WithActor returns ctx carrying a; stores that record their writes in the
// change log (an outbox item in the same write) do so only for a ctx that
// carries an actor.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom returns the actor ctx carries and whether it carries one.
func ActorFrom(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(Actor)
	return a, ok
}

// Pending is one change waiting in a document's outbox (field
// [OutboxField]): everything its entry needs except seq, time and hashes.
// ID (chg_ followed by a ULID) is recorded beside the entry, so a change is
// appended once however often it is found pending.
type Pending struct {
	ID         string    `bson:"id"`
	ActorType  string    `bson:"actor_type"`
	ActorID    string    `bson:"actor_id"`
	EntityType string    `bson:"entity_type"`
	EntityID   string    `bson:"entity_id"`
	Op         string    `bson:"op"`
	Payload    string    `bson:"payload"` // JSON; "{}" for delete
	At         time.Time `bson:"at"`
	// IdempotencyKey is the Idempotency-Key of the request that made the
	// change; empty when it had none (and then absent from the entry).
	IdempotencyKey string `bson:"idempotency_key,omitempty"`
}

// Prepare encodes ch as a Pending change with a new id. Errors: a payload
// that does not encode; [ErrEntryTooLarge] when its entry would exceed
// [MaxEntryBytes].
func Prepare(ch Change) (Pending, error) {
	payload := "{}"
	if ch.Payload != nil && ch.Op != node.OpDelete {
		raw, err := json.Marshal(ch.Payload)
		if err != nil {
			return Pending{}, fmt.Errorf("changelog: encode payload of %s %s: %w", ch.EntityType, ch.EntityID, err)
		}
		payload = string(raw)
	}
	p := Pending{
		ID: "chg_" + ulid.Make().String(), ActorType: ch.ActorType, ActorID: ch.ActorID,
		EntityType: ch.EntityType, EntityID: ch.EntityID, Op: ch.Op, Payload: payload, At: time.Now().UTC().Truncate(time.Millisecond),
		IdempotencyKey: ch.IdempotencyKey,
	}
	n, err := p.entrySize()
	if err != nil {
		return Pending{}, err
	}
	if n > MaxEntryBytes {
		return Pending{}, fmt.Errorf("%w: the %s %s entry would be %d bytes, at most %d fit", ErrEntryTooLarge, ch.EntityType, ch.EntityID, n, MaxEntryBytes)
	}
	return p, nil
}

// entrySize is the largest the encoded entry of p can be: seq and term at
// their widest, a time with nanoseconds, full hashes.
func (p Pending) entrySize() (int, error) {
	e := p.entry(math.MaxInt64, math.MaxInt64, time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), strings.Repeat("f", 64))
	e.Hash = e.PrevHash
	raw, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("changelog: encode entry of %s %s: %w", p.EntityType, p.EntityID, err)
	}
	return len(raw), nil
}

// entry builds p's entry at seq after prev (no hash yet).
func (p Pending) entry(seq, term int64, at time.Time, prev string) node.LogEntry {
	return node.LogEntry{
		Seq: seq, Term: term, Time: at, ActorType: p.ActorType, ActorID: p.ActorID,
		EntityType: p.EntityType, EntityID: p.EntityID, Op: p.Op, Payload: json.RawMessage(p.Payload),
		IdempotencyKey: p.IdempotencyKey, PrevHash: prev,
	}
}

// EntrySize returns the encoded size of e, as it travels in log_entries.
func EntrySize(e node.LogEntry) (int, error) {
	raw, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("changelog: encode entry %d: %w", e.Seq, err)
	}
	return len(raw), nil
}
