// Package bundle reads and writes release bundles: gzip-compressed tar archives,
// content-addressed by the SHA-256 of the compressed bytes (docs/api.md "Bundles").
package bundle

import (
	"context"
	"errors"
	"io"
)

// ErrInvalid is wrapped by Validate and Extract for an archive that is not a
// gzip tar, or that holds an absolute path, a path escaping its root, a link
// pointing out of it, or an entry type other than file, directory or symlink.
var ErrInvalid = errors.New("berth: invalid bundle")

// ErrTooLarge is wrapped when the archive's expanded size passes the limit.
var ErrTooLarge = errors.New("berth: bundle too large")

// Create writes a tar.gz of the directory dir (or of the single file dir) to w,
// with sorted entries and zeroed timestamps and owners, so the same tree gives
// the same digest. It returns the digest "sha256:<hex>" and the size in bytes.
func Create(ctx context.Context, dir string, w io.Writer) (digest string, size int64, err error) {
	return "", 0, errors.New("bundle.Create: not implemented yet")
}

// Validate reads a whole tar.gz from r and checks every entry as Extract would,
// without writing anything. maxExpanded bounds the total expanded bytes (zero
// means 4 GiB).
func Validate(ctx context.Context, r io.Reader, maxExpanded int64) error {
	return errors.New("bundle.Validate: not implemented yet")
}

// Extract unpacks the tar.gz from r into dir, which must exist and be empty.
// It refuses (ErrInvalid) absolute paths, "..", symlinks whose target resolves
// outside dir, hard links, devices and fifos; nothing outside dir is ever
// written. On error dir may hold a partial tree: the caller removes it.
func Extract(ctx context.Context, r io.Reader, dir string, maxExpanded int64) error {
	return errors.New("bundle.Extract: not implemented yet")
}
