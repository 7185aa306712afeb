package reconciler

import (
	"slices"
	"sync"
	"testing"
)

func TestQueueDeduplicates(t *testing.T) {
	q := NewQueue[string](0)
	for _, k := range []string{"a", "b", "a", "c", "b", "a"} {
		if !q.Add(k) {
			t.Fatalf("Add(%q) dropped by an unbounded queue", k)
		}
	}
	if q.Len() != 3 {
		t.Fatalf("Len = %d, want 3", q.Len())
	}
	select {
	case <-q.Ready():
	default:
		t.Fatal("Ready not signalled after Add")
	}
	got, over := q.Take(0)
	if !slices.Equal(got, []string{"a", "b", "c"}) || over {
		t.Fatalf("Take = %v, %v; want [a b c] in first-queued order, no overflow", got, over)
	}
	if got, _ := q.Take(0); len(got) != 0 {
		t.Fatalf("second Take = %v, want nothing", got)
	}
}

func TestQueueRequeuesKeyChangedWhileProcessing(t *testing.T) {
	q := NewQueue[string](0)
	q.Add("svc")
	got, _ := q.Take(1)
	if !slices.Equal(got, []string{"svc"}) {
		t.Fatalf("Take = %v", got)
	}
	// The key changes twice while its work runs: it is not handed out beside itself...
	q.Add("svc")
	q.Add("svc")
	if got, _ := q.Take(0); len(got) != 0 {
		t.Fatalf("a key being processed was handed out again: %v", got)
	}
	// ...and comes back exactly once when that work ends.
	<-q.Ready() // drain the signal of the Adds
	q.Done("svc")
	select {
	case <-q.Ready():
	default:
		t.Fatal("Done of a changed key did not signal Ready")
	}
	if got, _ := q.Take(0); !slices.Equal(got, []string{"svc"}) {
		t.Fatalf("after Done: Take = %v, want [svc] once", got)
	}
	q.Done("svc")
	if got, _ := q.Take(0); len(got) != 0 {
		t.Fatalf("an unchanged key came back after Done: %v", got)
	}
	q.Done("never-taken") // no effect
	if q.Len() != 0 {
		t.Fatalf("Len = %d after Done of an unknown key", q.Len())
	}
}

func TestQueueBoundedOverflowReportedOnce(t *testing.T) {
	q := NewQueue[int](3)
	for i := range 3 {
		if !q.Add(i) {
			t.Fatalf("Add(%d) dropped below the limit", i)
		}
	}
	if q.Add(2) != true {
		t.Fatal("re-adding a queued key at the limit must not count as dropped")
	}
	if q.Add(9) {
		t.Fatal("Add beyond the limit reported queued")
	}
	if q.Len() != 3 {
		t.Fatalf("Len = %d, want 3 (bounded)", q.Len())
	}
	got, over := q.Take(2)
	if !slices.Equal(got, []int{0, 1}) || !over {
		t.Fatalf("Take(2) = %v, %v; want [0 1] and the overflow", got, over)
	}
	if _, over := q.Take(0); over {
		t.Fatal("the overflow was reported twice")
	}
}

func TestQueueConcurrentAddsEachKeyOnce(t *testing.T) {
	q := NewQueue[int](0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				q.Add((i + g) % 50)
			}
		}()
	}
	wg.Wait()
	got, _ := q.Take(0)
	slices.Sort(got)
	want := make([]int, 50)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Take = %v, want each of 0..49 once", got)
	}
}
