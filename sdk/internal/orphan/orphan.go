// Package orphan ends a plugin process whose host died: a host killed with
// SIGKILL cannot stop its plugins, and an orphaned plugin would keep its
// listener and state directory from the host's next start.
package orphan

import (
	"context"
	"os"
	"time"
)

// Interval is how often the parent process id is checked.
const Interval = 500 * time.Millisecond

// Watch calls exit once the process's parent changes (the host died and the
// process was re-parented), checking every Interval until ctx ends. A process
// whose parent is already init (pid 1) at the start is not watched: it was not
// started by a host. exit nil means os.Exit(3).
func Watch(ctx context.Context, exit func()) {
	if exit == nil {
		exit = func() { os.Exit(3) }
	}
	start := os.Getppid()
	if start <= 1 {
		return
	}
	go func() {
		t := time.NewTicker(Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if os.Getppid() != start {
					exit()
					return
				}
			}
		}
	}()
}
