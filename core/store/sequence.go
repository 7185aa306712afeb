package store

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// SequencesCollection holds one document per named sequence: {_id: name, value: int64}.
const SequencesCollection = "sequences"

// NextSequence increments the named sequence by one and returns its new value; the first call
// for a name returns 1. It is one findOneAndUpdate with $inc and upsert, so concurrent callers
// get strictly increasing values without gaps or repeats. A concurrent first upsert that loses
// the unique _id race (MongoDB) is retried once.
func NextSequence(ctx context.Context, s *Store, name string) (int64, error) {
	return NextSequenceN(ctx, s, name, 1)
}

// NextSequenceN reserves the next n values of the named sequence (n at least 1) with one
// findOneAndUpdate ($inc by n, upsert) and returns the last of them: the caller owns
// last-n+1 through last. A batch of n inserts numbers its documents with one update instead of
// n (docs/store.md section 2.2). Errors as [NextSequence]; n < 1 is refused.
func NextSequenceN(ctx context.Context, s *Store, name string, n int64) (int64, error) {
	if n < 1 {
		return 0, fmt.Errorf("store: reserve %d values of sequence %q: at least one", n, name)
	}
	coll := s.Collection(SequencesCollection)
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	var doc struct {
		Value int64 `bson:"value"`
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		err = coll.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: name}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "value", Value: n}}}},
			opts,
		).Decode(&doc)
		if err == nil {
			return doc.Value, nil
		}
		if !IsDuplicateKey(err) {
			break
		}
	}
	return 0, fmt.Errorf("store: next value of sequence %q: %w", name, err)
}
