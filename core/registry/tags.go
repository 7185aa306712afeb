package registry

import (
	"context"
	"fmt"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// TagSyncAttempts bounds the rounds of one [Registry.syncTag]. A round is
// repeated only when the record moved while it ran, that is when another
// push of the tag was recorded meanwhile.
const TagSyncAttempts = 32

// syncTag writes repo's tag to the digest Config.TagDigest names for it,
// and reads the record again: when it moved meanwhile (a concurrent push
// was recorded), the tag may have been written with the older digest after
// that push wrote the newer one, so the round is repeated. Every push of a
// tag ends here after its record, and none leaves before a round in which
// the record held still, so once the last of them answers, the tag names
// the digest its record names, on one berthd or several. A record naming
// nothing (none yet, or a reservation not pushed) leaves the tag alone.
// Errors: reading the record or writing the tag failed, or the record kept
// moving for TagSyncAttempts rounds (ErrConflict).
func (r *Registry) syncTag(ctx context.Context, repo, tag string) error {
	named, err := reference.WithName(repo)
	if err != nil {
		return fmt.Errorf("move tag %s:%s: %w", repo, tag, err)
	}
	rp, err := r.ns.Repository(ctx, named)
	if err != nil {
		return fmt.Errorf("move tag %s:%s: %w", repo, tag, err)
	}
	tags := rp.Tags(ctx)
	want, err := r.cfg.TagDigest(ctx, repo, tag)
	if err != nil {
		return fmt.Errorf("move tag %s:%s: read its record: %w", repo, tag, err)
	}
	for range TagSyncAttempts {
		if want == "" {
			return nil
		}
		d, err := digest.Parse(want)
		if err != nil {
			return fmt.Errorf("move tag %s:%s: the record names %q: %w", repo, tag, want, err)
		}
		if cur, err := tags.Get(ctx, tag); err != nil || cur.Digest != d {
			if err := tags.Tag(ctx, tag, v1.Descriptor{Digest: d}); err != nil {
				return fmt.Errorf("move tag %s:%s to %s: %w", repo, tag, d, err)
			}
		}
		now, err := r.cfg.TagDigest(ctx, repo, tag)
		if err != nil {
			return fmt.Errorf("move tag %s:%s: read its record: %w", repo, tag, err)
		}
		if now == want {
			return nil
		}
		want = now
	}
	return fmt.Errorf("move tag %s:%s: %w: its record moved %d times in a row", repo, tag, ErrConflict, TagSyncAttempts)
}
