// Package fencing owns the core's lease authority for stateful services and the storage-side token
// guard: who may run each stateful service, under which fencing token (docs/node-protocol.md section 8).
package fencing

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Errors of the lease decider and of [Authority]. Each names the refusal; callers test them with
// errors.Is.
var (
	// ErrHeld is returned by [Grant] when another node holds the lease and the gate has not opened:
	// a local lease never opens it by itself, an expiring one opens it at T_grant + D + 2M.
	ErrHeld = errors.New("berth: lease is held by another node")
	// ErrGate is returned by [Grant] when the lease is free but its gate has not opened yet.
	ErrGate = errors.New("berth: lease gate has not opened yet")
	// ErrBlocked is returned by [Grant] and [Renew] while a failed fence of the lease is
	// outstanding: the lease is granted to nobody until an operator acknowledges it.
	ErrBlocked = errors.New("berth: lease is blocked by an unacknowledged failed fence")
	// ErrStale is returned by [Renew] and [Release] when the caller does not hold the lease under
	// the token it presented; the session answers with lease_revoke.
	ErrStale = errors.New("berth: lease token is stale")
	// ErrDeleted is returned by [Grant] and [Renew] for the lease of a deleted resource.
	ErrDeleted = errors.New("berth: lease resource was deleted")
	// ErrDurationTooShort is returned by [Grant] for an expiring lease below node.MinLeaseDuration.
	ErrDurationTooShort = errors.New("berth: lease duration below the 3000 ms floor")
)

// State is one lease document as the decider sees it (docs/node-protocol.md section 8). The zero
// value (with a LeaseID) is a lease that was never granted.
type State struct {
	LeaseID string
	// Holder is the node id holding the lease, or "" when nobody does.
	Holder string
	// Token is the fencing token: it increases by one on every change of holder (a grant to
	// another node, a grant after a release, loss, acknowledgement or deletion) and never on a
	// renewal. 0 means never granted.
	Token int64
	// Mode and Duration are the holding's mode and, for expiring leases, its duration D.
	Mode     node.LeaseMode
	Duration time.Duration
	// GrantedAt is T_grant: the core's time when it decided the last grant or renewal answer to
	// Holder. It is recorded before the message is sent, so it is never earlier than the send
	// time of the renewal it answers.
	GrantedAt time.Time
	// GateAt is, when Holder is "", the earliest time the lease may be granted to anyone;
	// the zero time means at once.
	GateAt time.Time
	// FenceFailed lists the nodes whose fence of this lease failed and is not yet acknowledged;
	// while it is not empty the lease is granted to nobody.
	FenceFailed []string
	// Deleted reports whether the leased resource is gone; a deleted lease is never granted.
	Deleted bool
}

// Gate returns the earliest time at which s may be granted to a node other than its holder:
// GateAt for a free lease; T_grant + D + 2M for an expiring lease held by someone (M =
// node.LeaseMargin(D)); and ok=false for a held local lease, which never opens by time.
func (s State) Gate() (at time.Time, ok bool) {
	if s.Holder == "" {
		return s.GateAt, true
	}
	if s.Mode != node.LeaseExpiring {
		return time.Time{}, false
	}
	return s.GrantedAt.Add(s.Duration + 2*node.LeaseMargin(s.Duration)), true
}

// Blocked reports whether a failed fence of s is outstanding.
func (s State) Blocked() bool { return len(s.FenceFailed) > 0 }

// Grant decides granting s to nodeID at now with mode and duration d (ignored for local leases):
//
//   - a deleted lease refuses with [ErrDeleted]; a blocked one with [ErrBlocked];
//   - a lease nodeID already holds is returned unchanged (the same token; a grant message is
//     simply sent again);
//   - a lease held by another node refuses with [ErrHeld] until its gate opens ([State.Gate]);
//     past the gate it moves to nodeID;
//   - a free lease refuses with [ErrGate] before GateAt, and is granted otherwise.
//
// Every change of holder increments the token. moved is the previous holder when the lease was
// taken from a node that still held it (the core revokes it with reason moved).
func Grant(s State, nodeID string, mode node.LeaseMode, d time.Duration, now time.Time) (next State, moved string, err error) {
	switch {
	case s.Deleted:
		return s, "", ErrDeleted
	case s.Blocked():
		return s, "", ErrBlocked
	case mode != node.LeaseLocal && mode != node.LeaseExpiring:
		return s, "", fmt.Errorf("berth: unknown lease mode %q", mode)
	case mode == node.LeaseExpiring && d < node.MinLeaseDuration:
		return s, "", ErrDurationTooShort
	case s.Holder == nodeID:
		return s, "", nil
	}
	gate, open := s.Gate()
	if s.Holder != "" && (!open || now.Before(gate)) {
		return s, "", fmt.Errorf("%w (holder %s, gate %s)", ErrHeld, s.Holder, gateText(gate, open))
	}
	if s.Holder == "" && now.Before(gate) {
		return s, "", fmt.Errorf("%w (opens at %s)", ErrGate, gate.UTC().Format(time.RFC3339Nano))
	}
	if mode == node.LeaseLocal {
		d = 0
	}
	next = s
	next.Holder, next.Token, next.Mode, next.Duration, next.GrantedAt, next.GateAt = nodeID, s.Token+1, mode, d, now, time.Time{}
	return next, s.Holder, nil
}

func gateText(at time.Time, open bool) string {
	if !open {
		return "never by time: local lease"
	}
	return at.UTC().Format(time.RFC3339Nano)
}

// Renew decides a renewal (lease_renew, or a grant sent again) by nodeID under token at now: while
// nodeID holds s under token and s is neither blocked nor deleted, GrantedAt moves to now and the
// token stays. Otherwise it refuses with [ErrStale], [ErrBlocked] or [ErrDeleted] and changes
// nothing; the session then answers lease_revoke.
func Renew(s State, nodeID string, token int64, now time.Time) (State, error) {
	switch {
	case s.Deleted:
		return s, ErrDeleted
	case s.Holder != nodeID || s.Token != token:
		return s, ErrStale
	case s.Blocked():
		return s, ErrBlocked
	}
	s.GrantedAt = now
	return s, nil
}

// Release decides that nodeID confirmed it fenced s under token (a lease_revoke answered ok, or a
// node.fenced event): the lease becomes free with its gate open at now, keeping the token (the next
// grant increments it). A release by a node that is not the holder under token refuses with
// [ErrStale] and changes nothing.
func Release(s State, nodeID string, token int64, now time.Time) (State, error) {
	if s.Holder != nodeID || s.Token != token {
		return s, ErrStale
	}
	s.Holder, s.GateAt = "", now
	return s, nil
}

// Lost decides an operator's declaration that nodeID is lost: when nodeID holds s, the token is
// incremented and the lease is free at once (the operator vouches that the node runs nothing).
// A failed fence stays outstanding. changed is false when nodeID did not hold s.
func Lost(s State, nodeID string, now time.Time) (next State, changed bool) {
	if s.Holder != nodeID || nodeID == "" {
		return s, false
	}
	s.Holder, s.Token, s.GateAt = "", s.Token+1, now
	return s, true
}

// FenceFailed decides that nodeID reported a failed fence of s: nodeID is added to s.FenceFailed
// (once), which blocks every grant and renewal until [Ack]. changed is false when it was listed.
func FenceFailed(s State, nodeID string) (next State, changed bool) {
	if slices.Contains(s.FenceFailed, nodeID) {
		return s, false
	}
	s.FenceFailed = append(slices.Clone(s.FenceFailed), nodeID)
	return s, true
}

// Ack decides an operator's acknowledgement of nodeID's failed fence of s: nodeID leaves
// s.FenceFailed, the token is incremented and the lease is free with its gate open at now (a
// holder, whoever it was, is superseded). changed is false when nodeID's failure was not listed,
// so a repeated acknowledgement changes nothing.
func Ack(s State, nodeID string, now time.Time) (next State, changed bool) {
	i := slices.Index(s.FenceFailed, nodeID)
	if i < 0 {
		return s, false
	}
	s.FenceFailed = slices.Delete(slices.Clone(s.FenceFailed), i, i+1)
	s.Holder, s.Token, s.GateAt = "", s.Token+1, now
	return s, true
}

// Delete decides the deletion of the leased resource: the lease is freed for good and its token
// incremented, so a former holder's writes are refused by token. Idempotent.
func Delete(s State) State {
	if s.Deleted {
		return s
	}
	s.Holder, s.Token, s.Deleted = "", s.Token+1, true
	return s
}
