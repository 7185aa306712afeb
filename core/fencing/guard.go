package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/store"
)

// GuardCollection holds one document per guarded resource: {_id: resource, token: the highest
// token seen, accepted, rejected: counts, last_rejected_token, last_rejected_at}.
const GuardCollection = "fencing_guard"

// ErrStaleToken is returned (wrapped, naming both tokens) by [Guard.Check] for a token lower than
// the highest the guard has seen for the resource. The API answers it as stale_fencing_token.
var ErrStaleToken = errors.New("berth: fencing token is lower than the highest seen for the resource")

// Guard is the storage side of fencing (docs/node-protocol.md section 8.6): it remembers, durably,
// the highest fencing token seen per resource, refuses every write carrying a lower one and records
// the refusal. Every shared-storage write path Berth owns asks it before writing. Safe for
// concurrent use, also by several cores on one store.
type Guard struct {
	coll *mongo.Collection
	now  func() time.Time
}

// NewGuard returns a Guard over s; now may be nil (time.Now). It does no I/O.
func NewGuard(s *store.Store, now func() time.Time) *Guard {
	if now == nil {
		now = time.Now
	}
	return &Guard{coll: s.Collection(GuardCollection), now: now}
}

// Check admits a write to resource carrying token: when token is at least the highest seen, it
// becomes the highest seen (one conditional update, or the first insert) and Check returns nil;
// otherwise the rejection is counted on the resource's document and Check returns an error
// wrapping [ErrStaleToken]. A token below 1 is refused the same way. Check does not write the
// data: the caller writes only after nil.
func (g *Guard) Check(ctx context.Context, resource string, token int64) error {
	if resource == "" {
		return errors.New("fencing: guard: empty resource")
	}
	return store.RetryOnConflict(ctx, func() error {
		if token >= 1 {
			res, err := g.coll.UpdateOne(ctx, bson.M{"_id": resource, "token": bson.M{"$lte": token}},
				bson.M{"$set": bson.M{"token": token}, "$inc": bson.M{"accepted": int64(1)}})
			if err != nil {
				return fmt.Errorf("fencing: guard %s: %w", resource, err)
			}
			if res.MatchedCount == 1 {
				return nil
			}
			_, err = g.coll.InsertOne(ctx, bson.M{"_id": resource, "token": token, "accepted": int64(1), "rejected": int64(0)})
			if err == nil {
				return nil
			}
			if !store.IsDuplicateKey(err) {
				return fmt.Errorf("fencing: guard %s: %w", resource, err)
			}
		}
		var cur struct {
			Token int64 `bson:"token"`
		}
		if err := store.FindByID(ctx, g.coll, resource, &cur); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("fencing: guard %s: %w", resource, err)
		}
		if token >= 1 && cur.Token <= token {
			// Raced with a concurrent first insert or a lower writer; decide again.
			return fmt.Errorf("fencing: guard %s: %w", resource, store.ErrConflict)
		}
		_, err := g.coll.UpdateOne(ctx, bson.M{"_id": resource},
			bson.M{"$inc": bson.M{"rejected": int64(1)}, "$set": bson.M{"last_rejected_token": token, "last_rejected_at": g.now().UTC()}})
		if err != nil {
			return fmt.Errorf("fencing: guard %s: record rejection: %w", resource, err)
		}
		return fmt.Errorf("%w: resource %s, token %d, highest seen %d", ErrStaleToken, resource, token, cur.Token)
	})
}

// GuardRecord is what the guard knows of one resource.
type GuardRecord struct {
	Resource          string    `bson:"_id" json:"resource"`
	Token             int64     `bson:"token" json:"token"`
	Accepted          int64     `bson:"accepted" json:"accepted"`
	Rejected          int64     `bson:"rejected" json:"rejected"`
	LastRejectedToken int64     `bson:"last_rejected_token,omitempty" json:"last_rejected_token,omitempty"`
	LastRejectedAt    time.Time `bson:"last_rejected_at,omitempty" json:"last_rejected_at,omitempty"`
}

// Record returns what the guard knows of resource. Errors: wrapping [store.ErrNotFound] when no
// write for it was ever checked.
func (g *Guard) Record(ctx context.Context, resource string) (*GuardRecord, error) {
	var r GuardRecord
	if err := store.FindByID(ctx, g.coll, resource, &r); err != nil {
		return nil, fmt.Errorf("fencing: guard record %s: %w", resource, err)
	}
	return &r, nil
}
