// Package blobstest is the contract suite of [blobs.Store]: every backend
// runs the same cases, including a 200 MiB multipart object.
package blobstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/blobs"
)

// Run runs every case against a fresh store from open (called once per
// case; the stores may share a backend when their keys do not collide, so
// each case writes under its own prefix).
func Run(t *testing.T, open func(t *testing.T) blobs.Store) {
	cases := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, s blobs.Store, p string)
	}{
		{"RoundTrip", roundTrip},
		{"RangeRead", rangeRead},
		{"WrongChecksumRefused", wrongChecksum},
		{"WrongSizeRefused", wrongSize},
		{"TooLargeRefused", tooLarge},
		{"InterruptedUploadInvisible", interrupted},
		{"CancelledUploadInvisible", cancelled},
		{"ListDeleteAndKeys", listDelete},
		{"LargeMultipart", large},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			c.fn(t, ctx, open(t), "case"+string(rune('a'+i))+"/")
		})
	}
}

// pattern is a deterministic stream of n bytes: a fixed random MiB block
// with each block's index stamped over its first 8 bytes (so blocks differ).
type pattern struct {
	n, off int64
	block  []byte
}

func newPattern(n int64) *pattern {
	b := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return &pattern{n: n, block: b}
}

func (p *pattern) Read(out []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if int64(len(out)) > p.n-p.off {
		out = out[:p.n-p.off]
	}
	w := 0
	for w < len(out) {
		bi, bo := p.off/int64(len(p.block)), p.off%int64(len(p.block))
		var chunk []byte
		if bo < 8 {
			var stamp [8]byte
			binary.BigEndian.PutUint64(stamp[:], uint64(bi))
			chunk = stamp[bo:]
		} else {
			chunk = p.block[bo:]
		}
		c := copy(out[w:], chunk)
		w += c
		p.off += int64(c)
	}
	return w, nil
}

func digestOf(t *testing.T, r io.Reader) (string, int64) {
	t.Helper()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

func read(t *testing.T, ctx context.Context, s blobs.Store, key string, off, n int64) []byte {
	t.Helper()
	rc, _, err := s.Get(ctx, key, off, n)
	if err != nil {
		t.Fatalf("get %s [%d,+%d): %v", key, off, n, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustAbsent(t *testing.T, ctx context.Context, s blobs.Store, key string) {
	t.Helper()
	if info, err := s.Stat(ctx, key); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("stat %s = %+v, %v; want ErrNotFound", key, info, err)
	}
	if _, _, err := s.Get(ctx, key, 0, -1); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("get %s: %v; want ErrNotFound", key, err)
	}
}

func roundTrip(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	data := []byte("hello, blobs")
	info, err := s.Put(ctx, p+"one", bytes.NewReader(data), blobs.PutOptions{Size: int64(len(data)), SHA256: sum(data)})
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(data)) || info.SHA256 != sum(data) || info.Key != p+"one" {
		t.Fatalf("put info %+v", info)
	}
	if got := read(t, ctx, s, p+"one", 0, -1); !bytes.Equal(got, data) {
		t.Fatalf("read %q", got)
	}
	st, err := s.Stat(ctx, p+"one")
	if err != nil || st.Size != int64(len(data)) || st.ModTime.IsZero() {
		t.Fatalf("stat %+v %v", st, err)
	}
	// A stream of unknown length with no expected digest is hashed anyway.
	info, err = s.Put(ctx, p+"two", strings.NewReader("second"), blobs.PutOptions{})
	if err != nil || info.SHA256 != sum([]byte("second")) || info.Size != 6 {
		t.Fatalf("put %+v %v", info, err)
	}
	// Replacing an object is atomic and complete.
	if _, err := s.Put(ctx, p+"one", strings.NewReader("replaced"), blobs.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, ctx, s, p+"one", 0, -1); string(got) != "replaced" {
		t.Fatalf("after replace: %q", got)
	}
	// An empty object is an object.
	if _, err := s.Put(ctx, p+"empty", bytes.NewReader(nil), blobs.PutOptions{SHA256: sum(nil)}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stat(ctx, p+"empty"); err != nil || st.Size != 0 {
		t.Fatalf("empty: %+v %v", st, err)
	}
	mustAbsent(t, ctx, s, p+"never")
}

func rangeRead(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	data := make([]byte, 3<<20)
	_, _ = io.ReadFull(newPattern(int64(len(data))), data)
	if _, err := s.Put(ctx, p+"r", bytes.NewReader(data), blobs.PutOptions{Size: int64(len(data))}); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int64{{0, 10}, {1<<20 - 3, 7}, {2<<20 + 5, -1}, {int64(len(data)) - 1, 100}, {int64(len(data)), 5}, {5, 0}} {
		want := data[min(r[0], int64(len(data))):]
		if r[1] >= 0 && int64(len(want)) > r[1] {
			want = want[:r[1]]
		}
		if got := read(t, ctx, s, p+"r", r[0], r[1]); !bytes.Equal(got, want) {
			t.Fatalf("range %v: got %d bytes, want %d (equal prefix: %v)", r, len(got), len(want), len(got) > 0 && len(want) > 0 && got[0] == want[0])
		}
	}
	if _, info, err := s.Get(ctx, p+"r", 100, 10); err != nil || info.Size != int64(len(data)) {
		t.Fatalf("a ranged get describes the whole object: %+v %v", info, err)
	}
}

func wrongChecksum(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	other := sum([]byte("something else"))
	for _, n := range []int64{100, 20 << 20} { // one request; several parts
		for _, size := range []int64{n, -1} {
			key := p + "bad"
			_, err := s.Put(ctx, key, newPattern(n), blobs.PutOptions{Size: size, SHA256: other})
			if !errors.Is(err, blobs.ErrDigestMismatch) {
				t.Fatalf("%d bytes (size %d) with a wrong digest: %v", n, size, err)
			}
			mustAbsent(t, ctx, s, key)
		}
	}
	// A wrong digest does not disturb the object already there.
	if _, err := s.Put(ctx, p+"keep", strings.NewReader("good"), blobs.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, p+"keep", strings.NewReader("evil"), blobs.PutOptions{SHA256: sum([]byte("good"))}); !errors.Is(err, blobs.ErrDigestMismatch) {
		t.Fatalf("overwrite with a wrong digest: %v", err)
	}
	if got := read(t, ctx, s, p+"keep", 0, -1); string(got) != "good" {
		t.Fatalf("object changed by a refused put: %q", got)
	}
	if _, err := s.Put(ctx, p+"x", strings.NewReader("x"), blobs.PutOptions{SHA256: "md5:abc"}); !errors.Is(err, blobs.ErrDigestMismatch) {
		t.Fatalf("malformed expected digest: %v", err)
	}
}

func wrongSize(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	if _, err := s.Put(ctx, p+"short", strings.NewReader("12345"), blobs.PutOptions{Size: 6}); !errors.Is(err, blobs.ErrDigestMismatch) {
		t.Fatalf("short stream: %v", err)
	}
	mustAbsent(t, ctx, s, p+"short")
	if _, err := s.Put(ctx, p+"long", strings.NewReader("1234567"), blobs.PutOptions{Size: 6}); !errors.Is(err, blobs.ErrDigestMismatch) {
		t.Fatalf("long stream: %v", err)
	}
	mustAbsent(t, ctx, s, p+"long")
}

func tooLarge(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	if _, err := s.Put(ctx, p+"big", newPattern(1000), blobs.PutOptions{MaxBytes: 999}); !errors.Is(err, blobs.ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	mustAbsent(t, ctx, s, p+"big")
	if _, err := s.Put(ctx, p+"big", newPattern(1000), blobs.PutOptions{Size: 1000, MaxBytes: 999}); !errors.Is(err, blobs.ErrTooLarge) {
		t.Fatalf("declared over the limit: %v", err)
	}
	if _, err := s.Put(ctx, p+"fits", newPattern(1000), blobs.PutOptions{MaxBytes: 1000}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
}

// failingReader yields n bytes of a pattern, then fails.
type failingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

var errCut = errors.New("connection cut")

func interrupted(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	for _, size := range []int64{40 << 20, -1} {
		key := p + "cut"
		_, err := s.Put(ctx, key, &failingReader{r: newPattern(40 << 20), n: 25 << 20, err: errCut}, blobs.PutOptions{Size: size})
		if err == nil {
			t.Fatalf("an upload cut at 25 of 40 MiB (size %d) succeeded", size)
		}
		mustAbsent(t, ctx, s, key)
		var seen []string
		if err := s.List(ctx, p, func(i blobs.Info) error { seen = append(seen, i.Key); return nil }); err != nil || len(seen) != 0 {
			t.Fatalf("after a cut upload the prefix lists %v (%v)", seen, err)
		}
	}
}

func cancelled(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	cctx, cancel := context.WithCancel(ctx)
	r := &failingReader{r: newPattern(30 << 20), n: 20 << 20}
	r.err = errCut
	// Cancel once 20 MiB went in: the reader blocks on nothing, so cancel
	// from inside it.
	cr := readFunc(func(b []byte) (int, error) {
		n, err := r.Read(b)
		if r.n <= 0 {
			cancel()
			return n, cctx.Err()
		}
		return n, err
	})
	if _, err := s.Put(cctx, p+"c", cr, blobs.PutOptions{Size: 30 << 20}); err == nil {
		t.Fatal("a cancelled upload succeeded")
	}
	mustAbsent(t, ctx, s, p+"c")
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(b []byte) (int, error) { return f(b) }

func listDelete(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	keys := []string{p + "a/1", p + "a/2", p + "ab/1", p + "b/x/y"}
	for _, k := range keys {
		if _, err := s.Put(ctx, k, strings.NewReader(k), blobs.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(prefix string) []string {
		var out []string
		if err := s.List(ctx, prefix, func(i blobs.Info) error {
			if i.Size != int64(len(i.Key)) {
				t.Errorf("%s lists %d bytes", i.Key, i.Size)
			}
			out = append(out, i.Key)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := strings.Join(list(p), ","); got != strings.Join(keys, ",") {
		t.Fatalf("list %s = %s", p, got)
	}
	if got := strings.Join(list(p+"a/"), ","); got != p+"a/1,"+p+"a/2" {
		t.Fatalf("list a/ = %s", got)
	}
	if got := strings.Join(list(p+"a"), ","); got != p+"a/1,"+p+"a/2,"+p+"ab/1" {
		t.Fatalf("list a = %s", got)
	}
	stop := errors.New("stop")
	n := 0
	if err := s.List(ctx, p, func(blobs.Info) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("List did not stop at fn's error: %v after %d", err, n)
	}
	if err := s.Delete(ctx, p+"a/1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, p+"a/1"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	mustAbsent(t, ctx, s, p+"a/1")
	for _, bad := range []string{"", "/abs", "a/../b", "a//b", "./a", "a/", "a\\b", "a\x00b"} {
		if _, err := s.Put(ctx, bad, strings.NewReader("x"), blobs.PutOptions{}); !errors.Is(err, blobs.ErrBadKey) {
			t.Errorf("put %q: %v", bad, err)
		}
		if _, err := s.Stat(ctx, bad); !errors.Is(err, blobs.ErrBadKey) {
			t.Errorf("stat %q: %v", bad, err)
		}
	}
}

func large(t *testing.T, ctx context.Context, s blobs.Store, p string) {
	const n = 200 << 20
	want, _ := digestOf(t, newPattern(n))
	info, err := s.Put(ctx, p+"large", newPattern(n), blobs.PutOptions{Size: n, SHA256: want})
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != n || info.SHA256 != want {
		t.Fatalf("put %+v", info)
	}
	rc, _, err := s.Get(ctx, p+"large", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	got, gotN := digestOf(t, rc)
	rc.Close()
	if got != want || gotN != n {
		t.Fatalf("read back %s (%d bytes), want %s", got, gotN, want)
	}
	// A range across a part boundary (parts are 16 MiB on S3).
	ref := make([]byte, 64<<10)
	pat := newPattern(n)
	_, _ = io.CopyN(io.Discard, pat, 16<<20-32<<10)
	_, _ = io.ReadFull(pat, ref)
	if got := read(t, ctx, s, p+"large", 16<<20-32<<10, 64<<10); !bytes.Equal(got, ref) {
		t.Fatalf("range across a part boundary differs (%d bytes)", len(got))
	}
}
