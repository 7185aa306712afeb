package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/berthhq/berth/internal/securefile"
)

// RecordedProcess is a live plugin process that a reattach record names
// (docs/plugins.md section 2.8), as [ReadRecorded] found it. Its pid and start
// time together tell it from a later process that got the same pid.
type RecordedProcess struct {
	PID  int      // the process id
	Path string   // the binary the host launched
	Args []string // its arguments
	// startTicks is the process's start time, /proc/<pid>/stat field 22.
	startTicks uint64
}

// ReadRecorded reads the reattach record at path, written by a host whose
// Config.ReattachPath it was, and returns the process it names while that
// process still runs (same pid and start time). ok is false, with a nil
// error, when there is no record or its process is gone; an error means the
// record could not be read or is not one. It changes nothing.
func ReadRecorded(path string) (p RecordedProcess, ok bool, err error) {
	raw, err := securefile.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return RecordedProcess{}, false, nil
	}
	if err != nil {
		return RecordedProcess{}, false, fmt.Errorf("read reattach record: %w", err)
	}
	var rec reattachRecord
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Version != reattachVersion || rec.PID <= 0 {
		return RecordedProcess{}, false, fmt.Errorf("reattach record %s is corrupt or of another version", path)
	}
	if !sameProcessAlive(rec.PID, rec.StartTicks) {
		return RecordedProcess{}, false, nil
	}
	return RecordedProcess{PID: rec.PID, Path: rec.Path, Args: slices.Clone(rec.Args), startTicks: rec.StartTicks}, true, nil
}

// Stop ends the recorded process: SIGTERM, then SIGKILL when it is still
// there after grace, and returns once it is gone (exited or a zombie), or an
// error when it outlived the SIGKILL by 5 s or ctx ended. It only ever
// signals that process (pid and start time), and a process already gone is
// success. The record is left in place: the next host of that record finds
// its process gone and launches a new one.
func (p RecordedProcess) Stop(ctx context.Context, grace time.Duration) error {
	if p.PID <= 0 || p.PID == os.Getpid() {
		return fmt.Errorf("stop recorded plugin process: bad pid %d", p.PID)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !sameProcessAlive(p.PID, p.startTicks) {
			return nil
		}
		if err := syscall.Kill(p.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop plugin process %d: %w", p.PID, err)
		}
		wait := grace
		if sig == syscall.SIGKILL {
			wait = reapWait
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := waitGoneCtx(wctx, p.PID, p.startTicks)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop plugin process %d: %w", p.PID, ctx.Err())
		}
	}
	return fmt.Errorf("stop plugin process %d: still alive %s after SIGKILL", p.PID, reapWait)
}

// waitGoneCtx waits until pid (started at ticks) has exited or is a zombie, or
// ctx ends.
func waitGoneCtx(ctx context.Context, pid int, ticks uint64) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if !sameProcessAlive(pid, ticks) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
