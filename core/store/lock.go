package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// LockFileName is the file in a data directory that [LockDir] locks.
const LockFileName = ".lock"

// LockDir takes an exclusive, non-blocking flock(2) on dir/.lock (creating dir 0700 and the file
// 0600 as needed) and records the holder's pid in it. It returns an error wrapping [ErrLocked]
// when another process, or another LockDir in this process, holds it. The lock lives as long as
// the returned unlock is not called and the process is alive; the kernel drops it when the
// process exits, so a crash never leaves a stale lock. unlock is idempotent.
func LockDir(dir string) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("store: lock %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	// The pid is informational (for an operator reading the file); the flock is the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return sync.OnceValue(func() error {
		errU := unix.Flock(int(f.Fd()), unix.LOCK_UN)
		errC := f.Close()
		if err := errors.Join(errU, errC); err != nil {
			return fmt.Errorf("store: unlock %s: %w", dir, err)
		}
		return nil
	}), nil
}
