package runners

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// MigrateLegacy moves nodes of the earlier single-collection layout (collection [NodesCollection]
// itself) into their buckets, unchanged: credential digests, reservations and revisions are kept.
// Each node is inserted into its bucket (a repeat is success) and then removed from the old
// collection. Run it at start; it returns how many nodes it moved.
func (r *Registry) MigrateLegacy(ctx context.Context, s *store.Store) (int, error) {
	legacy := s.Collection(NodesCollection)
	cur, err := legacy.Find(ctx, bson.M{})
	if err != nil {
		return 0, fmt.Errorf("runners: migrate: %w", err)
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		return 0, fmt.Errorf("runners: migrate: %w", err)
	}
	for i, d := range docs {
		id, _ := d["_id"].(string)
		if _, err := r.nodes.For(id).InsertOne(ctx, d); err != nil && !store.IsDuplicateKey(err) {
			return i, fmt.Errorf("runners: migrate %s: %w", id, err)
		}
		if _, err := legacy.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
			return i, fmt.Errorf("runners: migrate %s: %w", id, err)
		}
	}
	if len(docs) > 0 {
		r.changes.Add(1)
	}
	return len(docs), nil
}
