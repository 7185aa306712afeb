// Package blobs is berthd's one object store: bundles, module blobs, backups and
// registry content, on the local filesystem by default or in an S3 bucket.
package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"
)

// Errors returned by every [Store]. Each is checked with errors.Is.
var (
	// ErrNotFound: Get, Stat or a ranged read of a key that holds no object.
	ErrNotFound = errors.New("berth: blob not found")
	// ErrDigestMismatch: Put whose bytes do not hash to PutOptions.SHA256, or
	// whose length differs from PutOptions.Size. Nothing is stored.
	ErrDigestMismatch = errors.New("berth: blob does not match its declared digest or size")
	// ErrTooLarge: Put of more than PutOptions.MaxBytes. Nothing is stored.
	ErrTooLarge = errors.New("berth: blob larger than the limit")
	// ErrBadKey: a key that is empty, absolute, holds "..", "." or an empty
	// segment, a backslash or a control character.
	ErrBadKey = errors.New("berth: malformed blob key")
	// ErrUnavailable: the backend could not be reached or answered with a
	// server error; the operation may be retried. Nothing half-written is
	// visible.
	ErrUnavailable = errors.New("berth: blob store unavailable")
)

// Info describes one stored object.
type Info struct {
	Key     string    // the object's key, slash-separated
	Size    int64     // bytes
	SHA256  string    // "sha256:<hex>" when known (always after Put; Stat only where the backend recorded it)
	ModTime time.Time // when it was last written, UTC
}

// PutOptions bound and check one [Store.Put]. The zero value stores any
// stream of unknown length with no limit and no expected digest.
type PutOptions struct {
	// Size is the exact length in bytes when known (lets S3 pick part sizes);
	// -1 or 0 means unknown. A stream of another length is ErrDigestMismatch.
	Size int64
	// SHA256 is the expected digest, "sha256:<hex>" or bare hex; empty: none.
	SHA256 string
	// MaxBytes bounds the stream; zero or negative means no bound.
	MaxBytes int64
	// ContentType is recorded by backends that keep one (S3); empty: binary.
	ContentType string
}

// Store is the blob store contract. Keys are slash-separated relative paths
// ("bundles/sha256/<hex>", "registry/docker/..."), checked by [ValidKey].
//
// Lifecycle: an object becomes visible at its key only once Put has received,
// hashed and checked all of its bytes; a Put that fails or is cancelled leaves
// nothing at the key (and an earlier object there unchanged). A Put to an
// existing key replaces it atomically. Implementations are safe for
// concurrent use.
//
// Example:
//
//	info, err := st.Put(ctx, "bundles/sha256/"+hex, r, blobs.PutOptions{SHA256: "sha256:" + hex})
//	rc, _, err := st.Get(ctx, info.Key, 0, -1)
type Store interface {
	// Put stores r's bytes at key, computing their size and SHA-256 as they
	// arrive. Errors: ErrBadKey, ErrTooLarge, ErrDigestMismatch,
	// ErrUnavailable, or the reader's own error; on any error nothing new is
	// visible at key.
	Put(ctx context.Context, key string, r io.Reader, opt PutOptions) (Info, error)
	// Get opens key for reading from byte offset off for length bytes
	// (length < 0: to the end). The caller closes the reader. The Info is the
	// whole object's. Errors: ErrBadKey, ErrNotFound, ErrUnavailable; an
	// offset past the end reads nothing.
	Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, Info, error)
	// Stat describes key. Errors: ErrBadKey, ErrNotFound, ErrUnavailable.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; a missing key is success. Errors: ErrBadKey,
	// ErrUnavailable.
	Delete(ctx context.Context, key string) error
	// List calls fn for every object whose key starts with prefix, in
	// lexical key order, and stops at fn's first error, which it returns.
	// An empty prefix lists everything.
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// ValidKey reports whether key is a usable object key: a relative,
// slash-separated path of at most 1,024 bytes whose segments are neither
// empty nor "." or "..", without backslashes or control characters.
func ValidKey(key string) bool {
	if key == "" || len(key) > 1024 || strings.HasPrefix(key, "/") || strings.ContainsRune(key, '\\') {
		return false
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// normalDigest turns "sha256:<hex>" or "<hex>" into "sha256:<hex>"; it
// reports false for anything else.
func normalDigest(d string) (string, bool) {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) != 64 {
		return "", false
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return "sha256:" + d, true
}

// checkingReader hashes and counts what passes through it and, at the end of
// the stream, refuses to report a clean EOF when the bytes break the
// PutOptions: the error reaches the backend before it can commit the object.
// With a known size it checks as soon as the last byte is read, holding those
// bytes back on a mismatch, since a backend that reads exactly Size bytes
// never asks for the EOF.
type checkingReader struct {
	r      io.Reader
	h      hash.Hash
	n      int64
	opt    PutOptions
	want   string
	err    error // sticky: once failed, always failed
	digest string
}

func newCheckingReader(r io.Reader, opt PutOptions) (*checkingReader, error) {
	c := &checkingReader{r: r, h: sha256.New(), opt: opt}
	if opt.SHA256 != "" {
		d, ok := normalDigest(opt.SHA256)
		if !ok {
			return nil, fmt.Errorf("%w: expected digest %q is malformed", ErrDigestMismatch, opt.SHA256)
		}
		c.want = d
	}
	if opt.MaxBytes > 0 && opt.Size > opt.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes declared, limit %d", ErrTooLarge, opt.Size, opt.MaxBytes)
	}
	return c, nil
}

func (c *checkingReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.digest != "" {
		return 0, io.EOF
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if c.opt.MaxBytes > 0 && c.n > c.opt.MaxBytes {
		c.err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, c.opt.MaxBytes)
		return 0, c.err
	}
	if c.opt.Size > 0 && c.n > c.opt.Size {
		c.err = fmt.Errorf("%w: more than the %d bytes declared", ErrDigestMismatch, c.opt.Size)
		return 0, c.err
	}
	end := errors.Is(err, io.EOF) || (c.opt.Size > 0 && c.n == c.opt.Size)
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
		return 0, err
	}
	if end && !errors.Is(err, io.EOF) {
		// The declared size is reached: the stream must end here.
		var one [1]byte
		m, perr := io.ReadFull(c.r, one[:])
		if m > 0 {
			c.err = fmt.Errorf("%w: more than the %d bytes declared", ErrDigestMismatch, c.opt.Size)
			return 0, c.err
		}
		if perr != nil && !errors.Is(perr, io.EOF) {
			c.err = perr
			return 0, perr
		}
	}
	if end {
		if err := c.finish(); err != nil {
			c.err = err
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	}
	return n, nil
}

// finish checks the complete stream against the options.
func (c *checkingReader) finish() error {
	if c.opt.Size > 0 && c.n != c.opt.Size {
		return fmt.Errorf("%w: %d bytes declared, %d received", ErrDigestMismatch, c.opt.Size, c.n)
	}
	d := "sha256:" + hex.EncodeToString(c.h.Sum(nil))
	if c.want != "" && d != c.want {
		return fmt.Errorf("%w: claimed %s, got %s", ErrDigestMismatch, c.want, d)
	}
	c.digest = d
	return nil
}

// done returns the digest and size once the stream passed every check.
func (c *checkingReader) done() (string, int64, error) {
	if c.err != nil {
		return "", 0, c.err
	}
	if c.digest == "" {
		return "", 0, fmt.Errorf("%w: the stream was not read to its end", ErrDigestMismatch)
	}
	return c.digest, c.n, nil
}
