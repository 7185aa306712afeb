package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Fields names top-level fields of a document and their values: the conditions and the changes
// of the named methods below, which let a package that owns a collection read and write it by
// _id without building driver documents itself (DESIGN.md section 4: no package but this one
// builds bson).
type Fields map[string]any

// doc returns f as a driver document, fields sorted by name (so that the command is stable).
func (f Fields) doc() bson.D {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	d := make(bson.D, 0, len(keys))
	for _, k := range keys {
		d = append(d, bson.E{Key: k, Value: f[k]})
	}
	return d
}

// Insert inserts doc (a struct with bson tags, its _id set) into collection coll. Errors: a
// duplicate key ([IsDuplicateKey]) when the _id or a unique index is taken.
func (s *Store) Insert(ctx context.Context, coll string, doc any) error {
	if _, err := s.Collection(coll).InsertOne(ctx, doc); err != nil {
		return fmt.Errorf("store: insert into %s: %w", coll, err)
	}
	return nil
}

// Get decodes the document {_id: id} of collection coll into out, from the store. Errors:
// wrapping [ErrNotFound] when there is none.
func (s *Store) Get(ctx context.Context, coll string, id any, out any) error {
	return FindByID(ctx, s.Collection(coll), id, out)
}

// ViewGet is [Store.Get] answered by the read view ([View.Get]): no command when the view holds
// the collection. For reads that decide nothing on their own; decisions are compare-and-sets.
func (s *Store) ViewGet(ctx context.Context, coll string, id any, out any) error {
	return s.view.Get(ctx, s.Collection(coll), id, out)
}

// SetIfRevision is [Store.UpdateIfRevision] with the update {$set: set}: it sets the fields of
// set on the document {_id: id} of coll when its revision is expected, and returns expected+1.
// Same errors.
func (s *Store) SetIfRevision(ctx context.Context, coll string, id any, expected int64, set Fields) (int64, error) {
	return s.UpdateIfRevision(ctx, s.Collection(coll), id, expected, bson.M{"$set": bson.M(set)})
}

// SetIf is [Store.UpdateIf] with the update {$set: set, $unset: unset}: it changes the document
// {_id: id} of coll only when every field of cond equals its stored value, and reports whether
// it did. No document is a miss, not an error.
func (s *Store) SetIf(ctx context.Context, coll string, id any, cond, set Fields, unset ...string) (bool, error) {
	update := bson.M{}
	if len(set) > 0 {
		update["$set"] = bson.M(set)
	}
	if len(unset) > 0 {
		u := bson.M{}
		for _, f := range unset {
			u[f] = ""
		}
		update["$unset"] = u
	}
	return s.UpdateIf(ctx, s.Collection(coll), id, cond.doc(), update)
}

// DeleteWhen is [Store.DeleteIf]: it deletes the document {_id: id} of coll only when every
// field of cond equals its stored value, and reports whether it did.
func (s *Store) DeleteWhen(ctx context.Context, coll string, id any, cond Fields) (bool, error) {
	return s.DeleteIf(ctx, s.Collection(coll), id, cond.doc())
}

// DeleteNotAfter deletes every document of coll whose time field is at or before t and returns
// how many. It reads the whole collection on the embedded store: for periodic sweeps only.
func (s *Store) DeleteNotAfter(ctx context.Context, coll, field string, t time.Time) (int64, error) {
	res, err := s.Collection(coll).DeleteMany(ctx, bson.M{field: bson.M{"$lte": t}})
	if err != nil {
		return 0, fmt.Errorf("store: sweep %s: %w", coll, err)
	}
	return res.DeletedCount, nil
}

// All decodes every document of collection coll into out (a pointer to a slice). It reads the
// whole collection: for start-up recovery and periodic passes over small collections only.
func (s *Store) All(ctx context.Context, coll string, out any) error {
	cur, err := s.Collection(coll).Find(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("store: list %s: %w", coll, err)
	}
	if err := cur.All(ctx, out); err != nil {
		return fmt.Errorf("store: list %s: %w", coll, err)
	}
	return nil
}

// EnsureIndex creates an ascending index on field of collection coll; idempotent.
func (s *Store) EnsureIndex(ctx context.Context, coll, field string) error {
	if _, err := s.Collection(coll).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: field, Value: 1}}}); err != nil {
		return fmt.Errorf("store: index %s on %s: %w", coll, field, err)
	}
	return nil
}

// FindAfter decodes into out (a pointer to a slice) up to limit documents of collection coll
// whose field is greater than after and whose fields in match equal their values, in ascending
// order of field; limit <= 0 means no bound. It is a range query: on the embedded store it
// reads the whole collection, so it serves listings, never a hot path.
func (s *Store) FindAfter(ctx context.Context, coll, field string, after any, match Fields, limit int, out any) error {
	filter := bson.D{{Key: field, Value: bson.M{"$gt": after}}}
	filter = append(filter, match.doc()...)
	opts := options.Find().SetSort(bson.D{{Key: field, Value: 1}})
	if limit > 0 {
		opts.SetLimit(int64(limit))
	}
	cur, err := s.Collection(coll).Find(ctx, filter, opts)
	if err != nil {
		return fmt.Errorf("store: list %s after %s %v: %w", coll, field, after, err)
	}
	if err := cur.All(ctx, out); err != nil {
		return fmt.Errorf("store: list %s after %s %v: %w", coll, field, after, err)
	}
	return nil
}

// EnsureCollections creates every collection of names that does not exist yet; idempotent.
// Create a collection before the first write that would create it implicitly where a crash is
// likely: FerretDB v1 creates a collection's SQLite table and records it in its metadata in two
// steps, and a process killed between them leaves a table the metadata does not know, so every
// later write to that collection fails with "table ... already exists" (docs/store.md section 2.3).
func (s *Store) EnsureCollections(ctx context.Context, names ...string) error {
	have, err := s.db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("store: list collections: %w", err)
	}
	for _, n := range names {
		if slices.Contains(have, n) {
			continue
		}
		if err := s.db.CreateCollection(ctx, n); err != nil && !isNamespaceExists(err) {
			return fmt.Errorf("store: create collection %s: %w", n, err)
		}
	}
	return nil
}

// isNamespaceExists reports whether err says the collection exists already (code 48).
func isNamespaceExists(err error) bool {
	var ce mongo.CommandError
	return errors.As(err, &ce) && ce.Code == 48
}
