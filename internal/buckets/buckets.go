// Package buckets spreads one logical store collection over a fixed number of physical collections
// by a hash of the document id, so a compare-and-set touches a small collection (DESIGN.md section 4).
package buckets

import (
	"context"
	"fmt"
	"hash/fnv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Set is one logical collection stored as N physical collections "<name>_b00" .. "<name>_bNN".
//
// Why: the embedded store (FerretDB v1, SQLite) evaluates every filter other than a lone _id by
// decoding each document of the collection, and a compare-and-set filters on _id and revision. A
// document's bucket is fixed by its id, so reads by id and compare-and-sets address one bucket, and
// the cost of a compare-and-set grows with the bucket, not with the fleet. On MongoDB the split
// costs nothing but a few more collections. The bucket count is part of the storage layout: it must
// never change for a store that holds data.
type Set struct {
	name  string
	colls []*mongo.Collection
}

// New returns the set of n (at least 1, at most 100) buckets of the logical collection name in db.
// It does no I/O.
func New(db *mongo.Database, name string, n int) *Set {
	n = max(1, min(n, 100))
	s := &Set{name: name, colls: make([]*mongo.Collection, n)}
	for i := range s.colls {
		s.colls[i] = db.Collection(fmt.Sprintf("%s_b%02d", name, i))
	}
	return s
}

// Name returns the logical collection name.
func (s *Set) Name() string { return s.name }

// For returns the bucket that holds the document with id.
func (s *Set) For(id string) *mongo.Collection {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return s.colls[h.Sum32()%uint32(len(s.colls))]
}

// All returns every bucket, in a fixed order.
func (s *Set) All() []*mongo.Collection { return s.colls }

// Find decodes the documents matching filter in every bucket into a new slice of T (unordered;
// the caller sorts).
func Find[T any](ctx context.Context, s *Set, filter any) ([]T, error) {
	if filter == nil {
		filter = bson.M{}
	}
	out := []T{}
	for _, c := range s.colls {
		cur, err := c.Find(ctx, filter)
		if err != nil {
			return nil, fmt.Errorf("buckets: find in %s: %w", c.Name(), err)
		}
		var part []T
		if err := cur.All(ctx, &part); err != nil {
			return nil, fmt.Errorf("buckets: find in %s: %w", c.Name(), err)
		}
		out = append(out, part...)
	}
	return out, nil
}

// DeleteAll removes every document of every bucket (tests and benchmarks that reset state).
func (s *Set) DeleteAll(ctx context.Context) error {
	for _, c := range s.colls {
		if _, err := c.DeleteMany(ctx, bson.M{}); err != nil {
			return fmt.Errorf("buckets: clear %s: %w", c.Name(), err)
		}
	}
	return nil
}
