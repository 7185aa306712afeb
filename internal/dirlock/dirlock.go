// Package dirlock gives one process at a time a data directory: an exclusive,
// non-blocking flock(2) on a file inside it, released when the process exits.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// FileName is the file in a data directory that [Lock] locks.
const FileName = ".lock"

// ErrLocked is returned by [Lock] when another process, or another Lock in
// this process, holds the directory.
var ErrLocked = errors.New("berth: data directory is locked by another process")

// Lock takes an exclusive, non-blocking flock(2) on dir/.lock (creating dir
// 0700 and the file 0600 as needed) and records the holder's pid in it. It
// returns an error wrapping [ErrLocked] when the directory is held. The lock
// lives as long as the process or until unlock is called; unlock is idempotent.
func Lock(dir string) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	// The pid is informational (for an operator reading the file); the flock is the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return sync.OnceValue(func() error {
		errU := unix.Flock(int(f.Fd()), unix.LOCK_UN)
		errC := f.Close()
		if err := errors.Join(errU, errC); err != nil {
			return fmt.Errorf("unlock %s: %w", dir, err)
		}
		return nil
	}), nil
}

// Hold keeps another process from taking dir's lock, without writing
// anything in dir: it takes a shared, non-blocking flock(2) on dir/.lock,
// which an exclusive [Lock] cannot take meanwhile. It returns an error
// wrapping [ErrLocked], with holder the pid the lock file names (0 when it
// names none), when a process holds the lock; a directory never locked (no
// lock file) is held by nothing, and release then does nothing. release is
// idempotent.
func Hold(dir string) (release func() error, holder int, err error) {
	f, err := os.Open(filepath.Join(dir, FileName))
	if errors.Is(err, os.ErrNotExist) {
		return func() error { return nil }, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("hold %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		raw := make([]byte, 32)
		n, _ := f.ReadAt(raw, 0)
		_ = f.Close()
		holder, _ = strconv.Atoi(strings.TrimSpace(string(raw[:n])))
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, holder, fmt.Errorf("hold %s: %w", dir, ErrLocked)
		}
		return nil, 0, fmt.Errorf("hold %s: %w", dir, err)
	}
	return sync.OnceValue(func() error {
		if err := f.Close(); err != nil { // closing the last descriptor releases the flock
			return fmt.Errorf("release %s: %w", dir, err)
		}
		return nil
	}), 0, nil
}
