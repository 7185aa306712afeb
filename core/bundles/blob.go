package bundles

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// PutBlob stores the bytes read from r, at most maxBytes, in the same
// content-addressed layout as bundles (Dir/sha256/<hex>) without checking
// their format or recording them in the bundle catalog; other stores (the
// WebAssembly modules of core/policy) keep their own catalogs. It returns the
// digest ("sha256:<hex>") and the size. Errors: ErrTooLarge,
// ErrDigestMismatch when want is not empty and differs. Storing the same
// bytes again is harmless.
func (s *Store) PutBlob(ctx context.Context, want string, r io.Reader, maxBytes int64) (string, int64, error) {
	if want != "" && !ValidDigest(want) {
		return "", 0, ErrBadDigest
	}
	tmp, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "blob-*")
	if err != nil {
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxBytes+1))
	if err != nil {
		return "", 0, fmt.Errorf("receive blob: %w", err)
	}
	if n > maxBytes {
		return "", 0, ErrTooLarge
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if want != "" && want != digest {
		return "", 0, fmt.Errorf("%w: claimed %s, got %s", ErrDigestMismatch, want, digest)
	}
	if err := ctx.Err(); err != nil {
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path(digest)); err != nil {
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	return digest, n, nil
}

// ReadBlob returns the whole blob of digest. Errors: ErrBadDigest, ErrNotFound.
func (s *Store) ReadBlob(digest string) ([]byte, error) {
	f, _, err := s.Open(digest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", digest, err)
	}
	return b, nil
}
