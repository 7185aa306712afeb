package blobs

import (
	"context"
	"log/slog"
	"time"
)

// MigrateRetry is how long [StartMigration] waits after a failed pass before the next one.
const MigrateRetry = time.Minute

// StartMigration moves what local still holds under "sha256/" into s3 in the background
// ([Migrate]), retrying a failed pass every MigrateRetry until one succeeds or ctx ends, and
// returns the store to serve meanwhile: s3, with local as a read fallback (docs/operating.md
// section 10). stop ends the pass and waits for it.
func StartMigration(ctx context.Context, local, s3 Store, log *slog.Logger) (served Store, stop func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			res, err := Migrate(ctx, local, s3, "sha256/", log)
			if err == nil {
				if res.Moved+res.Present > 0 {
					log.Info("local bundles moved to S3", "moved", res.Moved, "already_there", res.Present, "bytes", res.Bytes)
				}
				return
			}
			log.Warn("moving local bundles to S3 stopped; retrying", "moved", res.Moved, "err", err, "retry_in", MigrateRetry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(MigrateRetry):
			}
		}
	}()
	return Fallback{Primary: s3, Secondary: local}, func() { cancel(); <-done }
}
