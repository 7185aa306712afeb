package bundles_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/sdk/bundle"
)

// TestBundlesOnEveryBlobStore pushes, resolves and reads a bundle with the
// filesystem and with S3 underneath, and checks that refused uploads store
// nothing.
func TestBundlesOnEveryBlobStore(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t, "bundles")
	stores := map[string]func(t *testing.T) blobs.Store{
		"fs": func(t *testing.T) blobs.Store {
			s, err := blobs.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"s3": func(t *testing.T) blobs.Store {
			s, err := blobs.NewS3(blobs.S3Config{Endpoint: srv.Addr, Bucket: bucket, Insecure: true, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey, Prefix: t.Name()})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			bs := open(t)
			st, err := bundles.NewWithBlobs(bs, t.TempDir(), storetest.Open(t).Collection("bundles"), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "run"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			digest, _, err := bundle.Create(ctx, dir, &buf)
			if err != nil {
				t.Fatal(err)
			}
			m, err := st.Put(ctx, "prj_1", "shop", "v1", digest, bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if m.Digest != digest || m.Size != int64(buf.Len()) {
				t.Fatalf("meta %+v", m)
			}
			if info, err := bs.Stat(ctx, bundles.Key(digest)); err != nil || info.Size != int64(buf.Len()) {
				t.Fatalf("the blob store holds %+v, %v", info, err)
			}
			r, err := st.Resolve(ctx, "prj_1", "v1")
			if err != nil || r.Digest != digest {
				t.Fatalf("resolve: %+v %v", r, err)
			}
			rc, size, err := st.Open(ctx, digest)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if size != int64(buf.Len()) || !bytes.Equal(got, buf.Bytes()) {
				t.Fatalf("read back %d bytes (size %d), want %d", len(got), size, buf.Len())
			}
			if _, ok := rc.(io.ReadSeeker); !ok {
				t.Errorf("Open's reader (%T) cannot seek: range downloads need it", rc)
			}

			// Not a gzip tar: refused, nothing stored.
			junk := []byte("not a bundle")
			if _, err := st.Put(ctx, "prj_1", "shop", "bad", "", bytes.NewReader(junk)); !errors.Is(err, bundle.ErrInvalid) {
				t.Fatalf("junk: %v", err)
			}
			if _, _, err := st.PutBlob(ctx, "sha256:"+strings.Repeat("0", 64), bytes.NewReader(junk), 100); !errors.Is(err, bundles.ErrDigestMismatch) {
				t.Fatalf("wrong digest: %v", err)
			}
			if _, _, err := st.PutBlob(ctx, "", bytes.NewReader(make([]byte, 101)), 100); !errors.Is(err, bundles.ErrTooLarge) {
				t.Fatalf("too large: %v", err)
			}
			n := 0
			if err := bs.List(ctx, "", func(blobs.Info) error { n++; return nil }); err != nil || n != 1 {
				t.Fatalf("the blob store holds %d objects (%v), want the one bundle", n, err)
			}
			if _, _, err := st.Open(ctx, "sha256:"+strings.Repeat("1", 64)); !errors.Is(err, bundles.ErrNotFound) {
				t.Fatalf("missing: %v", err)
			}
		})
	}
}
