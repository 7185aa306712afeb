package backup

import (
	"archive/tar"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 archive layout (docs/backups.md section 3.3): a POSIX tar stream whose
// first entry is s3FormatEntry (holding "berth-s3-archive 1"), then one
// entry per object named s3ObjectPrefix + key with PAX records of its ETag
// and content type, in key order, then s3EndEntry (a JSON object with the
// object count and bytes). An archive without the end entry is truncated.
const (
	s3FormatEntry  = "berth-s3-archive"
	s3FormatValue  = "berth-s3-archive 1\n"
	s3ObjectPrefix = "objects/"
	s3EndEntry     = "end.json"
	paxETag        = "BERTH.etag"
	paxContentType = "BERTH.content_type"
)

// S3 is the engine of one S3 endpoint, reached with keys that may create,
// list, read, write and delete buckets (docs/backups.md section 3.3).
type S3 struct {
	Endpoint  string // host:port
	AccessKey string
	SecretKey string
	Region    string // empty: the server's default
	Secure    bool   // reports whether the endpoint speaks HTTPS
}

var _ Engine = (*S3)(nil)

// Kind implements Engine.
func (s *S3) Kind() Kind { return KindS3 }

func (s *S3) client() (*minio.Client, error) {
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Secure: s.Secure, Region: s.Region})
	if err != nil {
		return nil, fmt.Errorf("s3 client of %s: %w", s.Endpoint, err)
	}
	return c, nil
}

type s3End struct {
	Objects int64 `json:"objects"`
	Bytes   int64 `json:"bytes"`
}

// Backup implements Engine: it lists the bucket and copies every object
// into the archive, hashing each with MD5 as it passes.
func (s *S3) Backup(ctx context.Context, bucket string, w io.Writer) (Figures, error) {
	c, err := s.client()
	if err != nil {
		return Figures{}, err
	}
	tw := tar.NewWriter(w)
	if err := writeTarFile(tw, s3FormatEntry, []byte(s3FormatValue)); err != nil {
		return Figures{}, err
	}
	fig := Figures{Kind: KindS3, Items: []Item{}}
	var end s3End
	for obj := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			return Figures{}, fmt.Errorf("list bucket %s: %w", bucket, s3Err(obj.Err))
		}
		it, err := s.copyOut(ctx, c, tw, bucket, obj)
		if err != nil {
			return Figures{}, err
		}
		fig.Items = append(fig.Items, it)
		end.Objects++
		end.Bytes += it.Count
	}
	b, _ := json.Marshal(end)
	if err := writeTarFile(tw, s3EndEntry, b); err != nil {
		return Figures{}, err
	}
	if err := tw.Close(); err != nil {
		return Figures{}, err
	}
	sortItems(fig.Items)
	return fig, nil
}

func (s *S3) copyOut(ctx context.Context, c *minio.Client, tw *tar.Writer, bucket string, obj minio.ObjectInfo) (Item, error) {
	rc, err := c.GetObject(ctx, bucket, obj.Key, minio.GetObjectOptions{})
	if err != nil {
		return Item{}, fmt.Errorf("read object %s/%s: %w", bucket, obj.Key, s3Err(err))
	}
	defer rc.Close()
	st, err := rc.Stat()
	if err != nil {
		return Item{}, fmt.Errorf("stat object %s/%s: %w", bucket, obj.Key, s3Err(err))
	}
	if st.Size != obj.Size {
		return Item{}, fmt.Errorf("object %s/%s changed while listed (%d then %d bytes)", bucket, obj.Key, obj.Size, st.Size)
	}
	etag := strings.Trim(obj.ETag, `"`)
	hdr := &tar.Header{Name: s3ObjectPrefix + obj.Key, Size: obj.Size, Mode: 0o644, ModTime: obj.LastModified.UTC(),
		Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		PAXRecords: map[string]string{paxETag: etag, paxContentType: st.ContentType}}
	if err := tw.WriteHeader(hdr); err != nil {
		return Item{}, err
	}
	h := md5.New()
	n, err := io.Copy(tw, io.TeeReader(rc, h))
	if err != nil {
		return Item{}, fmt.Errorf("copy object %s/%s: %w", bucket, obj.Key, s3Err(err))
	}
	if n != obj.Size {
		return Item{}, fmt.Errorf("object %s/%s changed while copied (%d of %d bytes)", bucket, obj.Key, n, obj.Size)
	}
	return Item{Name: obj.Key, Count: n, Digest: "md5:" + hex.EncodeToString(h.Sum(nil)), ETag: etag}, nil
}

func writeTarFile(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(b)), Mode: 0o644, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

// Restore implements Engine: every object of the archive is written into
// the bucket (an existing object of the same key is replaced, with or
// without Clean; objects the archive does not hold are left alone).
func (s *S3) Restore(ctx context.Context, bucket string, r io.Reader, _ RestoreOptions) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != s3FormatEntry {
		return fmt.Errorf("s3 archive header: %w", ErrArchiveInvalid)
	}
	if b, err := io.ReadAll(io.LimitReader(tr, 64)); err != nil || string(b) != s3FormatValue {
		if err == nil && strings.HasPrefix(string(b), "berth-s3-archive ") {
			return fmt.Errorf("s3 archive version %q: %w", strings.TrimSpace(string(b)), ErrVersionMismatch)
		}
		return fmt.Errorf("s3 archive header: %w", ErrArchiveInvalid)
	}
	var got s3End
	for {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("s3 archive ends before its end entry: %w: %w", ErrArchiveInvalid, err)
		}
		switch {
		case hdr.Name == s3EndEntry:
			var want s3End
			b, err := io.ReadAll(io.LimitReader(tr, 4096))
			if err != nil || json.Unmarshal(b, &want) != nil || want != got {
				return fmt.Errorf("s3 archive end entry says %+v, read %+v: %w", want, got, ErrArchiveInvalid)
			}
			return nil
		case strings.HasPrefix(hdr.Name, s3ObjectPrefix) && hdr.Typeflag == tar.TypeReg:
			key := strings.TrimPrefix(hdr.Name, s3ObjectPrefix)
			body := &readErr{r: tr}
			if _, err := c.PutObject(ctx, bucket, key, body, hdr.Size, minio.PutObjectOptions{ContentType: hdr.PAXRecords[paxContentType]}); err != nil {
				if body.err != nil || errors.Is(err, io.ErrUnexpectedEOF) {
					return fmt.Errorf("s3 archive object %s: %w: %w", key, ErrArchiveInvalid, err)
				}
				return fmt.Errorf("write object %s/%s: %w", bucket, key, s3Err(err))
			}
			got.Objects++
			got.Bytes += hdr.Size
		default:
			return fmt.Errorf("s3 archive entry %q: %w", hdr.Name, ErrArchiveInvalid)
		}
	}
}

// Measure implements Engine: the object count, sizes and content MD5s (the
// ETag where it is a plain MD5, else the object's bytes hashed).
func (s *S3) Measure(ctx context.Context, bucket string) (Figures, error) {
	c, err := s.client()
	if err != nil {
		return Figures{}, err
	}
	fig := Figures{Kind: KindS3, Items: []Item{}}
	for obj := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			return Figures{}, fmt.Errorf("list bucket %s: %w", bucket, s3Err(obj.Err))
		}
		etag := strings.Trim(obj.ETag, `"`)
		digest := ""
		if len(etag) == 32 && isHex(etag) {
			digest = "md5:" + etag
		} else {
			rc, err := c.GetObject(ctx, bucket, obj.Key, minio.GetObjectOptions{})
			if err != nil {
				return Figures{}, fmt.Errorf("read object %s/%s: %w", bucket, obj.Key, s3Err(err))
			}
			h := md5.New()
			_, err = io.Copy(h, rc)
			rc.Close()
			if err != nil {
				return Figures{}, fmt.Errorf("read object %s/%s: %w", bucket, obj.Key, s3Err(err))
			}
			digest = "md5:" + hex.EncodeToString(h.Sum(nil))
		}
		fig.Items = append(fig.Items, Item{Name: obj.Key, Count: obj.Size, Digest: digest, ETag: etag})
	}
	sortItems(fig.Items)
	return fig, nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// Create implements Engine.
func (s *S3) Create(ctx context.Context, bucket string) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		code := minio.ToErrorResponse(err).Code
		if code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			return fmt.Errorf("bucket %s: %w", bucket, ErrExists)
		}
		return fmt.Errorf("create bucket %s: %w", bucket, s3Err(err))
	}
	return nil
}

// Drop implements Engine: it deletes every object and then the bucket.
func (s *S3) Drop(ctx context.Context, bucket string) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	for obj := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			if minio.ToErrorResponse(obj.Err).Code == "NoSuchBucket" {
				return nil
			}
			return fmt.Errorf("list bucket %s: %w", bucket, s3Err(obj.Err))
		}
		if err := c.RemoveObject(ctx, bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
			return fmt.Errorf("delete object %s/%s: %w", bucket, obj.Key, s3Err(err))
		}
	}
	if err := c.RemoveBucket(ctx, bucket); err != nil && minio.ToErrorResponse(err).Code != "NoSuchBucket" {
		return fmt.Errorf("delete bucket %s: %w", bucket, s3Err(err))
	}
	return nil
}

// s3Err marks transport failures and server errors as ErrUnreachable and
// leaves the server's refusals as they are.
func s3Err(err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.StatusCode == 0 || resp.StatusCode >= 500 {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

// readErr remembers the first error other than io.EOF its reader returned,
// so a truncated archive is told apart from a failing server after the S3
// client has wrapped the error.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}
