package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/berthhq/berth/core/blobs"
)

// S3Config says how [UploadS3] reaches an S3-compatible object store
// (docs/operating.md section 5.1). Credentials come from the environment only
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN),
// never from flags, which process listings show.
type S3Config struct {
	Endpoint string // host[:port] of the S3 API; required
	Region   string // empty: the store's default
	Insecure bool   // plain HTTP (a loopback test server); default HTTPS
}

// ParseS3URL splits "s3://BUCKET/KEY" into its bucket and key; the key must not be empty
// and the URL must carry nothing else.
func ParseS3URL(raw string) (bucket, key string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("backup: %q is not s3://BUCKET/KEY", raw)
	}
	key = strings.TrimPrefix(u.Path, "/")
	if key == "" || strings.HasSuffix(key, "/") {
		return "", "", fmt.Errorf("backup: %q names no object key", raw)
	}
	return u.Host, key, nil
}

// UploadS3 uploads the archive file at path to bucket/key through the blob
// store's S3 backend (multipart, checksums, retries) and checks that the
// stored object has the file's size and SHA-256. The bucket must exist. A
// failed upload leaves no object under key.
func UploadS3(ctx context.Context, cfg S3Config, path, bucket, key string) error {
	st, err := s3Store(cfg, bucket)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	info, err := st.Put(ctx, key, f, blobs.PutOptions{Size: fi.Size(), ContentType: "application/gzip"})
	if err != nil {
		return fmt.Errorf("backup: upload to s3://%s/%s: %w", bucket, key, err)
	}
	got, err := st.Stat(ctx, key)
	if err != nil {
		return fmt.Errorf("backup: check s3://%s/%s: %w", bucket, key, err)
	}
	if got.Size != info.Size {
		return fmt.Errorf("backup: s3://%s/%s holds %d bytes, the archive has %d", bucket, key, got.Size, info.Size)
	}
	return nil
}

// DownloadS3 copies bucket/key into a new file at path (0600, fsynced) and
// checks that it got the object's whole size. It writes nothing else; the
// caller restores from path, which [Restore] verifies in full.
func DownloadS3(ctx context.Context, cfg S3Config, bucket, key, path string) error {
	st, err := s3Store(cfg, bucket)
	if err != nil {
		return err
	}
	obj, info, err := st.Get(ctx, key, 0, -1)
	if err != nil {
		return fmt.Errorf("backup: download s3://%s/%s: %w", bucket, key, err)
	}
	defer obj.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	n, err := io.Copy(f, obj)
	if err == nil {
		err = f.Sync()
	}
	if errC := f.Close(); err == nil {
		err = errC
	}
	if err == nil && n != info.Size {
		err = fmt.Errorf("got %d of %d bytes", n, info.Size)
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("backup: download s3://%s/%s: %w", bucket, key, err)
	}
	return nil
}

func s3Store(cfg S3Config, bucket string) (*blobs.S3, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("backup: an s3:// location needs the S3 endpoint")
	}
	st, err := blobs.NewS3(blobs.S3Config{Endpoint: cfg.Endpoint, Bucket: bucket, Region: cfg.Region, Insecure: cfg.Insecure})
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return st, nil
}
