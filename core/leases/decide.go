// Package leases owns project leases: the durable, expiring right of one control-plane worker to run
// destructive operations on a project (docs/runner-protocol.md section 2), decided by a pure machine.
package leases

import (
	"errors"
	"time"
)

// Errors of the lease decider and of [Manager].
var (
	// ErrBusy is returned by [Acquire] and [Manager.Acquire] when another owner holds an unexpired
	// lease on the key. The API answers it as PROJECT_BUSY.
	ErrBusy = errors.New("berth: project is busy: another worker holds its lease")
	// ErrLost is returned by [Renew], [Release], [Manager.Renew] and [Manager.Hold] when the lease
	// presented is no longer the current one (it expired, or another owner took it since). The API
	// answers it as PROJECT_LEASE_LOST; it is never converted into success.
	ErrLost = errors.New("berth: project lease lost")
)

// State is a lease record as the decider sees it. The zero value is "no lease was ever taken".
type State struct {
	// Owner identifies the holder (a berthd worker id); empty after a release.
	Owner string
	// Epoch increases by one on every acquisition; it tells two holdings by one owner apart.
	Epoch int64
	// ExpiresAt is when the holding ends unless renewed; a lease is held while now < ExpiresAt.
	ExpiresAt time.Time
}

// Held reports whether s is held by someone at now.
func (s State) Held(now time.Time) bool { return s.Owner != "" && now.Before(s.ExpiresAt) }

// Acquire decides an acquisition by owner at now for ttl: a lease that is free, expired or held
// by owner itself is taken with the next epoch; a lease held by another owner refuses with
// [ErrBusy]. ttl must be positive.
func Acquire(cur State, owner string, now time.Time, ttl time.Duration) (State, error) {
	if cur.Held(now) && cur.Owner != owner {
		return cur, ErrBusy
	}
	return State{Owner: owner, Epoch: cur.Epoch + 1, ExpiresAt: now.Add(ttl)}, nil
}

// Renew decides the renewal of the holding (owner, epoch) at now: it extends the expiry to now+ttl
// while that holding is current and unexpired, and refuses with [ErrLost] otherwise. An expired
// lease is lost even if nobody took it: its holder may already have been presumed dead.
func Renew(cur State, owner string, epoch int64, now time.Time, ttl time.Duration) (State, error) {
	if cur.Owner != owner || cur.Epoch != epoch || !now.Before(cur.ExpiresAt) {
		return cur, ErrLost
	}
	return State{Owner: owner, Epoch: epoch, ExpiresAt: now.Add(ttl)}, nil
}

// Release decides the release of the holding (owner, epoch): the lease becomes free at once, keeping
// its epoch. Releasing a holding that is not current answers [ErrLost] and changes nothing.
func Release(cur State, owner string, epoch int64, now time.Time) (State, error) {
	if cur.Owner != owner || cur.Epoch != epoch || !now.Before(cur.ExpiresAt) {
		return cur, ErrLost
	}
	return State{Epoch: epoch}, nil
}
