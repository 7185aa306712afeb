// Package operations owns the durable operation queue: idempotent enqueue, fenced claims from one
// sequence per project, lease renewal, settlement, retry and reclamation (docs/runner-protocol.md section 5).
package operations

import (
	"errors"
	"time"

	"github.com/berthhq/berth/core/identity"
)

// State is an operation's queue state.
type State string

// Operation states (docs/runner-protocol.md section 5.1).
const (
	Queued    State = "queued"    // waiting for its first claim
	Leased    State = "leased"    // held by one node under a lease token and a fence
	Retry     State = "retry"     // failed or expired; claimable again from AvailableAt
	Succeeded State = "succeeded" // completed by its current lease holder; terminal
	Failed    State = "failed"    // attempts exhausted, refused as not retryable, or revoked; terminal
)

// Terminal reports whether s is succeeded or failed.
func (s State) Terminal() bool { return s == Succeeded || s == Failed }

// Errors of the decider and of [Queue].
var (
	// ErrLeaseLost is returned by Renew, Complete and Fail when the presented lease is not the
	// operation's current one: wrong node, token or fence, an expired lease, or an operation that
	// was settled or reclaimed since. Nothing changes. The API answers operation_lease_lost.
	ErrLeaseLost = errors.New("berth: operation lease lost")
	// ErrIdempotencyKeyReused is returned by [Queue.Enqueue] when the key was used in the project for
	// a request with another kind, payload or target.
	ErrIdempotencyKeyReused = errors.New("berth: idempotency key reused with another request")
	// ErrNotFound is returned for an unknown operation id.
	ErrNotFound = errors.New("berth: operation not found")
)

// Policy holds the timing and attempt rules the decider applies. The zero value is completed by
// [Policy.withDefaults].
type Policy struct {
	// LeaseTTL is how long a claim or renewal keeps an operation; zero means 30 s.
	LeaseTTL time.Duration
	// BaseDelay is the retry delay after the first failed attempt; zero means 1 s.
	BaseDelay time.Duration
	// MaxDelay bounds the retry delay; zero means 5 min.
	MaxDelay time.Duration
	// MaxAttempts is the default attempt limit of an operation enqueued without one; zero means 5.
	MaxAttempts int
}

func (p Policy) withDefaults() Policy {
	if p.LeaseTTL <= 0 {
		p.LeaseTTL = 30 * time.Second
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = time.Second
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 5 * time.Minute
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	return p
}

// Backoff is the retry delay after attempt number attempts (1-based) has failed:
// min(BaseDelay * 2^(attempts-1), MaxDelay).
func (p Policy) Backoff(attempts int) time.Duration {
	p = p.withDefaults()
	d := p.BaseDelay
	for i := 1; i < attempts && d < p.MaxDelay; i++ {
		d *= 2
	}
	return min(d, p.MaxDelay)
}

// Status is the part of an operation the decider reads and writes.
type Status struct {
	State          State
	Attempts       int // claims so far, reclaims included
	MaxAttempts    int
	AvailableAt    time.Time // queued and retry: not claimable before
	NodeID         string    // leased: the holder
	TokenDigest    string    // leased: SHA-256 of the lease token
	LeaseExpiresAt time.Time // leased: the holder must renew before
	Fence          int64     // the fence of the latest claim; 0 before the first
	LastError      string
}

// Holder is what a node presents to act on a leased operation.
type Holder struct {
	NodeID string
	Token  string // the lease token in clear; compared by digest
	Fence  int64
}

// Claimable reports whether s may be claimed at now: queued or retry and available, or leased with
// an expired lease (a reclaim).
func Claimable(s Status, now time.Time) bool {
	switch s.State {
	case Queued, Retry:
		return !now.Before(s.AvailableAt)
	case Leased:
		return !now.Before(s.LeaseExpiresAt)
	}
	return false
}

// Claim decides a claim of s by node at now with a fresh lease token digest and the next value of
// the project's fence sequence. An operation whose attempts are exhausted is failed instead (ok is
// false). The caller has checked [Claimable].
func Claim(p Policy, s Status, node, tokenDigest string, fence int64, now time.Time) (next Status, ok bool) {
	p = p.withDefaults()
	if s.Attempts >= s.MaxAttempts {
		s.State, s.NodeID, s.TokenDigest, s.LeaseExpiresAt = Failed, "", "", time.Time{}
		if s.LastError == "" {
			s.LastError = "attempts exhausted"
		}
		return s, false
	}
	s.State = Leased
	s.Attempts++
	s.NodeID, s.TokenDigest, s.Fence = node, tokenDigest, fence
	s.LeaseExpiresAt = now.Add(p.LeaseTTL)
	return s, true
}

// current reports whether h is the current, unexpired lease of s at now: the node, the token digest,
// the fence and the expiry all match.
func current(s Status, h Holder, now time.Time) bool {
	return s.State == Leased && s.NodeID == h.NodeID && s.Fence == h.Fence &&
		identity.VerifyToken(h.Token, s.TokenDigest) && now.Before(s.LeaseExpiresAt)
}

// Renew extends h's lease to now+LeaseTTL, or refuses with [ErrLeaseLost].
func Renew(p Policy, s Status, h Holder, now time.Time) (Status, error) {
	p = p.withDefaults()
	if !current(s, h, now) {
		return s, ErrLeaseLost
	}
	s.LeaseExpiresAt = now.Add(p.LeaseTTL)
	return s, nil
}

// Complete settles s as succeeded for h, or refuses with [ErrLeaseLost].
func Complete(s Status, h Holder, now time.Time) (Status, error) {
	if !current(s, h, now) {
		return s, ErrLeaseLost
	}
	s.State, s.TokenDigest, s.LeaseExpiresAt = Succeeded, "", time.Time{}
	return s, nil
}

// Fail settles a failed attempt of h: retry after [Policy.Backoff] while attempts remain and the
// failure is retryable, failed otherwise. It refuses with [ErrLeaseLost] like [Complete].
func Fail(p Policy, s Status, h Holder, now time.Time, msg string, retryable bool) (Status, error) {
	if !current(s, h, now) {
		return s, ErrLeaseLost
	}
	s.LastError = msg
	s.TokenDigest, s.LeaseExpiresAt = "", time.Time{}
	if !retryable || s.Attempts >= s.MaxAttempts {
		s.State = Failed
		return s, nil
	}
	s.State, s.AvailableAt = Retry, now.Add(p.Backoff(s.Attempts))
	return s, nil
}

// FailAfter is [Fail] with the retry delay chosen by the caller (work whose
// failures have their own backoff classes, such as bindings: docs/bindings.md
// section 9): retry at now+delay while attempts remain, failed otherwise.
func FailAfter(s Status, h Holder, now time.Time, msg string, delay time.Duration) (Status, error) {
	if !current(s, h, now) {
		return s, ErrLeaseLost
	}
	s.LastError = msg
	s.TokenDigest, s.LeaseExpiresAt = "", time.Time{}
	if s.Attempts >= s.MaxAttempts {
		s.State = Failed
		return s, nil
	}
	s.State, s.AvailableAt = Retry, now.Add(max(delay, 0))
	return s, nil
}

// Expire decides what a sweep does with s at now: a leased operation whose lease expired goes to
// retry (available at once: the crashed holder's attempt already counted) or, with its attempts
// exhausted, to failed. changed is false when s is not an expired lease.
func Expire(s Status, now time.Time) (next Status, changed bool) {
	if s.State != Leased || now.Before(s.LeaseExpiresAt) {
		return s, false
	}
	s.TokenDigest, s.LeaseExpiresAt, s.NodeID = "", time.Time{}, ""
	s.LastError = "lease expired"
	if s.Attempts >= s.MaxAttempts {
		s.State = Failed
		return s, true
	}
	s.State, s.AvailableAt = Retry, now
	return s, true
}

// Revoke decides the revocation of s (project deletion): a non-terminal operation becomes failed.
func Revoke(s Status) (next Status, changed bool) {
	if s.State.Terminal() {
		return s, false
	}
	s.State, s.TokenDigest, s.LeaseExpiresAt, s.LastError = Failed, "", time.Time{}, "revoked"
	return s, true
}
