// Package digestio checks a stream against the SHA-256 digest and size
// recorded for it, as the stream is read.
package digestio

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// Verify returns a reader of rc that hashes what it reads and, at the end of
// the stream, answers an error wrapping mismatch instead of io.EOF when the
// bytes read do not have the digest want ("sha256:<hex>") and the length
// size. Close closes rc. A caller that stops reading before the end learns
// nothing: only a whole stream is verified.
func Verify(rc io.ReadCloser, want string, size int64, mismatch error) io.ReadCloser {
	return &verifier{rc: rc, h: sha256.New(), want: want, size: size, mismatch: mismatch}
}

type verifier struct {
	rc       io.ReadCloser
	h        hash.Hash
	n        int64
	want     string
	size     int64
	mismatch error
}

func (v *verifier) Read(b []byte) (int, error) {
	n, err := v.rc.Read(b)
	v.h.Write(b[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) {
		if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); got != v.want || v.n != v.size {
			return n, fmt.Errorf("archive read as %s (%d bytes), record says %s (%d bytes): %w", got, v.n, v.want, v.size, v.mismatch)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }
