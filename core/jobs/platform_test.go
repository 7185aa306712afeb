package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestPlatformRecordsPasses: each pass of a platform task lands on its one document with its
// result and message, counters grow, the history keeps the newest PlatformHistory passes, two
// berthd racing on one task lose no pass, and List orders tasks by name.
func TestPlatformRecordsPasses(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	p := jobs.NewPlatform(st, nil)
	start := time.Now().Add(-time.Second)
	if err := p.Record(ctx, "registry.gc", time.Hour, start, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Record(ctx, "registry.gc", time.Hour, start, errors.New("blob store unreachable")); err != nil {
		t.Fatal(err)
	}
	const more = jobs.PlatformHistory + 5
	for i := range more {
		if err := p.Record(ctx, "idempotency.expiry", time.Hour, start.Add(time.Duration(i)*time.Millisecond), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Two recorders at once, as two berthd would: every pass counted.
	other := jobs.NewPlatform(st, nil)
	var wg sync.WaitGroup
	for i := range 10 {
		rec := p
		if i%2 == 1 {
			rec = other
		}
		wg.Go(func() {
			if err := rec.Record(ctx, "backups.schedule", time.Minute, start, fmt.Errorf("pass %d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	tasks, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 3 || tasks[0].Name != "backups.schedule" || tasks[1].Name != "idempotency.expiry" || tasks[2].Name != "registry.gc" {
		t.Fatalf("tasks %+v, want backups.schedule, idempotency.expiry, registry.gc", tasks)
	}
	if b := tasks[0]; b.Passes != 10 || b.Failures != 10 || len(b.History) != 10 || b.EveryS != 60 {
		t.Errorf("backups.schedule: %d passes, %d failures, %d kept, every %d s; want 10, 10, 10, 60", b.Passes, b.Failures, len(b.History), b.EveryS)
	}
	ie := tasks[1]
	if ie.Passes != more || ie.Failures != 0 || len(ie.History) != jobs.PlatformHistory {
		t.Errorf("idempotency.expiry: %d passes, %d failures, %d kept; want %d, 0, %d", ie.Passes, ie.Failures, len(ie.History), more, jobs.PlatformHistory)
	}
	if newest := ie.History[len(ie.History)-1]; !newest.StartedAt.Equal(ie.Last.StartedAt) {
		t.Errorf("the history's newest pass %v is not the last %v", newest.StartedAt, ie.Last.StartedAt)
	}
	gc := tasks[2]
	if gc.Passes != 2 || gc.Failures != 1 || gc.Last == nil || gc.Last.Result != "failed" || gc.Last.Message != "blob store unreachable" || gc.History[0].Result != "succeeded" {
		t.Errorf("registry.gc: %+v; want 2 passes, 1 failed, the last failed with its message", gc)
	}
	if gc.Last.EndedAt.Before(gc.Last.StartedAt) {
		t.Errorf("registry.gc's last pass ended %v before it started %v", gc.Last.EndedAt, gc.Last.StartedAt)
	}
}

// TestPlatformEveryRunsAndRecords: Every runs the pass first after its first wait, then after
// the wait the pass returns, recording each, and stops with its context.
func TestPlatformEveryRunsAndRecords(t *testing.T) {
	st := storetest.Open(t)
	p := jobs.NewPlatform(st, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	passes := make(chan int, 10)
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Every(ctx, "test.task", time.Hour, time.Millisecond, func(context.Context) (time.Duration, error) {
			n++
			passes <- n
			if n == 2 {
				return time.Millisecond, errors.New("second pass failed")
			}
			return time.Millisecond, nil
		})
	}()
	for want := 1; want <= 3; want++ {
		select {
		case got := <-passes:
			if got != want {
				t.Fatalf("pass %d, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("pass %d did not run within 10 s", want)
		}
	}
	cancel()
	<-done
	tasks, err := p.List(context.Background())
	if err != nil || len(tasks) != 1 {
		t.Fatalf("tasks %+v, %v", tasks, err)
	}
	if tk := tasks[0]; tk.Passes < 2 || tk.Failures != 1 || tk.History[1].Message != "second pass failed" || tk.EveryS != 3600 {
		t.Errorf("test.task %+v; want at least 2 passes recorded, the second failed with its message, every 3600 s", tk)
	}
}

// TestPlatformListsTasksBeforeTheirFirstPass: a task this berthd runs is listed from its start,
// with no passes and its period, before its first pass is due (a newcomer's `job ls --platform`
// showed only the tasks that had passed once); once its loop ends it is no longer listed.
func TestPlatformListsTasksBeforeTheirFirstPass(t *testing.T) {
	st := storetest.Open(t)
	p := jobs.NewPlatform(st, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Every(ctx, "registry.gc", 24*time.Hour, time.Hour, func(context.Context) (time.Duration, error) {
			t.Error("a pass ran before its first delay")
			return 0, nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tasks, err := p.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) == 1 {
			if tk := tasks[0]; tk.Name != "registry.gc" || tk.Passes != 0 || tk.Last != nil || tk.EveryS != 86400 || tk.History == nil {
				t.Fatalf("listed before its first pass: %+v", tk)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry.gc not listed within 10 s: %+v", tasks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if tasks, err := p.List(context.Background()); err != nil || len(tasks) != 0 {
		t.Fatalf("after its loop ended: %+v, %v", tasks, err)
	}
}
