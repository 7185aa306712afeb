package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// The one retry policy of every compare-and-set that lost a race (docs/store.md section 2.3):
// up to RetryAttempts tries in all; the first retry goes at once (the loser re-reads and
// re-decides against what won), every later one after a random delay in [0, d), where d starts
// at RetryBaseDelay and doubles per retry up to RetryMaxDelay ("full jitter": racers that lost
// together do not come back together). The worst case sleeps about RetryMaxDelay *
// (RetryAttempts - 7), half that on average: well under a second.
const (
	// RetryAttempts is how many times [RetryOnConflict] calls its function at most.
	RetryAttempts = 16
	// RetryBaseDelay is the ceiling of the second retry's random delay.
	RetryBaseDelay = time.Millisecond
	// RetryMaxDelay caps every retry's random delay.
	RetryMaxDelay = 64 * time.Millisecond
)

// ErrRetriesExhausted is wrapped, together with the last conflict, by [RetryOnConflict] and
// [RetryOnConflictFunc] when every one of RetryAttempts tries lost a race. errors.Is finds both
// it and the conflict's own sentinel, so callers that map a conflict to a refusal keep doing so.
var ErrRetriesExhausted = errors.New("berth: compare-and-set lost every retry")

// RetryOnConflict calls fn until it returns nil or an error that is not a conflict, and returns
// that; a conflict is an error that errors.Is finds one of conflicts in, or [ErrConflict] when
// conflicts is empty. fn is one whole attempt: it re-reads what it decides on and ends in one
// compare-and-set, so running it again is safe.
//
// It stops with an error wrapping ctx's cause when ctx ends during a delay, and with one
// wrapping both [ErrRetriesExhausted] and the last conflict after RetryAttempts conflicts in a
// row. Errors that are not conflicts are returned as they are, at once.
func RetryOnConflict(ctx context.Context, fn func() error, conflicts ...error) error {
	if len(conflicts) == 0 {
		conflicts = []error{ErrConflict}
	}
	return RetryOnConflictFunc(ctx, func(err error) bool {
		for _, c := range conflicts {
			if errors.Is(err, c) {
				return true
			}
		}
		return false
	}, fn)
}

// RetryOnConflictFunc is [RetryOnConflict] with the conflict test given as a predicate, for a
// race that is not a sentinel error (a duplicate key of a sequence, a miss of a conditional
// update reported as a boolean and turned into an error by fn).
func RetryOnConflictFunc(ctx context.Context, isConflict func(error) bool, fn func() error) error {
	var last error
	for attempt := range RetryAttempts {
		if attempt > 0 {
			if err := retryDelay(ctx, attempt); err != nil {
				return fmt.Errorf("store: stopped retrying a lost compare-and-set: %w", err)
			}
		}
		last = fn()
		if last == nil || !isConflict(last) {
			return last
		}
	}
	return fmt.Errorf("%w (%d tries): %w", ErrRetriesExhausted, RetryAttempts, last)
}

// retryDelay waits before the attempt-th retry (attempt >= 1) as the policy says, or until ctx
// ends, whose cause it then returns.
func retryDelay(ctx context.Context, attempt int) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if attempt == 1 {
		return nil
	}
	ceiling := RetryMaxDelay
	if shift := attempt - 2; shift < 7 { // 1 ms << 6 = 64 ms
		ceiling = min(RetryBaseDelay<<shift, RetryMaxDelay)
	}
	t := time.NewTimer(rand.N(ceiling) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
