package operations

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// MigrateLegacy moves operations of the earlier single-collection layout (collection
// [Collection] itself) into the layout of docs/runner-protocol.md section 5.3, keeping queued work,
// leases, history and idempotency keys; fence sequences are not touched, so fences keep increasing.
// Per operation, each step is idempotent: the key record, then the archive (settled) or the live
// bucket and the claim lane (live), then the removal from the old collection. Run it at start,
// before claims; it returns how many operations it moved.
func (q *Queue) MigrateLegacy(ctx context.Context) (int, error) {
	legacy := q.st.Collection(Collection)
	cur, err := legacy.Find(ctx, bson.M{})
	if err != nil {
		return 0, fmt.Errorf("operations: migrate: %w", err)
	}
	var ops []Operation
	if err := cur.All(ctx, &ops); err != nil {
		return 0, fmt.Errorf("operations: migrate: %w", err)
	}
	n := 0
	now := q.now().UTC()
	for i := range ops {
		o := &ops[i]
		if _, err := q.keys.InsertOne(ctx, keyRecord{ID: keyID(o.ProjectID, o.IdempotencyKey), Operation: *o}); err != nil && !store.IsDuplicateKey(err) {
			return n, fmt.Errorf("operations: migrate %s: %w", o.ID, err)
		}
		if o.State.Terminal() {
			if _, err := q.archive.InsertOne(ctx, o); err != nil && !store.IsDuplicateKey(err) {
				return n, fmt.Errorf("operations: migrate %s: %w", o.ID, err)
			}
		} else {
			o.Lane = ""
			if (o.State == Queued || o.State == Retry) && !now.Before(o.AvailableAt) {
				if o.Lane, err = q.nextSlot(ctx, o.TargetNode); err != nil {
					return n, err
				}
			}
			_, err := q.live.For(o.ID).InsertOne(ctx, o)
			if store.IsDuplicateKey(err) {
				// Moved by an earlier run that stopped before removing the old document.
				if o, err = q.getLive(ctx, o.ID); err != nil {
					return n, err
				}
			} else if err != nil {
				return n, fmt.Errorf("operations: migrate %s: %w", o.ID, err)
			}
			if err := q.publish(ctx, o); err != nil {
				return n, err
			}
		}
		if _, err := legacy.DeleteOne(ctx, bson.D{{Key: "_id", Value: o.ID}}); err != nil {
			return n, fmt.Errorf("operations: migrate %s: %w", o.ID, err)
		}
		n++
	}
	return n, nil
}
