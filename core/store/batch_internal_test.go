package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
)

// TestBatcherGroupsConcurrentCallers: while one batch is being written, every
// caller that arrives joins the next one, which is written as one flush; each
// caller gets its own item's result and error, in submission order within a
// batch, and no batch exceeds Size.
func TestBatcherGroupsConcurrentCallers(t *testing.T) {
	const callers = 40
	var b *Batcher[int, int]
	var mu sync.Mutex
	var sizes []int
	release := make(chan struct{})
	b = NewBatcher(BatchConfig{Size: 32, Wait: -1}, func(ctx context.Context, items []int) ([]int, []error) {
		mu.Lock()
		first := len(sizes) == 0
		sizes = append(sizes, len(items))
		mu.Unlock()
		if first {
			<-release // held until every other caller queued behind it
		}
		res := make([]int, len(items))
		errs := make([]error, len(items))
		for i, v := range items {
			res[i] = v * 10
			if v%7 == 0 {
				errs[i] = errors.New("refused")
			}
		}
		return res, errs
	})
	var wg sync.WaitGroup
	got := make([]int, callers)
	gotErr := make([]error, callers)
	wg.Add(1)
	go func() { defer wg.Done(); got[0], gotErr[0] = b.Do(context.Background(), 0) }()
	proctest.WaitFor(t, 10*time.Second, "the first flush", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(sizes) == 1, ""
	})
	for i := 1; i < callers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); got[i], gotErr[i] = b.Do(context.Background(), i) }()
	}
	proctest.WaitFor(t, 10*time.Second, "every other caller queued", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == callers-1, fmt.Sprintf("%d queued", len(b.queue))
	})
	close(release)
	wg.Wait()
	for i := range callers {
		if got[i] != i*10 || (gotErr[i] != nil) != (i%7 == 0) {
			t.Fatalf("caller %d: result %d err %v", i, got[i], gotErr[i])
		}
	}
	if len(sizes) != 3 || sizes[0] != 1 || sizes[1] != 32 || sizes[2] != callers-1-32 {
		t.Fatalf("flushes of %v items, want [1 32 %d]", sizes, callers-1-32)
	}
}

// TestBatcherCallerLeavesEarly: a caller whose ctx ends gets ctx's error, and
// its item is written anyway.
func TestBatcherCallerLeavesEarly(t *testing.T) {
	written := make(chan int, 1)
	release := make(chan struct{})
	b := NewBatcher(BatchConfig{Wait: -1}, func(ctx context.Context, items []int) ([]int, []error) {
		<-release
		written <- items[0]
		return make([]int, len(items)), nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := b.Do(ctx, 5); done <- err }()
	cancel()
	close(release)
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v", err)
	}
	select {
	case v := <-written:
		if v != 5 {
			t.Fatalf("wrote %d", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the item of a caller that left was not written")
	}
}
