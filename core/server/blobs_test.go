package server

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

// TestOpenBlobsMovesLocalBundlesToS3 starts the blob store of a core that
// had bundles on disk and is now configured for S3: a bundle stays readable
// throughout and ends up in the bucket only.
func TestOpenBlobsMovesLocalBundlesToS3(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	local, err := blobs.NewFS(dir + "/blobs")
	if err != nil {
		t.Fatal(err)
	}
	body := "an old bundle"
	sum := sha256.Sum256([]byte(body))
	key := "sha256/" + hex.EncodeToString(sum[:])
	if _, err := local.Put(ctx, key, strings.NewReader(body), blobs.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := s3test.Start(t)
	s3cfg := blobs.S3Config{Endpoint: srv.Addr, Bucket: srv.Bucket(t, "core"), Insecure: true, AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey}
	if err := checkS3Config(blobs.S3Config{Endpoint: srv.Addr}); err == nil {
		t.Fatal("an endpoint without a bucket was accepted")
	}
	if err := checkS3Config(blobs.S3Config{Bucket: "b"}); err == nil {
		t.Fatal("a bucket without an endpoint was accepted")
	}
	st, stop, err := openBlobs(ctx, Config{DataDir: dir, S3: s3cfg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rc, _, err := st.Get(ctx, key, 0, -1)
	if err != nil {
		t.Fatalf("the bundle is unreadable while it moves: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != body {
		t.Fatalf("read %q", b)
	}
	direct, err := blobs.NewS3(s3cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, inS3 := direct.Stat(ctx, key)
		_, onDisk := local.Stat(ctx, key)
		if inS3 == nil && errors.Is(onDisk, blobs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not moved after 30 s: in S3 %v, on disk %v", inS3, onDisk)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
