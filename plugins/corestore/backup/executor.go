package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// Steps an executor names when it fails an attempt (docs/backups.md section 2).
const (
	StepDump   = "dump"
	StepUpload = "upload"
)

// Declared is what an executor states about the archive it sent: the digest
// and size it computed while streaming, and the engine's figures.
type Declared struct {
	Digest  string
	Size    int64
	Figures Figures
}

// Coordinator is the core's side of one leased backup, restore or drill
// operation as the executor sees it: in production the core's runner
// transport under the operation's lease token, in tests the core's manager.
// Every method is called under the same lease; a lost lease is an error the
// executor stops on.
type Coordinator interface {
	// Begin marks the backup running under the lease; committed reports
	// that an earlier attempt already committed it (complete, do nothing).
	Begin(ctx context.Context) (committed bool, err error)
	// Upload streams the archive to the core, which hashes and counts it as
	// it stores it.
	Upload(ctx context.Context, r io.Reader) error
	// Commit declares the archive; the core compares it with what it stored.
	Commit(ctx context.Context, d Declared) error
	// Fail records a failed attempt at step.
	Fail(ctx context.Context, step string, cause error, retryable bool) error
	// Archive opens the archive of the backup a restore or drill names,
	// with the figures recorded for it; the reader fails at its end when
	// the bytes do not match the record.
	Archive(ctx context.Context) (io.ReadCloser, Figures, error)
	// Drilled records a drill's result and settles the operation.
	Drilled(ctx context.Context, res DrillResult) error
	// Restored settles a restore operation.
	Restored(ctx context.Context) error
}

// RunBackup executes one backup operation: begin, stream the engine's
// archive through a SHA-256 and a counter into Upload, and commit what was
// counted. A dump failure fails the attempt at StepDump (retryable), an
// upload failure at StepUpload (retryable); nothing is committed unless the
// engine finished and the whole stream was sent.
func RunBackup(ctx context.Context, e Engine, resource string, c Coordinator) error {
	committed, err := c.Begin(ctx)
	if err != nil || committed {
		return err
	}
	pr, pw := io.Pipe()
	h := sha256.New()
	cw := &counter{w: io.MultiWriter(pw, h)}
	type result struct {
		fig Figures
		err error
	}
	done := make(chan result, 1)
	go func() {
		fig, err := e.Backup(ctx, resource, cw)
		pw.CloseWithError(err)
		done <- result{fig, err}
	}()
	upErr := c.Upload(ctx, pr)
	_ = pr.CloseWithError(errors.New("upload ended")) // unblock the engine if the upload stopped early
	res := <-done
	switch {
	case res.err != nil:
		return errors.Join(fmt.Errorf("backup %s: dump: %w", resource, res.err), c.Fail(context.WithoutCancel(ctx), StepDump, res.err, true))
	case upErr != nil:
		// The core failed the record at upload when it saw the stream break;
		// failing the attempt again here names the same step.
		return errors.Join(fmt.Errorf("backup %s: upload: %w", resource, upErr), c.Fail(context.WithoutCancel(ctx), StepUpload, upErr, true))
	}
	return c.Commit(ctx, Declared{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: cw.n, Figures: res.fig})
}

// RunDrill executes one drill operation: [Drill] of the backup's archive
// into scratch, then Drilled with the result (passed or failed alike).
func RunDrill(ctx context.Context, e Engine, scratch string, c Coordinator) (DrillResult, error) {
	rc, want, err := c.Archive(ctx)
	if err != nil {
		return DrillResult{}, err
	}
	defer rc.Close()
	res, err := Drill(ctx, e, rc, want, scratch)
	if err != nil {
		return res, err
	}
	return res, c.Drilled(ctx, res)
}

// RunRestore executes one restore operation into resource (created first
// when scratch), verifying afterwards that the restored resource measures as
// the backup recorded when it was a new resource.
func RunRestore(ctx context.Context, e Engine, resource string, scratch bool, c Coordinator) error {
	rc, want, err := c.Archive(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	if scratch {
		if err := e.Create(ctx, resource); err != nil && !errors.Is(err, ErrExists) {
			return err
		}
	}
	start := time.Now()
	if err := e.Restore(ctx, resource, rc, RestoreOptions{Clean: !scratch}); err != nil {
		return fmt.Errorf("restore into %s: %w", resource, err)
	}
	if scratch {
		got, err := e.Measure(ctx, resource)
		if err != nil {
			return err
		}
		if d := Compare(want, got); len(d) > 0 {
			return fmt.Errorf("restore into %s after %s: %s differs: %s: %w", resource, time.Since(start).Round(time.Millisecond), d[0].Name, d[0], ErrArchiveInvalid)
		}
	}
	return c.Restored(ctx)
}

type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ScratchResource turns the core's scratch name (lower case letters, digits
// and underscores) into a resource name of kind k: unchanged for databases,
// with hyphens for underscores for S3 buckets, which allow no underscores.
func ScratchResource(k Kind, name string) string {
	if k != KindS3 {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		if c == '_' {
			b[i] = '-'
		}
	}
	return string(b)
}
