// Package planstest holds what tests of the plan log share: opening an embedded store the way a
// restarted berthd does, with the plan log replayed.
package planstest

import (
	"context"
	"testing"
	"time"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/store"
)

// Replayed opens the embedded store in dir under its directory lock, opens and closes an
// applier (which materializes every plan-log entry a killed process left unmaterialized), runs f
// on the store and closes it. Every step is bounded by one minute; a failure fails t.
func Replayed(t testing.TB, dir string, f func(st *store.Store)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unlock() }()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close(context.Background()) }()
	a, err := plans.Open(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f(st)
}
