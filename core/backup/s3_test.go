package backup

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthhq/berth/internal/proctest"
)

// versitygw finds the S3 server the tests run against (a real S3 API with
// signature checks, on a POSIX directory).
func versitygw(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("versitygw is not installed: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 (make test does)")
	return ""
}

func TestBackupUploadedToS3RoundTrips(t *testing.T) {
	const access, secret = "berthtest", "berthtestsecret"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := proctest.FreeAddr(t)
	srv := exec.Command(versitygw(t), "--access", access, "--secret", secret, "--port", addr, "posix", t.TempDir())
	srv.Stdout, srv.Stderr = io.Discard, io.Discard
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if i == 300 || ctx.Err() != nil {
			t.Fatalf("versitygw never listened on %s: %v", addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Setenv("AWS_ACCESS_KEY_ID", access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	cl, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(access, secret, "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.MakeBucket(ctx, "backups", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}

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
