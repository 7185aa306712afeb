package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berthhq/berth/core/store"
)

// TestRetryOnConflict walks the policy: success ends at once, a conflict is retried up to
// store.RetryAttempts tries in all, any other error is returned at once, and a context that ends
// stops the retries.
func TestRetryOnConflict(t *testing.T) {
	t.Parallel()
	errOther := errors.New("disk on fire")
	errMine := errors.New("my revision conflict")
	wrapped := func(err error) error { return fmt.Errorf("write service web: %w", err) }
	cases := []struct {
		name      string
		conflicts []error
		// answer returns fn's result for call n (1-based); cancel is the context's cancel.
		answer    func(n int, cancel context.CancelFunc) error
		wantCalls int
		wantIs    []error // every one must be found in the result with errors.Is
		wantNil   bool
	}{
		{name: "first try wins", answer: func(int, context.CancelFunc) error { return nil }, wantCalls: 1, wantNil: true},
		{name: "wins after two conflicts", answer: func(n int, _ context.CancelFunc) error {
			if n < 3 {
				return wrapped(store.ErrConflict)
			}
			return nil
		}, wantCalls: 3, wantNil: true},
		{name: "gives up after the policy's attempts", answer: func(int, context.CancelFunc) error { return wrapped(store.ErrConflict) },
			wantCalls: store.RetryAttempts, wantIs: []error{store.ErrRetriesExhausted, store.ErrConflict}},
		{name: "other error is not retried", answer: func(int, context.CancelFunc) error { return wrapped(errOther) },
			wantCalls: 1, wantIs: []error{errOther}},
		{name: "given sentinels replace the default", conflicts: []error{errMine}, answer: func(n int, _ context.CancelFunc) error {
			if n == 1 {
				return wrapped(errMine)
			}
			return wrapped(store.ErrConflict) // not a conflict for this caller
		}, wantCalls: 2, wantIs: []error{store.ErrConflict}},
		{name: "stops when the context ends", answer: func(n int, cancel context.CancelFunc) error {
			if n == 3 {
				cancel()
			}
			return wrapped(store.ErrConflict)
		}, wantCalls: 3, wantIs: []error{context.Canceled}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			calls := 0
			err := store.RetryOnConflict(ctx, func() error {
				calls++
				return tc.answer(calls, cancel)
			}, tc.conflicts...)
			if calls != tc.wantCalls {
				t.Errorf("fn called %d times, want %d", calls, tc.wantCalls)
			}
			if tc.wantNil != (err == nil) {
				t.Fatalf("err = %v, want nil: %v", err, tc.wantNil)
			}
			for _, want := range tc.wantIs {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, does not wrap %v", err, want)
				}
			}
			if len(tc.wantIs) > 0 && tc.wantIs[0] != store.ErrRetriesExhausted && errors.Is(err, store.ErrRetriesExhausted) {
				t.Errorf("err = %v wraps ErrRetriesExhausted, but the retries did not run out", err)
			}
		})
	}
}

// TestRetryOnConflictFunc checks the predicate form: what the predicate calls a conflict is
// retried, the rest is returned at once.
func TestRetryOnConflictFunc(t *testing.T) {
	t.Parallel()
	errRace := errors.New("duplicate key")
	calls := 0
	err := store.RetryOnConflictFunc(context.Background(), func(err error) bool { return errors.Is(err, errRace) }, func() error {
		calls++
		if calls < 4 {
			return errRace
		}
		return store.ErrConflict // not a conflict under this predicate
	})
	if calls != 4 || !errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrRetriesExhausted) {
		t.Fatalf("calls = %d, err = %v; want 4 calls ending in the unretried ErrConflict", calls, err)
	}
}
