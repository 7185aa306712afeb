package placement

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// MigrateLegacy moves placements of the earlier single-collection layout (collection [Collection]
// itself) into their buckets, unchanged. Each placement is inserted into its bucket (a repeat is
// success) and then removed from the old collection. Run it at start; it returns how many it moved.
func (s *Service) MigrateLegacy(ctx context.Context, st *store.Store) (int, error) {
	legacy := st.Collection(Collection)
	cur, err := legacy.Find(ctx, bson.M{})
	if err != nil {
		return 0, fmt.Errorf("placement: migrate: %w", err)
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		return 0, fmt.Errorf("placement: migrate: %w", err)
	}
	for i, d := range docs {
		id, _ := d["_id"].(string)
		if _, err := s.colls.For(id).InsertOne(ctx, d); err != nil && !store.IsDuplicateKey(err) {
			return i, fmt.Errorf("placement: migrate %s: %w", id, err)
		}
		if _, err := legacy.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
			return i, fmt.Errorf("placement: migrate %s: %w", id, err)
		}
	}
	return len(docs), nil
}
