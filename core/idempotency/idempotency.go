// Package idempotency owns the stored Idempotency-Key records of the API (docs/api.md section
// 1.7): one document per claimed key, read and written by _id only, every change conditional on
// the claim. The HTTP side (digests, sealing, replay) is core/api's.
package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per claimed key, looked up by _id only.
const Collection = "idempotency"

// Record states.
const (
	// Pending: claimed by a request that has not answered.
	Pending = "pending"
	// Done: holds the answer.
	Done = "done"
)

// ErrClaimed is returned (wrapped) by [Records.Insert] when a record with the id exists.
var ErrClaimed = errors.New("berth: idempotency key already claimed")

// Record is a document of collection "idempotency". Its _id is chosen by the caller (a digest
// that names the bearer, the route and the key), so a lookup is by _id alone.
type Record struct {
	ID string `bson:"_id"`
	// Claim is the random id of the request that claimed or took over the key; every later
	// write of the record is a compare-and-set on it.
	Claim string `bson:"claim"`
	State string `bson:"state"`
	// Request is the keyed digest of what the request asked; another digest under the same _id
	// is a reuse of the key.
	Request     string    `bson:"request"`
	Status      int       `bson:"status,omitempty"`
	ContentType string    `bson:"content_type,omitempty"`
	Sealed      []byte    `bson:"sealed,omitempty"`
	ClaimedAt   time.Time `bson:"claimed_at"`
	ExpiresAt   time.Time `bson:"expires_at"`
}

// Records is the idempotency collection of a store. Safe for concurrent use.
type Records struct{ st *store.Store }

// New returns the records of collection [Collection] of st.
func New(st *store.Store) *Records { return &Records{st: st} }

// Insert claims rec.ID with rec (one insert). Errors: wrapping [ErrClaimed] when the id exists.
func (r *Records) Insert(ctx context.Context, rec Record) error {
	err := r.st.Insert(ctx, Collection, rec)
	if store.IsDuplicateKey(err) {
		return fmt.Errorf("idempotency: claim %s: %w", rec.ID, ErrClaimed)
	}
	if err != nil {
		return fmt.Errorf("idempotency: claim %s: %w", rec.ID, err)
	}
	return nil
}

// Get returns record id. Errors: wrapping store.ErrNotFound.
func (r *Records) Get(ctx context.Context, id string) (*Record, error) {
	var rec Record
	if err := r.st.Get(ctx, Collection, id, &rec); err != nil {
		return nil, fmt.Errorf("idempotency: read %s: %w", id, err)
	}
	return &rec, nil
}

// TakeOver replaces record id with a fresh pending claim rec (answer fields cleared) when its
// claim is still old; it reports whether it did (one compare-and-set on the claim).
func (r *Records) TakeOver(ctx context.Context, id, old string, rec Record) (bool, error) {
	ok, err := r.st.SetIf(ctx, Collection, id, store.Fields{"claim": old},
		store.Fields{"claim": rec.Claim, "state": Pending, "request": rec.Request, "claimed_at": rec.ClaimedAt, "expires_at": rec.ExpiresAt},
		"status", "content_type", "sealed")
	if err != nil {
		return false, fmt.Errorf("idempotency: take over %s: %w", id, err)
	}
	return ok, nil
}

// Settle records the answer (status, content type, sealed body) on record id while claim holds
// it; it reports whether it did (one compare-and-set on the claim).
func (r *Records) Settle(ctx context.Context, id, claim string, status int, contentType string, sealed []byte) (bool, error) {
	ok, err := r.st.SetIf(ctx, Collection, id, store.Fields{"claim": claim},
		store.Fields{"state": Done, "status": status, "content_type": contentType, "sealed": sealed})
	if err != nil {
		return false, fmt.Errorf("idempotency: record the answer of %s: %w", id, err)
	}
	return ok, nil
}

// Release deletes record id while claim holds it; it reports whether it did.
func (r *Records) Release(ctx context.Context, id, claim string) (bool, error) {
	ok, err := r.st.DeleteWhen(ctx, Collection, id, store.Fields{"claim": claim})
	if err != nil {
		return false, fmt.Errorf("idempotency: release %s: %w", id, err)
	}
	return ok, nil
}

// Sweep deletes the records that expired by now and returns how many. It reads the whole
// collection on the embedded store, so it runs periodically, never per request. Safe to run
// from several processes.
func (r *Records) Sweep(ctx context.Context, now time.Time) (int64, error) {
	n, err := r.st.DeleteNotAfter(ctx, Collection, "expires_at", now)
	if err != nil {
		return 0, fmt.Errorf("idempotency: %w", err)
	}
	return n, nil
}
