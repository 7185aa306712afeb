// Package backup holds the Corestore provider's archive engines: it streams a
// PostgreSQL database, a MongoDB database or an S3 bucket into one archive,
// restores an archive into a live or scratch resource, and measures the
// verification figures a restore drill compares (docs/backups.md).
//
// The package never imports the core: the caller hands it connection
// settings and an io.Writer or io.Reader, and hashes and stores the bytes
// itself (docs/backups.md section 2).
package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// Kind names a resource kind an [Engine] archives.
type Kind string

// The kinds of docs/backups.md section 3.
const (
	KindPostgres Kind = "postgres" // one PostgreSQL database, pg_dump custom format
	KindMongoDB  Kind = "mongodb"  // one MongoDB database, the archive of section 3.2
	KindS3       Kind = "s3"       // one S3 bucket, a tar stream of its objects
)

// Item is one verification figure: a table, a collection or an object.
type Item struct {
	// Name is "schema.table" (PostgreSQL), the collection name (MongoDB) or
	// the object key (S3).
	Name string `json:"name"`
	// Count is rows (PostgreSQL), documents (MongoDB) or bytes (S3).
	Count int64 `json:"count"`
	// Digest is a content digest: "rowsum:<32 hex>" over the rows
	// (PostgreSQL, computed on the server), "sha256:<hex>" over the
	// documents in _id order (MongoDB), "md5:<hex>" of the object's bytes
	// (S3).
	Digest string `json:"digest"`
	// ETag is the object's ETag as the server listed it (S3 only).
	ETag string `json:"etag,omitempty"`
}

// Figures are what a backup recorded, or what a restored resource measures:
// its items sorted by name. Two figures of the same content compare equal
// with [Compare].
type Figures struct {
	Kind  Kind   `json:"kind"`
	Items []Item `json:"items"`
}

// Difference is one item whose figures differ: Want is nil for an item the
// restored resource holds that the backup did not, Got nil for one missing.
type Difference struct {
	Name string `json:"name"`
	Want *Item  `json:"want,omitempty"`
	Got  *Item  `json:"got,omitempty"`
}

// String says which item differs and how, for an operator.
func (d Difference) String() string {
	switch {
	case d.Got == nil:
		return fmt.Sprintf("%s: missing (backup had %d)", d.Name, d.Want.Count)
	case d.Want == nil:
		return fmt.Sprintf("%s: not in the backup (%d found)", d.Name, d.Got.Count)
	case d.Want.Count != d.Got.Count:
		return fmt.Sprintf("%s: count %d, backup had %d", d.Name, d.Got.Count, d.Want.Count)
	default:
		return fmt.Sprintf("%s: digest %s, backup had %s", d.Name, d.Got.Digest, d.Want.Digest)
	}
}

// Compare returns every item whose count or digest differs between want and
// got, in name order; none means the figures agree. ETags are not compared
// (a restored multipart object gets another one): the content digest is.
func Compare(want, got Figures) []Difference {
	w, g := index(want.Items), index(got.Items)
	var out []Difference
	for name, wi := range w {
		gi, ok := g[name]
		switch {
		case !ok:
			out = append(out, Difference{Name: name, Want: &wi})
		case gi.Count != wi.Count || gi.Digest != wi.Digest:
			out = append(out, Difference{Name: name, Want: &wi, Got: &gi})
		}
	}
	for name, gi := range g {
		if _, ok := w[name]; !ok {
			out = append(out, Difference{Name: name, Got: &gi})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func index(items []Item) map[string]Item {
	m := make(map[string]Item, len(items))
	for _, it := range items {
		m[it.Name] = it
	}
	return m
}

func sortItems(items []Item) {
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
}

// RestoreOptions tune one [Engine.Restore].
type RestoreOptions struct {
	// Clean drops what the archive holds from the target before restoring
	// it (tables, collections, objects of the same names); false expects an
	// empty target, such as a new scratch resource.
	Clean bool
}

// Engine archives and restores one kind of resource on one server. Resource
// names are a database name (PostgreSQL, MongoDB) or a bucket name (S3).
// Implementations are safe for concurrent use on different resources.
type Engine interface {
	// Kind reports the resource kind.
	Kind() Kind
	// Backup streams resource into w and returns the figures of exactly
	// what it wrote. It does not close w. A failure leaves w holding a
	// partial archive the caller must discard. Errors: ErrVersionMismatch,
	// ErrUnreachable, or the writer's error.
	Backup(ctx context.Context, resource string, w io.Writer) (Figures, error)
	// Restore reads an archive of this kind from r into resource, which
	// must exist. Errors: ErrArchiveInvalid for bytes that are not such an
	// archive, ErrVersionMismatch, ErrUnreachable.
	Restore(ctx context.Context, resource string, r io.Reader, opt RestoreOptions) error
	// Measure computes the figures of resource as it is now.
	Measure(ctx context.Context, resource string) (Figures, error)
	// Create makes a new empty resource (a scratch database or bucket);
	// an existing one is ErrExists.
	Create(ctx context.Context, resource string) error
	// Drop deletes resource and everything in it; a missing one is success.
	Drop(ctx context.Context, resource string) error
}

// Errors of the engines, each carrying a stable code (abi/errors) and checked
// with errors.Is.
var (
	// ErrVersionMismatch: the dump or restore client's major version is not
	// the server's (PostgreSQL), or the archive's format version is unknown.
	ErrVersionMismatch = abierrors.New(abierrors.BackupVersionMismatch, "archive tool and server versions differ")
	// ErrArchiveInvalid: a restore read bytes that are not a whole archive
	// of the engine's kind (truncated, or another format).
	ErrArchiveInvalid = abierrors.New(abierrors.BackupCorrupt, "archive is truncated or not of this kind")
	// ErrUnreachable: the server could not be reached or refused the admin
	// credentials; retryable.
	ErrUnreachable = abierrors.New(abierrors.Unavailable, "resource server unreachable")
	// ErrExists: Create of a resource that exists.
	ErrExists = abierrors.New(abierrors.AlreadyExists, "resource exists")
)

// DrillResult is what one restore drill found.
type DrillResult struct {
	Passed      bool         `json:"passed"`
	Scratch     string       `json:"scratch"`         // the scratch resource restored into
	Figures     Figures      `json:"figures"`         // measured on the restored scratch resource
	Differences []Difference `json:"differences"`     // empty when Passed
	Error       string       `json:"error,omitempty"` // why the restore itself failed, if it did
	Dropped     bool         `json:"dropped"`         // whether the scratch resource was dropped
	TookMS      int64        `json:"took_ms"`         // wall time of restore and verification, ms
}

// Drill restores archive into a new scratch resource named scratch, measures
// it, compares the figures with want and drops the scratch resource, also
// when the restore fails (with a fresh 2-minute context when ctx is done). A
// drill that ran reports its verdict in the result with a nil error; the
// error is for a drill that could not start (the scratch resource could not
// be created). Steps (docs/backups.md section 5): 1. create, 2. restore,
// 3. measure, 4. compare, 5. drop.
func Drill(ctx context.Context, e Engine, archive io.Reader, want Figures, scratch string) (DrillResult, error) {
	start := time.Now()
	res := DrillResult{Scratch: scratch}
	if err := e.Create(ctx, scratch); err != nil {
		return res, fmt.Errorf("drill: create scratch %s: %w", scratch, err)
	}
	err := e.Restore(ctx, scratch, archive, RestoreOptions{})
	if err == nil {
		res.Figures, err = e.Measure(ctx, scratch)
	}
	res.TookMS = time.Since(start).Milliseconds()
	dctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
	}
	res.Dropped = e.Drop(dctx, scratch) == nil
	if err != nil {
		res.Error = err.Error()
		return res, nil
	}
	res.Differences = Compare(want, res.Figures)
	res.Passed = len(res.Differences) == 0
	return res, nil
}

// IsArchiveInvalid reports whether err says an archive was unusable.
func IsArchiveInvalid(err error) bool { return errors.Is(err, ErrArchiveInvalid) }
