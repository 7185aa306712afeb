package backup

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/berthhq/berth/internal/s3test"
)

func TestBackupUploadedToS3RoundTrips(t *testing.T) {
	const access, secret = s3test.AccessKey, s3test.SecretKey
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := s3test.Start(t)
	addr := srv.Addr
	t.Setenv("AWS_ACCESS_KEY_ID", access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	cl := srv.Client(t)
	srv.Bucket(t, "backups")

	c := newLiveCore(t)
	c.insert(t, "services", "svc_a")
	path, _ := backupTo(t, c, Options{})
	cfg := S3Config{Endpoint: addr, Insecure: true}
	if err := UploadS3(ctx, cfg, path, "backups", "core/2026-12-01.backup"); err != nil {
		t.Fatal(err)
	}
	obj, err := cl.GetObject(ctx, "backups", "core/2026-12-01.backup", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(path)
	if !bytes.Equal(got, want) {
		t.Fatalf("the stored object (%d bytes) differs from the archive (%d bytes)", len(got), len(want))
	}
	if _, err := Verify(bytes.NewReader(got)); err != nil {
		t.Fatal(err)
	}

	// Downloaded again, it restores.
	dl := filepath.Join(t.TempDir(), "downloaded.backup")
	if err := DownloadS3(ctx, cfg, "backups", "core/2026-12-01.backup", dl); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, dl, RestoreOptions{DataDir: filepath.Join(t.TempDir(), "restored")}); err != nil {
		t.Fatal(err)
	}
	if err := DownloadS3(ctx, cfg, "backups", "core/absent", filepath.Join(t.TempDir(), "x")); err == nil {
		t.Error("a download of a missing object succeeded")
	}

	if err := UploadS3(ctx, cfg, path, "no-such-bucket", "x"); err == nil {
		t.Error("an upload to a missing bucket succeeded")
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	if err := UploadS3(ctx, cfg, path, "backups", "core/bad-credentials"); err == nil {
		t.Error("an upload with a wrong secret succeeded")
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	if err := UploadS3(ctx, cfg, path, "backups", "core/no-credentials"); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("err = %v, want one naming the missing credentials", err)
	}
}

func TestParseS3URL(t *testing.T) {
	b, k, err := ParseS3URL("s3://backups/berthd/2026-12-01.backup")
	if err != nil || b != "backups" || k != "berthd/2026-12-01.backup" {
		t.Fatalf("%q %q %v", b, k, err)
	}
	for _, bad := range []string{"s3://backups", "s3://backups/", "s3:///key", "http://b/k", "s3://u:p@b/k", "s3://b/k?x=1", "s3://b/dir/"} {
		if _, _, err := ParseS3URL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
