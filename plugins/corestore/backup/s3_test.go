package backup_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/plugins/corestore/backup"
)

func s3Engine() *backup.S3 {
	return &backup.S3{Endpoint: s3srv.Addr, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey}
}

// seedBucket makes bucket with small objects under nested keys and one
// 20 MiB object the client uploads in parts (so its ETag is not an MD5).
func seedBucket(t *testing.T, ctx context.Context, bucket string) {
	t.Helper()
	e := s3Engine()
	if err := e.Create(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), bucket) })
	c := s3srv.Client(t)
	for i := range 20 {
		body := fmt.Sprintf("object %d says hello", i)
		if _, err := c.PutObject(ctx, bucket, fmt.Sprintf("dir%d/file-%02d.txt", i%3, i), strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{ContentType: "text/plain"}); err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, 20<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutObject(ctx, bucket, "big.bin", bytes.NewReader(big), -1, minio.PutObjectOptions{PartSize: 5 << 20}); err != nil {
		t.Fatal(err)
	}
}

// TestS3BackupRestore copies a bucket into an archive and back into a new
// bucket and checks object count, sizes and content digests, and one
// object's bytes and content type.
func TestS3BackupRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seedBucket(t, ctx, "files")
	e := s3Engine()
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "files", &archive)
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Items) != 21 {
		t.Fatalf("%d objects in the figures, want 21", len(fig.Items))
	}
	for _, it := range fig.Items {
		if it.Name == "big.bin" && !strings.Contains(it.ETag, "-") {
			t.Logf("big.bin ETag %q is not a multipart one", it.ETag)
		}
	}
	if err := e.Create(ctx, "files-copy"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "files-copy") })
	if err := e.Restore(ctx, "files-copy", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := e.Measure(ctx, "files-copy")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(fig, got); len(d) != 0 {
		t.Fatalf("restored bucket differs: %v", d)
	}
	obj, err := s3srv.Client(t).GetObject(ctx, "files-copy", "dir1/file-07.txt", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(obj)
	st, _ := obj.Stat()
	obj.Close()
	if err != nil || string(b) != "object 7 says hello" || st.ContentType != "text/plain" {
		t.Fatalf("dir1/file-07.txt = %q (%s), %v", b, st.ContentType, err)
	}
	if err := e.Create(ctx, "files-copy"); !errors.Is(err, backup.ErrExists) {
		t.Errorf("Create of an existing bucket: %v, want ErrExists", err)
	}
}

// TestS3RestoreRefusesDamagedArchiveAndDrills checks truncated archives are
// refused, a drill of the good archive passes and drops its bucket, and a
// drill of an archive with one altered object fails naming that object.
func TestS3RestoreRefusesDamagedArchiveAndDrills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seedBucket(t, ctx, "drillfiles")
	e := s3Engine()
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "drillfiles", &archive)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Create(ctx, "drill-target"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "drill-target") })
	b := archive.Bytes()
	for name, in := range map[string][]byte{"half": b[:len(b)/2], "no end entry": b[:len(b)-3072], "garbage": []byte("garbage")} {
		if err := e.Restore(ctx, "drill-target", bytes.NewReader(in), backup.RestoreOptions{}); !errors.Is(err, backup.ErrArchiveInvalid) {
			t.Errorf("%s: %v, want ErrArchiveInvalid", name, err)
		}
	}
	res, err := backup.Drill(ctx, e, bytes.NewReader(b), fig, "drill-scratch")
	if err != nil || !res.Passed || !res.Dropped {
		t.Fatalf("drill of a good archive: %+v, %v", res, err)
	}
	if ok, err := s3srv.Client(t).BucketExists(ctx, "drill-scratch"); err != nil || ok {
		t.Fatalf("scratch bucket exists=%v, %v after the drill", ok, err)
	}
	bad := corrupt(t, b, "object 13 says", "object 13 sayz")
	res, err = backup.Drill(ctx, e, bytes.NewReader(bad), fig, "drill-scratch")
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || len(res.Differences) != 1 || res.Differences[0].Name != "dir1/file-13.txt" {
		t.Fatalf("drill of a corrupted archive: passed=%v error=%q differences=%v", res.Passed, res.Error, res.Differences)
	}
}
