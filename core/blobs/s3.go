package blobs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthhq/berth/internal/securefile"
)

// DefaultPartSize is the multipart part size of [S3] Puts: 16 MiB. An
// object of unknown length may then reach 160 GiB (10,000 parts); memory
// per Put is a few parts.
const DefaultPartSize = 16 << 20

// S3Config says how [NewS3] reaches an S3-compatible bucket
// (docs/operating.md section 10).
type S3Config struct {
	// Endpoint is host[:port] of the S3 API; required.
	Endpoint string
	// Bucket holds every object; required, and it must exist.
	Bucket string
	// Region of the bucket; empty: the server's default.
	Region string
	// Insecure speaks plain HTTP (loopback test servers); default HTTPS.
	Insecure bool
	// Prefix is prepended to every key ("berth/"); empty: none.
	Prefix string
	// AccessKeyID and SecretAccessKey are the credentials. Empty: from
	// CredentialsFile when set, else from the environment
	// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
	AccessKeyID, SecretAccessKey string
	// CredentialsFile is a 0600 file in the AWS shared-credentials form
	// (aws_access_key_id = ..., aws_secret_access_key = ...); refused when
	// group- or world-readable or a symlink.
	CredentialsFile string
	// PartSize in bytes of multipart uploads; zero: DefaultPartSize.
	PartSize uint64
	// Logger receives one line per failed call to the backend; nil: discard.
	Logger *slog.Logger
}

// S3 is a [Store] in an S3 bucket through minio-go: multipart uploads for
// objects over PartSize (aborted on any error, so no partial object is ever
// visible), CRC32C checksums sent with every part and checked by the server,
// the library's retries with backoff, and the SHA-256 of the whole stream
// checked before the upload completes.
type S3 struct {
	c   *minio.Client
	cfg S3Config
	log *slog.Logger
}

var _ Store = (*S3)(nil)

// NewS3 returns a Store on cfg's bucket. It checks the configuration and
// credentials but does not contact the server (see [S3.Check]).
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("blob store: S3 needs an endpoint and a bucket")
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.PartSize == 0 {
		cfg.PartSize = DefaultPartSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	creds, err := s3Credentials(cfg)
	if err != nil {
		return nil, err
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{Creds: creds, Secure: !cfg.Insecure, Region: cfg.Region})
	if err != nil {
		return nil, fmt.Errorf("blob store: S3 client: %w", err)
	}
	return &S3{c: c, cfg: cfg, log: cfg.Logger}, nil
}

func s3Credentials(cfg S3Config) (*credentials.Credentials, error) {
	id, secret, token, err := resolveCredentials(cfg)
	if err != nil {
		return nil, err
	}
	return credentials.NewStaticV4(id, secret, token), nil
}

// ResolveCredentials returns the access key id and secret cfg names: its
// fields, else its credentials file, else the environment (see
// [S3Config]). Other S3 clients of the same bucket (the registry's storage
// driver) use it so that every part of berthd reads them one way.
func ResolveCredentials(cfg S3Config) (id, secret string, err error) {
	id, secret, _, err = resolveCredentials(cfg)
	return id, secret, err
}

func resolveCredentials(cfg S3Config) (id, secret, token string, err error) {
	id, secret = cfg.AccessKeyID, cfg.SecretAccessKey
	switch {
	case id != "" || secret != "":
	case cfg.CredentialsFile != "":
		raw, err := securefile.ReadFile(cfg.CredentialsFile)
		if err != nil {
			return "", "", "", fmt.Errorf("blob store: S3 credentials file: %w", err)
		}
		id, secret, token = parseCredentials(raw)
	default:
		id, secret, token = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_SESSION_TOKEN")
	}
	if id == "" || secret == "" {
		return "", "", "", errors.New("blob store: S3 needs credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, or a 0600 credentials file")
	}
	return id, secret, token, nil
}

// parseCredentials reads the first profile of an AWS shared-credentials file.
func parseCredentials(raw []byte) (id, secret, token string) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	seen := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			if seen++; seen > 1 {
				break
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "aws_access_key_id":
			id = strings.TrimSpace(v)
		case "aws_secret_access_key":
			secret = strings.TrimSpace(v)
		case "aws_session_token":
			token = strings.TrimSpace(v)
		}
	}
	return id, secret, token
}

// Bucket is the bucket the store writes to.
func (s *S3) Bucket() string { return s.cfg.Bucket }

// Check reports whether the bucket is reachable with the credentials:
// ErrUnavailable when the server cannot be reached, another error when the
// bucket is missing or access is denied.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return s.fail("check bucket", "", err)
	}
	if !ok {
		return fmt.Errorf("blob store: S3 bucket %q does not exist", s.cfg.Bucket)
	}
	return nil
}

func (s *S3) objectKey(key string) (string, error) {
	if !ValidKey(key) {
		return "", fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	return s.cfg.Prefix + key, nil
}

// fail maps a minio error onto the package's errors, logging what the
// backend said when it is unreachable (the clear line an operator needs;
// callers see ErrUnavailable and do not log it again).
func (s *S3) fail(op, key string, err error) error {
	if errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrTooLarge) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchKey || resp.StatusCode == 404 && resp.Code != minio.NoSuchBucket:
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	case resp.StatusCode >= 500 || resp.Code == "" && isNetErr(err):
		s.log.Error("S3 blob store unavailable", "op", op, "key", key, "endpoint", s.cfg.Endpoint, "bucket", s.cfg.Bucket, "err", err)
		return fmt.Errorf("%s %s: %w: %w", op, key, ErrUnavailable, err)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func isNetErr(err error) bool {
	var ne net.Error
	var ue *url.Error
	return errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Put implements [Store.Put]. The checks run as the last byte is read, before
// minio-go completes the upload; a failed check aborts it.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, opt PutOptions) (Info, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return Info{}, err
	}
	cr, err := newCheckingReader(r, opt)
	if err != nil {
		return Info{}, err
	}
	size := int64(-1)
	if opt.Size > 0 {
		size = opt.Size
	}
	po := minio.PutObjectOptions{PartSize: s.cfg.PartSize, ContentType: opt.ContentType}
	if po.ContentType == "" {
		po.ContentType = "application/octet-stream"
	}
	if cr.want != "" {
		po.UserMetadata = map[string]string{"Sha256": cr.want}
	}
	up, err := s.c.PutObject(ctx, s.cfg.Bucket, k, cr, size, po)
	if err != nil {
		if cr.err != nil {
			err = cr.err
		}
		return Info{}, s.fail("put", key, err)
	}
	digest, n, err := cr.done()
	if err != nil {
		// minio-go completed an upload the checks refused: never keep it.
		if derr := s.c.RemoveObject(context.WithoutCancel(ctx), s.cfg.Bucket, k, minio.RemoveObjectOptions{}); derr != nil {
			s.log.Error("S3 blob store: could not remove a refused object", "key", key, "err", derr)
		}
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if up.Size != n {
		return Info{}, fmt.Errorf("put %s: the store holds %d bytes, %d were sent: %w", key, up.Size, n, ErrUnavailable)
	}
	return Info{Key: key, Size: n, SHA256: digest, ModTime: up.LastModified.UTC()}, nil
}

// Get implements [Store.Get].
func (s *S3) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, Info, error) {
	info, err := s.Stat(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	k, _ := s.objectKey(key)
	if off < 0 {
		off = 0
	}
	if off >= info.Size || length == 0 {
		return io.NopCloser(strings.NewReader("")), info, nil
	}
	var gopt minio.GetObjectOptions
	if off > 0 || length > 0 {
		end := int64(-1)
		if length > 0 && off+length < info.Size {
			end = off + length - 1
		}
		if end < 0 {
			end = info.Size - 1
		}
		if err := gopt.SetRange(off, end); err != nil {
			return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
		}
	}
	obj, err := s.c.GetObject(ctx, s.cfg.Bucket, k, gopt)
	if err != nil {
		return nil, Info{}, s.fail("get", key, err)
	}
	return obj, info, nil
}

// Stat implements [Store.Stat].
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	k, err := s.objectKey(key)
	if err != nil {
		return Info{}, err
	}
	st, err := s.c.StatObject(ctx, s.cfg.Bucket, k, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.fail("stat", key, err)
	}
	info := Info{Key: key, Size: st.Size, ModTime: st.LastModified.UTC()}
	if d, ok := normalDigest(st.UserMetadata["Sha256"]); ok {
		info.SHA256 = d
	}
	return info, nil
}

// Delete implements [Store.Delete].
func (s *S3) Delete(ctx context.Context, key string) error {
	k, err := s.objectKey(key)
	if err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.cfg.Bucket, k, minio.RemoveObjectOptions{}); err != nil {
		if err := s.fail("delete", key, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// List implements [Store.List].
func (s *S3) List(ctx context.Context, prefix string, fn func(Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for o := range s.c.ListObjectsIter(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.cfg.Prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return s.fail("list", prefix, o.Err)
		}
		if err := fn(Info{Key: strings.TrimPrefix(o.Key, s.cfg.Prefix), Size: o.Size, ModTime: o.LastModified.UTC()}); err != nil {
			return err
		}
	}
	return nil
}
