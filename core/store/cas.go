package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// RevisionField is the document field that [UpdateIfRevision] compares and increments.
const RevisionField = "revision"

// FindByID decodes the document {_id: id} of coll into out. It returns an error wrapping
// [ErrNotFound] when there is none.
func FindByID(ctx context.Context, coll *mongo.Collection, id any, out any) error {
	err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(out)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: find %s %v: %w", coll.Name(), id, err)
	}
	return nil
}

// UpdateIfRevision is Berth's compare-and-set: it applies update (an operator document such as
// bson.M{"$set": ...}) to the document {_id: id} only if its revision field equals expected, and
// increments revision by one in the same single-document write. It returns expected+1.
//
// Errors: wrapping [ErrConflict] when the document's revision differs, [ErrNotFound] when there
// is no such document, a duplicate-key error ([IsDuplicateKey]) when a unique index refuses the
// change. update must not itself touch the revision field; its "$inc", if any, must be a bson.M.
// update is not modified.
func UpdateIfRevision(ctx context.Context, coll *mongo.Collection, id any, expected int64, update bson.M) (int64, error) {
	merged := make(bson.M, len(update)+1)
	for k, v := range update {
		merged[k] = v
	}
	inc := bson.M{}
	if v, ok := update["$inc"]; ok {
		m, ok := v.(bson.M)
		if !ok {
			return 0, fmt.Errorf("store: update %s %v: $inc must be a bson.M, got %T", coll.Name(), id, v)
		}
		for k, n := range m {
			inc[k] = n
		}
	}
	if _, ok := inc[RevisionField]; ok {
		return 0, fmt.Errorf("store: update %s %v: the update must not change %q itself", coll.Name(), id, RevisionField)
	}
	inc[RevisionField] = int64(1)
	merged["$inc"] = inc

	res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: RevisionField, Value: expected}}, merged)
	if err != nil {
		return 0, fmt.Errorf("store: update %s %v at revision %d: %w", coll.Name(), id, expected, err)
	}
	if res.MatchedCount == 1 {
		return expected + 1, nil
	}
	n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: id}}, options.Count().SetLimit(1))
	if err != nil {
		return 0, fmt.Errorf("store: update %s %v at revision %d: tell conflict from absence: %w", coll.Name(), id, expected, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("store: update %s %v: %w", coll.Name(), id, ErrNotFound)
	}
	return 0, fmt.Errorf("store: update %s %v at revision %d: %w", coll.Name(), id, expected, ErrConflict)
}
