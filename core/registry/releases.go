package registry

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// ReleasesCollection holds one document per repository tag: the digest it
// names, the digests it named before, and a reservation (docs/registry.md
// section 7).
const ReleasesCollection = "image_releases"

// HistoryLimit is how many earlier digests a tag remembers.
const HistoryLimit = 20

// Errors of [Releases].
var (
	// ErrTagReserved: Reserve of a tag that already exists in the repository.
	ErrTagReserved = errors.New("berth: release tag already reserved or pushed")
	// ErrTagInvalid: Reserve of "latest" or of a name outside the tag grammar.
	ErrTagInvalid = errors.New("berth: invalid release tag")
	// ErrConflict: a concurrent write of the same tag won; the caller may retry.
	ErrConflict = errors.New("berth: release tag changed concurrently")
)

// Release is what a repository's tag names (one document, _id "<repo>:<tag>").
type Release struct {
	ID         string    `bson:"_id" json:"-"`
	Repository string    `bson:"repository" json:"repository"`
	Tag        string    `bson:"tag" json:"tag"`
	Digest     string    `bson:"digest,omitempty" json:"digest,omitempty"`
	PushedBy   string    `bson:"pushed_by,omitempty" json:"pushed_by,omitempty"`
	PushedAt   time.Time `bson:"pushed_at,omitempty" json:"pushed_at,omitempty"`
	// ReservedBy is the principal id that reserved the tag; only it may push
	// to it, once. Empty: an ordinary, movable tag.
	ReservedBy string    `bson:"reserved_by,omitempty" json:"reserved_by,omitempty"`
	ReservedAt time.Time `bson:"reserved_at,omitempty" json:"reserved_at,omitempty"`
	// History holds the digests the tag named before, newest first.
	History []ReleaseDigest `bson:"history,omitempty" json:"history,omitempty"`
	// Follow is deploy on push's work for the digest the tag names (follow.go): written pending
	// by the push that moved the tag, in the same compare-and-set, and settled by the
	// [FollowWorker]. nil: nothing to follow (a reservation, or no service follows the tag).
	Follow    *ReleaseFollow      `bson:"follow,omitempty" json:"follow,omitempty"`
	Revision  int64               `bson:"revision" json:"revision"`
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
}

// ReleaseDigest is one earlier digest of a tag.
type ReleaseDigest struct {
	Digest string    `bson:"digest" json:"digest"`
	At     time.Time `bson:"at" json:"at"`
}

// Releases records tags as releases: every write is one compare-and-set on
// the tag's document, with its change-log entry in the same write.
type Releases struct {
	st   *store.Store
	coll *mongo.Collection
	now  func() time.Time
}

// NewReleases returns the release records of st (collection ReleasesCollection); now nil means
// time.Now.
func NewReleases(st *store.Store, now func() time.Time) *Releases {
	if now == nil {
		now = time.Now
	}
	return &Releases{st: st, coll: st.Collection(ReleasesCollection), now: now}
}

func releaseID(repo, tag string) string { return repo + ":" + tag }

// Get returns the release of repo:tag, or store.ErrNotFound.
func (r *Releases) Get(ctx context.Context, repo, tag string) (*Release, error) {
	var rel Release
	err := r.coll.FindOne(ctx, bson.M{"_id": releaseID(repo, tag)}).Decode(&rel)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read release %s:%s: %w", repo, tag, err)
	}
	return &rel, nil
}

// TagDigest returns the digest the release record of repo:tag names: "" when the tag has no
// record or is reserved and not pushed yet. It is Config.TagDigest: the record is the truth of
// what a tag names, and the registry's tag is written to match it.
func (r *Releases) TagDigest(ctx context.Context, repo, tag string) (string, error) {
	rel, err := r.Get(ctx, repo, tag)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return rel.Digest, nil
}

// RecordAttempts bounds the compare-and-sets one [Releases.Record] tries. Each one lost is
// another push of the tag recorded meanwhile, so it is sized above the pushes of one tag that
// race in practice: a push that loses to them is recorded after them, not refused.
const RecordAttempts = 32

// CheckPush refuses (wrapping ErrDenied) a push of p.Digest to a tag
// reserved by another principal, or a second, different digest to a
// reserved tag (a release is immutable once pushed). Pushes by digest and
// to unreserved tags pass.
func (r *Releases) CheckPush(ctx context.Context, p Push) error {
	if isDigestRef(p.Reference) {
		return nil
	}
	rel, err := r.Get(ctx, p.Repository, p.Reference)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case rel.ReservedBy == "":
		return nil
	case rel.ReservedBy != p.Actor:
		return fmt.Errorf("%w: tag %s of %s is reserved by another actor", ErrDenied, p.Reference, p.Repository)
	case rel.Digest != "" && rel.Digest != p.Digest:
		return fmt.Errorf("%w: release %s of %s is already pushed at %s", ErrDenied, p.Reference, p.Repository, rel.Digest)
	}
	return nil
}

// Record notes a manifest written under a tag: the tag's digest moves (the
// previous one goes to History), and a change-log entry and a pending
// follow of the new digest ([ReleaseFollow], deploy on push) ride in the
// same compare-and-set, so a push recorded is a follow owed whatever happens
// to this process next. Idempotent: recording the digest the tag already
// names changes nothing. A compare-and-set lost to a concurrent push of the
// tag is tried again on the document that push left, so the push recorded
// last is the one the tag names. Errors: ErrConflict after RecordAttempts
// lost compare-and-sets.
func (r *Releases) Record(ctx context.Context, p Push) error {
	if isDigestRef(p.Reference) || p.Digest == "" {
		return nil
	}
	for range RecordAttempts {
		rel, err := r.Get(ctx, p.Repository, p.Reference)
		fresh := errors.Is(err, store.ErrNotFound)
		if err != nil && !fresh {
			return err
		}
		if fresh {
			rel = &Release{ID: releaseID(p.Repository, p.Reference), Repository: p.Repository, Tag: p.Reference}
		}
		if rel.Digest == p.Digest {
			return nil
		}
		now := r.now().UTC().Truncate(time.Millisecond)
		if rel.Digest != "" {
			rel.History = append([]ReleaseDigest{{Digest: rel.Digest, At: rel.PushedAt}}, rel.History...)
			if len(rel.History) > HistoryLimit {
				rel.History = rel.History[:HistoryLimit]
			}
		}
		rel.Digest, rel.PushedBy, rel.PushedAt = p.Digest, p.Actor, now
		rel.Follow = &ReleaseFollow{State: FollowPending, Digest: p.Digest, Actor: p.Actor, ActorKind: string(p.ActorKind), UpdatedAt: now}
		op := node.OpUpdate
		if fresh {
			op = node.OpCreate
		}
		pend, err := changelog.Prepare(changelog.Change{ActorType: string(p.ActorKind), ActorID: p.Actor, EntityType: "image_release", EntityID: rel.ID, Op: op,
			Payload: struct {
				Repository string `json:"repository"`
				Tag        string `json:"tag"`
				Digest     string `json:"digest"`
			}{rel.Repository, rel.Tag, rel.Digest}})
		if err != nil {
			return err
		}
		if fresh {
			rel.Revision, rel.LogOutbox = 1, []changelog.Pending{pend}
			_, err = r.coll.InsertOne(ctx, rel)
			if store.IsDuplicateKey(err) {
				continue
			}
		} else {
			// Field by field, not a replacement: the change log clears appended entries from
			// log_outbox by _id meanwhile, and a replacement would bring them back.
			_, err = r.st.UpdateIfRevision(ctx, r.coll, rel.ID, rel.Revision, bson.M{
				"$set":  bson.M{"digest": rel.Digest, "pushed_by": rel.PushedBy, "pushed_at": rel.PushedAt, "history": rel.History, "follow": rel.Follow},
				"$push": bson.M{changelog.OutboxField: pend},
			})
			if errors.Is(err, store.ErrConflict) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("record release %s: %w", rel.ID, err)
		}
		return nil
	}
	return fmt.Errorf("record release %s:%s: %w", p.Repository, p.Reference, ErrConflict)
}

// Reserve reserves tag in repo for the principal actor (its CI token):
// one insert, so two reservations of one tag never both succeed. Errors:
// ErrTagInvalid ("latest", or not a tag), ErrTagReserved.
func (r *Releases) Reserve(ctx context.Context, repo, tag, actor, actorKind string) (*Release, error) {
	if tag == "latest" || !tagRE.MatchString(tag) {
		return nil, fmt.Errorf("%w: %q", ErrTagInvalid, tag)
	}
	now := r.now().UTC().Truncate(time.Millisecond)
	rel := &Release{ID: releaseID(repo, tag), Repository: repo, Tag: tag, ReservedBy: actor, ReservedAt: now, Revision: 1}
	pend, err := changelog.Prepare(changelog.Change{ActorType: actorKind, ActorID: actor, EntityType: "image_release", EntityID: rel.ID, Op: node.OpCreate,
		Payload: struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
			ReservedBy string `json:"reserved_by"`
		}{repo, tag, actor}})
	if err != nil {
		return nil, err
	}
	rel.LogOutbox = []changelog.Pending{pend}
	if _, err := r.coll.InsertOne(ctx, rel); store.IsDuplicateKey(err) {
		return nil, ErrTagReserved
	} else if err != nil {
		return nil, fmt.Errorf("reserve release %s: %w", rel.ID, err)
	}
	return rel, nil
}

// List returns the releases of repo, newest push or reservation first. It
// filters on a field, so it reads the whole collection: for listings, not
// hot paths.
func (r *Releases) List(ctx context.Context, repo string) ([]Release, error) {
	cur, err := r.coll.Find(ctx, bson.M{"repository": repo})
	if err != nil {
		return nil, fmt.Errorf("list releases of %s: %w", repo, err)
	}
	var out []Release
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list releases of %s: %w", repo, err)
	}
	sort.Slice(out, func(i, j int) bool { return latest(out[i]).After(latest(out[j])) })
	return out, nil
}

// All returns every release of every repository (one scan of the
// collection): for the garbage collector, not hot paths.
func (r *Releases) All(ctx context.Context) ([]Release, error) {
	cur, err := r.coll.Find(ctx, bson.M{})
	if err != nil {
		return nil, fmt.Errorf("list releases: %w", err)
	}
	var out []Release
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list releases: %w", err)
	}
	return out, nil
}

func latest(r Release) time.Time {
	if r.PushedAt.After(r.ReservedAt) {
		return r.PushedAt
	}
	return r.ReservedAt
}
