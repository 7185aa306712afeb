// Package securefile writes and reads files that hold secrets: owner-only (0600 files in 0700
// directories), written atomically, and refused on read when their type or mode is unsafe.
package securefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// ErrInsecure is wrapped by [ReadFile] when the path is a symlink, not a regular file, or
// readable or writable by group or others.
var ErrInsecure = errors.New("berth: insecure secret file")

// FileMode and DirMode are the permissions WriteFile gives a file and the directories it creates.
const (
	FileMode os.FileMode = 0o600
	DirMode  os.FileMode = 0o700
)

// WriteFile replaces path with data atomically: it creates missing parent directories 0700,
// writes a temporary 0600 file in the same directory, fsyncs it, renames it over path and fsyncs
// the directory, so a crash leaves either the old or the new content, never a mix. Existing
// parent directories keep their mode. A symlink at path is replaced, not followed.
func WriteFile(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return fmt.Errorf("securefile: write %s: create directory: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("securefile: write %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmpName)
		}
	}()
	// CreateTemp already uses 0600; Chmod makes it independent of that detail and of the umask.
	if err := tmp.Chmod(FileMode); err != nil {
		return fmt.Errorf("securefile: write %s: chmod: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("securefile: write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("securefile: write %s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("securefile: write %s: close: %w", path, err)
	}
	if err := os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("securefile: write %s: rename: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("securefile: write %s: fsync directory: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadFile returns the content of path. It refuses, with an error wrapping [ErrInsecure], a
// symlink (the final component is opened with O_NOFOLLOW), anything that is not a regular file,
// and a file with any group or other permission bit set. A missing file gives an error wrapping
// [os.ErrNotExist].
func ReadFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("securefile: read %s: is a symlink: %w", path, ErrInsecure)
		}
		return nil, fmt.Errorf("securefile: read %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("securefile: read %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("securefile: read %s: not a regular file (%v): %w", path, fi.Mode().Type(), ErrInsecure)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("securefile: read %s: mode %v is open to group or others, want 0600: %w", path, perm, ErrInsecure)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("securefile: read %s: %w", path, err)
	}
	return data, nil
}
