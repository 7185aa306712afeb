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
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	abierrors "github.com/berthhq/berth/abi/errors"
)

// Contract types, defined in abi/backups so the core reads them without
// importing this package.
type (
	Kind        = abibackups.Kind
	Item        = abibackups.Item
	Figures     = abibackups.Figures
	Difference  = abibackups.Difference
	DrillResult = abibackups.DrillResult
)

// The kinds of docs/backups.md section 3.
const (
	KindPostgres = abibackups.KindPostgres
	KindMongoDB  = abibackups.KindMongoDB
	KindS3       = abibackups.KindS3
)

// Compare is [abibackups.Compare].
func Compare(want, got Figures) []Difference { return abibackups.Compare(want, got) }

func sortItems(items []Item) { abibackups.SortItems(items) }

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
