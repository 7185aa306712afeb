package policy

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestGroupJoinsOnlyTheNextRun: a call made while a run is in flight waits
// for the next run instead of taking the in-flight one's result, so a read
// through a group always started after its caller asked (a binding made
// before an admission is seen by it), and calls that arrive together share
// one run.
func TestGroupJoinsOnlyTheNextRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started, release := make(chan struct{}, 4), make(chan struct{})
	var mu sync.Mutex
	var runs [][]int
	g := &group[int, int]{run: func(_ context.Context, items []int) []int {
		mu.Lock()
		runs = append(runs, slices.Clone(items))
		first := len(runs) == 1
		mu.Unlock()
		if first {
			started <- struct{}{}
			<-release
		}
		out := make([]int, len(items))
		for i, it := range items {
			out[i] = it * 10
		}
		return out
	}}
	results := make(chan [2]int, 3)
	call := func(n int) {
		r, err := g.do(ctx, n)
		if err != nil {
			t.Error(err)
		}
		results <- [2]int{n, r}
	}
	go call(1)
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the first run never started")
	}
	go call(2)
	go call(3)
	for { // both later calls are queued behind the run in flight
		g.mu.Lock()
		n := len(g.pending)
		g.mu.Unlock()
		if n == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the later calls were never queued")
		}
		runtime.Gosched()
	}
	close(release)
	got := map[int]int{}
	for range 3 {
		select {
		case r := <-results:
			got[r[0]] = r[1]
		case <-ctx.Done():
			t.Fatal("a call never returned")
		}
	}
	if got[1] != 10 || got[2] != 20 || got[3] != 30 {
		t.Fatalf("results %v; want each item's own", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 2 || !slices.Equal(runs[0], []int{1}) || len(runs[1]) != 2 {
		t.Fatalf("runs %v; want [1] alone, then 2 and 3 together", runs)
	}
}
