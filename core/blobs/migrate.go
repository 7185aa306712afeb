package blobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// MigrateResult counts what one [Migrate] pass did.
type MigrateResult struct {
	Moved   int   // objects copied to the destination and removed from the source
	Present int   // objects the destination already held (an earlier, interrupted pass), removed from the source
	Bytes   int64 // bytes copied
}

// Migrate moves every object under prefix from src to dst: each object is
// copied (its SHA-256 checked against the key when the key ends in
// sha256/<hex>, as bundle keys do), confirmed by a Stat of the same size in
// dst, and only then deleted from src. It is resumable: a pass stopped at any
// point leaves each object whole in src, in dst, or in both, and the next
// pass finishes the job without copying what dst already holds. log (nil:
// discard) gets one line per object moved. It stops at the first error.
func Migrate(ctx context.Context, src, dst Store, prefix string, log *slog.Logger) (MigrateResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var keys []Info
	if err := src.List(ctx, prefix, func(i Info) error { keys = append(keys, i); return nil }); err != nil {
		return MigrateResult{}, fmt.Errorf("migrate blobs: %w", err)
	}
	var res MigrateResult
	for _, in := range keys {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		have, err := dst.Stat(ctx, in.Key)
		switch {
		case err == nil && have.Size == in.Size:
			res.Present++
		case err == nil || errors.Is(err, ErrNotFound):
			if err := copyOne(ctx, src, dst, in); err != nil {
				return res, err
			}
			res.Moved++
			res.Bytes += in.Size
			log.Info("blob moved", "key", in.Key, "bytes", in.Size)
		default:
			return res, fmt.Errorf("migrate blob %s: %w", in.Key, err)
		}
		if have, err := dst.Stat(ctx, in.Key); err != nil || have.Size != in.Size {
			return res, fmt.Errorf("migrate blob %s: the destination does not hold it after the copy (%v)", in.Key, err)
		}
		if err := src.Delete(ctx, in.Key); err != nil {
			return res, fmt.Errorf("migrate blob %s: %w", in.Key, err)
		}
	}
	return res, nil
}

func copyOne(ctx context.Context, src, dst Store, in Info) error {
	rc, info, err := src.Get(ctx, in.Key, 0, -1)
	if err != nil {
		return fmt.Errorf("migrate blob %s: %w", in.Key, err)
	}
	defer rc.Close()
	opt := PutOptions{Size: info.Size, SHA256: info.SHA256}
	if i := strings.LastIndex(in.Key, "sha256/"); i >= 0 {
		if d, ok := normalDigest(in.Key[i+len("sha256/"):]); ok {
			opt.SHA256 = d
		}
	}
	if info.Size == 0 {
		opt.Size = 0
	}
	if _, err := dst.Put(ctx, in.Key, io.Reader(rc), opt); err != nil {
		return fmt.Errorf("migrate blob %s: %w", in.Key, err)
	}
	return nil
}

// Fallback is a [Store] that writes to Primary and reads from Primary, then
// from Secondary when Primary does not hold the key: a store being migrated
// keeps serving objects not yet moved. Delete removes the key from both;
// List lists Primary and then the keys only Secondary holds.
type Fallback struct {
	Primary, Secondary Store
}

var _ Store = Fallback{}

// Put implements [Store.Put]: Primary only.
func (f Fallback) Put(ctx context.Context, key string, r io.Reader, opt PutOptions) (Info, error) {
	return f.Primary.Put(ctx, key, r, opt)
}

// Get implements [Store.Get].
func (f Fallback) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, Info, error) {
	rc, info, err := f.Primary.Get(ctx, key, off, length)
	if errors.Is(err, ErrNotFound) {
		return f.Secondary.Get(ctx, key, off, length)
	}
	return rc, info, err
}

// Stat implements [Store.Stat].
func (f Fallback) Stat(ctx context.Context, key string) (Info, error) {
	info, err := f.Primary.Stat(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return f.Secondary.Stat(ctx, key)
	}
	return info, err
}

// Delete implements [Store.Delete].
func (f Fallback) Delete(ctx context.Context, key string) error {
	if err := f.Primary.Delete(ctx, key); err != nil {
		return err
	}
	return f.Secondary.Delete(ctx, key)
}

// List implements [Store.List].
func (f Fallback) List(ctx context.Context, prefix string, fn func(Info) error) error {
	seen := map[string]bool{}
	if err := f.Primary.List(ctx, prefix, func(i Info) error { seen[i.Key] = true; return fn(i) }); err != nil {
		return err
	}
	return f.Secondary.List(ctx, prefix, func(i Info) error {
		if seen[i.Key] {
			return nil
		}
		return fn(i)
	})
}
