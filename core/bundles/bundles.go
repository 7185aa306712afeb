// Package bundles stores release bundles: gzip tar archives content-addressed by
// SHA-256 in the blob store, with a per-project catalog of digests and names.
package bundles

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// DefaultMaxBytes is the default limit on a bundle's compressed size: 512 MiB.
const DefaultMaxBytes = 512 << 20

// Errors returned by [Store.Put] and [Store.Open].
var (
	ErrTooLarge       = errors.New("berth: bundle larger than the limit")
	ErrDigestMismatch = errors.New("berth: bundle does not hash to the claimed digest")
	ErrNotFound       = errors.New("berth: bundle not found")
	ErrBadDigest      = errors.New("berth: malformed digest")
)

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidDigest reports whether d has the form "sha256:<64 lower-case hex>".
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// Meta is one catalog entry: a bundle pushed to a project, optionally named.
type Meta struct {
	ID        string    `bson:"_id"` // project_id + "/" + digest
	ProjectID string    `bson:"project_id"`
	Project   string    `bson:"project"`
	Digest    string    `bson:"digest"`
	Size      int64     `bson:"size"`
	Name      string    `bson:"name,omitempty"`
	CreatedAt time.Time `bson:"created_at"`
	// LogOutbox holds this push's changes not yet in the change log,
	// written with the catalog entry (docs/node-protocol.md section 7.2).
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
}

// Store keeps bundle bytes in a [blobs.Store] under sha256/<hex> and the
// catalog in collection "bundles". An upload is spooled to a local file
// first: it must be hashed and validated as a whole before it is stored.
type Store struct {
	blobs    blobs.Store
	spoolDir string
	coll     *mongo.Collection
	maxBytes int64
}

// New returns a Store keeping blobs on the filesystem under dir (the layout
// berthd always used: dir/sha256/<hex>) and spooling uploads under
// dir/.incoming. maxBytes bounds a bundle's compressed size; zero means
// DefaultMaxBytes.
func New(dir string, coll *mongo.Collection, maxBytes int64) (*Store, error) {
	fs, err := blobs.NewFS(dir)
	if err != nil {
		return nil, err
	}
	return NewWithBlobs(fs, filepath.Join(dir, ".incoming"), coll, maxBytes)
}

// NewWithBlobs returns a Store keeping blobs in st (filesystem or S3) and
// spooling uploads in the local directory spoolDir (created 0700).
// maxBytes bounds a bundle's compressed size; zero means DefaultMaxBytes.
func NewWithBlobs(st blobs.Store, spoolDir string, coll *mongo.Collection, maxBytes int64) (*Store, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if err := os.MkdirAll(spoolDir, 0o700); err != nil {
		return nil, fmt.Errorf("create bundle spool directory: %w", err)
	}
	return &Store{blobs: st, spoolDir: spoolDir, coll: coll, maxBytes: maxBytes}, nil
}

// Blobs is the blob store the bundles live in.
func (s *Store) Blobs() blobs.Store { return s.blobs }

// MaxBytes is the limit on a bundle's compressed size in bytes.
func (s *Store) MaxBytes() int64 { return s.maxBytes }

// Key is the blob store key of digest ("sha256:<hex>").
func Key(digest string) string { return "sha256/" + strings.TrimPrefix(digest, "sha256:") }

// spooled is an upload received into a local temporary file.
type spooled struct{ *os.File }

func (f spooled) close() { f.Close(); os.Remove(f.Name()) }

// spool receives r (at most maxBytes) into a temporary file, hashing it.
func (s *Store) spool(ctx context.Context, want string, r io.Reader, maxBytes int64) (spooled, string, int64, error) {
	tmp, err := os.CreateTemp(s.spoolDir, "upload-*")
	if err != nil {
		return spooled{}, "", 0, fmt.Errorf("store bundle: %w", err)
	}
	f := spooled{tmp}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, maxBytes+1))
	if err != nil {
		f.close()
		return spooled{}, "", 0, fmt.Errorf("receive bundle: %w", err)
	}
	if n > maxBytes {
		f.close()
		return spooled{}, "", 0, ErrTooLarge
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if want != "" && want != digest {
		f.close()
		return spooled{}, "", 0, fmt.Errorf("%w: claimed %s, got %s", ErrDigestMismatch, want, digest)
	}
	if err := ctx.Err(); err != nil {
		f.close()
		return spooled{}, "", 0, fmt.Errorf("store bundle: %w", err)
	}
	return f, digest, n, nil
}

// store copies a spooled, checked upload into the blob store, skipping the
// copy when an object of that size is already there.
func (s *Store) store(ctx context.Context, f spooled, digest string, n int64) error {
	if info, err := s.blobs.Stat(ctx, Key(digest)); err == nil && info.Size == n {
		return nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("store bundle: %w", err)
	}
	if _, err := s.blobs.Put(ctx, Key(digest), f, blobs.PutOptions{Size: n, SHA256: digest, ContentType: "application/gzip"}); err != nil {
		return fmt.Errorf("store bundle: %w", mapBlobErr(err))
	}
	return nil
}

// Put reads a whole bundle from r, checks its size, that it is a safe gzip tar
// (bundle.Validate), and, when want is not empty, that it hashes to want. Only
// then is it stored and recorded for the project under name (may be empty).
// Errors: ErrTooLarge, ErrDigestMismatch, ErrBadDigest, or one wrapping
// bundle.ErrInvalid / bundle.ErrTooLarge, or blob store errors
// (blobs.ErrUnavailable). Put is idempotent: pushing the same bytes again
// returns the same Meta with the newer name and time.
func (s *Store) Put(ctx context.Context, projectID, project, name, want string, r io.Reader) (*Meta, error) {
	if want != "" && !ValidDigest(want) {
		return nil, ErrBadDigest
	}
	f, digest, n, err := s.spool(ctx, want, r, s.maxBytes)
	if err != nil {
		return nil, err
	}
	defer f.close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("store bundle: %w", err)
	}
	if err := bundle.Validate(ctx, f, 0); err != nil {
		return nil, fmt.Errorf("validate bundle: %w", err)
	}
	if err := s.store(ctx, f, digest, n); err != nil {
		return nil, err
	}
	m := &Meta{ID: projectID + "/" + digest, ProjectID: projectID, Project: project, Digest: digest, Size: n, Name: name, CreatedAt: time.Now().UTC()}
	update := bson.M{"$set": bson.M{"project_id": m.ProjectID, "project": m.Project, "digest": m.Digest, "size": m.Size, "name": m.Name, "created_at": m.CreatedAt}}
	if m.Name == "" {
		update["$unset"] = bson.M{"name": ""}
		delete(update["$set"].(bson.M), "name")
	}
	if a, ok := changelog.ActorFrom(ctx); ok {
		// The payload is the bundle as the API shows it; a change still
		// pending from an earlier push of the same bytes stays queued.
		pend, err := changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: "bundle", EntityID: m.ID, Op: node.OpCreate,
			Payload: client.Bundle{Digest: m.Digest, Size: m.Size, Name: m.Name, Project: m.Project, CreatedAt: m.CreatedAt}})
		if err != nil {
			return nil, fmt.Errorf("record bundle: %w", err)
		}
		update["$push"] = bson.M{changelog.OutboxField: pend}
		m.LogOutbox = []changelog.Pending{pend}
	}
	if _, err := s.coll.UpdateOne(ctx, bson.M{"_id": m.ID}, update, options.UpdateOne().SetUpsert(true)); err != nil {
		return nil, fmt.Errorf("record bundle: %w", err)
	}
	return m, nil
}

// Resolve returns the digest that ref names in the project: ref itself when it
// is a digest the project holds, or the newest bundle pushed with name ref.
func (s *Store) Resolve(ctx context.Context, projectID, ref string) (*Meta, error) {
	var m Meta
	var err error
	if strings.HasPrefix(ref, "sha256:") {
		err = s.coll.FindOne(ctx, bson.M{"_id": projectID + "/" + ref}).Decode(&m)
	} else {
		err = s.coll.FindOne(ctx, bson.M{"project_id": projectID, "name": ref},
			options.FindOne().SetSort(bson.D{{Key: "created_at", Value: -1}})).Decode(&m)
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("resolve bundle %q: %w", ref, err)
	}
	return &m, nil
}

// List returns a project's bundles, newest first.
func (s *Store) List(ctx context.Context, projectID string) ([]Meta, error) {
	cur, err := s.coll.Find(ctx, bson.M{"project_id": projectID}, options.Find().SetSort(bson.D{{Key: "created_at", Value: -1}}))
	if err != nil {
		return nil, fmt.Errorf("list bundles: %w", err)
	}
	var out []Meta
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list bundles: %w", err)
	}
	return out, nil
}

// Open returns the blob of digest for reading, and its size. The caller
// closes it; the reader is an io.ReadSeeker on both backends. Errors:
// ErrBadDigest, ErrNotFound, blob store errors.
func (s *Store) Open(ctx context.Context, digest string) (io.ReadCloser, int64, error) {
	if !ValidDigest(digest) {
		return nil, 0, ErrBadDigest
	}
	rc, info, err := s.blobs.Get(ctx, Key(digest), 0, -1)
	if err != nil {
		return nil, 0, fmt.Errorf("open bundle: %w", mapBlobErr(err))
	}
	return rc, info.Size, nil
}
