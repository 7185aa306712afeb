package blobs_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/internal/s3test"
)

// failAfter is a destination store whose Put fails after n successes, as a
// berthd stopped in the middle of a migration would.
type failAfter struct {
	blobs.Store
	n int
}

var errStopped = errors.New("process stopped")

func (f *failAfter) Put(ctx context.Context, key string, r io.Reader, opt blobs.PutOptions) (blobs.Info, error) {
	if f.n == 0 {
		// Half the object arrives, then the process dies.
		_, _ = io.CopyN(io.Discard, r, 3)
		return blobs.Info{}, errStopped
	}
	f.n--
	return f.Store.Put(ctx, key, r, opt)
}

func TestMigrateLocalBundlesIntoS3IsResumable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	local, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := s3test.Start(t)
	s3, err := blobs.NewS3(blobs.S3Config{Endpoint: srv.Addr, Bucket: srv.Bucket(t, "migrate"), Insecure: true,
		AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Check(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, body := range []string{"bundle one", "bundle two", "bundle three", "bundle four"} {
		h := sha256.Sum256([]byte(body))
		key := "sha256/" + hex.EncodeToString(h[:])
		if _, err := local.Put(ctx, key, strings.NewReader(body), blobs.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		want[key] = body
	}
	both := blobs.Fallback{Primary: s3, Secondary: local}

	// First pass dies on the third object.
	res, err := blobs.Migrate(ctx, local, &failAfter{Store: s3, n: 2}, "sha256/", nil)
	if !errors.Is(err, errStopped) || res.Moved != 2 {
		t.Fatalf("first pass: %+v %v", res, err)
	}
	// Meanwhile every bundle stays readable through the fallback.
	for key, body := range want {
		rc, _, err := both.Get(ctx, key, 0, -1)
		if err != nil {
			t.Fatalf("%s unreadable mid-migration: %v", key, err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != body {
			t.Fatalf("%s reads %q", key, b)
		}
	}
	// The resumed pass finishes without copying what moved.
	res, err = blobs.Migrate(ctx, local, s3, "sha256/", nil)
	if err != nil || res.Moved != 2 || res.Present != 0 {
		t.Fatalf("second pass: %+v %v", res, err)
	}
	for key, body := range want {
		rc, _, err := s3.Get(ctx, key, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != body {
			t.Fatalf("%s in S3 reads %q", key, b)
		}
		if _, err := local.Stat(ctx, key); !errors.Is(err, blobs.ErrNotFound) {
			t.Fatalf("%s still local after the move: %v", key, err)
		}
	}
	// A copy that landed in S3 but whose local file survived (death between
	// the copy and the delete) is recognised, not copied again.
	body := "bundle five"
	h := sha256.Sum256([]byte(body))
	key := "sha256/" + hex.EncodeToString(h[:])
	for _, st := range []blobs.Store{local, s3} {
		if _, err := st.Put(ctx, key, strings.NewReader(body), blobs.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := blobs.Migrate(ctx, local, s3, "sha256/", nil); err != nil || res.Present != 1 || res.Moved != 0 {
		t.Fatalf("third pass: %+v %v", res, err)
	}
	// A local file whose bytes do not hash to its name is refused and kept.
	bad := "sha256/" + strings.Repeat("ab", 32)
	if _, err := local.Put(ctx, bad, strings.NewReader("not that"), blobs.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Migrate(ctx, local, s3, "sha256/", nil); !errors.Is(err, blobs.ErrDigestMismatch) {
		t.Fatalf("corrupt file: %v", err)
	}
	if _, err := s3.Stat(ctx, bad); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("a corrupt file reached S3: %v", err)
	}
	if _, err := local.Stat(ctx, bad); err != nil {
		t.Fatalf("the corrupt local file was removed: %v", err)
	}
}
