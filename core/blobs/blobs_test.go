package blobs_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/blobs/blobstest"
	"github.com/berthhq/berth/internal/s3test"
)

func TestFS(t *testing.T) {
	blobstest.Run(t, func(t *testing.T) blobs.Store {
		s, err := blobs.NewFS(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t, "blobs")
	blobstest.Run(t, func(t *testing.T) blobs.Store {
		s, err := blobs.NewS3(blobs.S3Config{Endpoint: srv.Addr, Bucket: bucket, Insecure: true,
			AccessKeyID: s3test.AccessKey, SecretAccessKey: s3test.SecretKey, Prefix: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestFSLeavesNoTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".incoming"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".incoming", "put-left"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.NewFS(dir); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, ".incoming"))
	if len(ents) != 0 {
		t.Fatalf("a restart kept %d temporary files", len(ents))
	}
}
