package bundles

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/berthhq/berth/core/blobs"
)

// PutBlob stores the bytes read from r, at most maxBytes, under the same
// content-addressed key as bundles (sha256/<hex>) without checking their
// format or recording them in the bundle catalog; other stores (the
// WebAssembly modules of core/policy) keep their own catalogs. It returns the
// digest ("sha256:<hex>") and the size. Errors: ErrTooLarge,
// ErrDigestMismatch when want is not empty and differs, blob store errors.
// Storing the same bytes again is harmless.
func (s *Store) PutBlob(ctx context.Context, want string, r io.Reader, maxBytes int64) (string, int64, error) {
	if want != "" && !ValidDigest(want) {
		return "", 0, ErrBadDigest
	}
	f, digest, n, err := s.spool(ctx, want, r, maxBytes)
	if err != nil {
		return "", 0, err
	}
	defer f.close()
	if err := s.store(ctx, f, digest, n); err != nil {
		return "", 0, err
	}
	return digest, n, nil
}

// ReadBlob returns the whole blob of digest. Errors: ErrBadDigest, ErrNotFound.
func (s *Store) ReadBlob(digest string) ([]byte, error) {
	f, _, err := s.Open(context.Background(), digest)
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

// mapBlobErr turns blob store errors into this package's.
func mapBlobErr(err error) error {
	switch {
	case errors.Is(err, blobs.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, blobs.ErrDigestMismatch):
		return fmt.Errorf("%w: %w", ErrDigestMismatch, err)
	case errors.Is(err, blobs.ErrTooLarge):
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return err
}
