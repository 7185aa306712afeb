package store

import "github.com/berthhq/berth/internal/dirlock"

// LockFileName is the file in a data directory that [LockDir] locks.
const LockFileName = dirlock.FileName

// LockDir takes an exclusive, non-blocking flock(2) on dir/.lock (creating dir 0700 and the file
// 0600 as needed). It returns an error wrapping [ErrLocked] when another process, or another
// LockDir in this process, holds it. The lock lives as long as the process or until unlock is
// called; unlock is idempotent.
func LockDir(dir string) (unlock func() error, err error) {
	return dirlock.Lock(dir)
}
