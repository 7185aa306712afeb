package corestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/signer"

	"github.com/berthhq/berth/abi/bindings"
)

// bucketMaxName is S3's bucket name limit.
const bucketMaxName = 63

// s3Store is the S3 backend: one bucket per binding and, with versitygw's
// admin API, one user (role "user") owning it, so the binding's key reaches
// its bucket only.
type s3Store struct {
	cfg    *S3Config
	client *minio.Client
	http   *http.Client
}

func newS3(cfg *S3Config) (*s3Store, error) {
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: cfg.Secure, Region: cfg.region(),
	})
	if err != nil {
		return nil, fmt.Errorf("s3 client: %w", err)
	}
	return &s3Store{cfg: cfg, client: c, http: &http.Client{Timeout: connectTimeout}}, nil
}

func (c *S3Config) region() string {
	if c.Region == "" {
		return "us-east-1"
	}
	return c.Region
}

func (c *S3Config) url() string {
	scheme := "http"
	if c.Secure {
		scheme = "https"
	}
	return scheme + "://" + c.Endpoint
}

func (s *s3Store) plan(_ context.Context, n names) (bindings.State, error) {
	st := bindings.State{Database: n.Database, Endpoint: s.cfg.url(), Users: bindings.UsersUnsupported}
	if s.cfg.AdminAPI {
		st.User, st.Users = n.User, bindings.UsersOwn
	}
	return st, nil
}

// s3Err maps a failure to reach the endpoint.
func s3Err(what string, err error) error {
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && resp.StatusCode != 0 {
		return fmt.Errorf("s3: %s: %w", what, err)
	}
	return unreachable("the S3 endpoint: "+what, err)
}

func (s *s3Store) ensure(ctx context.Context, n names, password string) error {
	ok, err := s.client.BucketExists(ctx, n.Database)
	if err != nil {
		return s3Err("bucket exists", err)
	}
	if !ok {
		err := s.client.MakeBucket(ctx, n.Database, minio.MakeBucketOptions{Region: s.cfg.region()})
		if err != nil && minio.ToErrorResponse(err).Code != "BucketAlreadyOwnedByYou" {
			return s3Err("make bucket "+n.Database, err)
		}
	}
	if !s.cfg.AdminAPI {
		return nil
	}
	type account struct {
		XMLName xml.Name `xml:"Account"`
		Access  string
		Secret  string
		Role    string
	}
	body, _ := xml.Marshal(account{Access: n.User, Secret: password, Role: "user"}) // plain struct: cannot fail
	err = s.admin(ctx, "/create-user", nil, body)
	if err != nil && strings.Contains(err.Error(), "XAdminUserExists") {
		type props struct {
			XMLName xml.Name `xml:"MutableProps"`
			Secret  string
			Role    string
		}
		body, _ := xml.Marshal(props{Secret: password, Role: "user"})
		err = s.admin(ctx, "/update-user", url.Values{"access": {n.User}}, body)
	}
	if err != nil {
		return fmt.Errorf("s3: user %s: %w", n.User, err)
	}
	if err := s.admin(ctx, "/change-bucket-owner/", url.Values{"bucket": {n.Database}, "owner": {n.User}}, nil); err != nil {
		return fmt.Errorf("s3: bucket %s owner: %w", n.Database, err)
	}
	return nil
}

// admin sends one signed PATCH of versitygw's admin API.
func (s *s3Store) admin(ctx context.Context, path string, q url.Values, body []byte) error {
	u := s.cfg.url() + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("admin %s: %w", path, err)
	}
	sum := sha256.Sum256(body)
	req.Header.Set("X-Amz-Content-Sha256", hex.EncodeToString(sum[:]))
	req = signer.SignV4(*req, s.cfg.AccessKey, s.cfg.SecretKey, "", s.cfg.region())
	resp, err := s.http.Do(req)
	if err != nil {
		return unreachable("the S3 admin API", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("admin %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

func (s *s3Store) exists(ctx context.Context, n names) (bool, error) {
	ok, err := s.client.BucketExists(ctx, n.Database)
	if err != nil {
		return false, s3Err("bucket exists", err)
	}
	return ok, nil
}

func (s *s3Store) purge(ctx context.Context, n names) error {
	ok, err := s.client.BucketExists(ctx, n.Database)
	if err != nil {
		return s3Err("bucket exists", err)
	}
	if ok {
		if s.cfg.AdminAPI {
			// Back to the admin, so its keys may empty and remove it.
			if err := s.admin(ctx, "/change-bucket-owner/", url.Values{"bucket": {n.Database}, "owner": {s.cfg.AccessKey}}, nil); err != nil {
				return fmt.Errorf("s3: bucket %s owner: %w", n.Database, err)
			}
		}
		for obj := range s.client.ListObjects(ctx, n.Database, minio.ListObjectsOptions{Recursive: true}) {
			if obj.Err != nil {
				return s3Err("list "+n.Database, obj.Err)
			}
			if err := s.client.RemoveObject(ctx, n.Database, obj.Key, minio.RemoveObjectOptions{}); err != nil {
				return s3Err("remove "+obj.Key, err)
			}
		}
		if err := s.client.RemoveBucket(ctx, n.Database); err != nil && minio.ToErrorResponse(err).Code != "NoSuchBucket" {
			return s3Err("remove bucket "+n.Database, err)
		}
	}
	if s.cfg.AdminAPI {
		if err := s.admin(ctx, "/delete-user", url.Values{"access": {n.User}}, nil); err != nil && !strings.Contains(err.Error(), "not found") {
			return fmt.Errorf("s3: delete user %s: %w", n.User, err)
		}
	}
	return nil
}

func (s *s3Store) list(ctx context.Context) ([]string, error) {
	all, err := s.client.ListBuckets(ctx)
	if err != nil {
		return nil, s3Err("list buckets", err)
	}
	var out []string
	for _, b := range all {
		if strings.HasPrefix(b.Name, "berth-") {
			out = append(out, b.Name)
		}
	}
	return out, nil
}

func (s *s3Store) credentials(st bindings.State, password string) map[string]string {
	out := map[string]string{"ENDPOINT": s.cfg.url(), "BUCKET": st.Database, "REGION": s.cfg.region()}
	u := url.URL{Scheme: "s3", Host: s.cfg.Endpoint, Path: "/" + st.Database}
	if st.Users == bindings.UsersOwn {
		out["ACCESS_KEY"], out["SECRET_KEY"] = st.User, password
		u.User = url.UserPassword(st.User, password)
	}
	out["URL"] = u.String()
	return out
}
