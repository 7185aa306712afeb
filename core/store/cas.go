package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

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
	merged, err := withRevisionInc(coll, id, update)
	if err != nil {
		return 0, err
	}
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

// UpdateIfRevision is [UpdateIfRevision] that, on FerretDB, reads and
// writes by _id under the Store's compare-and-set lock instead of sending a
// filter the server answers by scanning the collection (see
// [Store.UpdateIf]). Same errors.
func (s *Store) UpdateIfRevision(ctx context.Context, coll *mongo.Collection, id any, expected int64, update bson.M) (int64, error) {
	if !s.ferret {
		return UpdateIfRevision(ctx, coll, id, expected, update)
	}
	merged, err := withRevisionInc(coll, id, update)
	if err != nil {
		return 0, err
	}
	s.casMu.Lock()
	defer s.casMu.Unlock()
	var cur struct {
		Revision int64 `bson:"revision"`
	}
	err = coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&cur)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, fmt.Errorf("store: update %s %v: %w", coll.Name(), id, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("store: update %s %v at revision %d: %w", coll.Name(), id, expected, err)
	}
	if cur.Revision != expected {
		// No write was sent, so the command monitor saw none: bring the view up to what won
		// (marking takes no lock of ours).
		_ = s.view.Invalidate(ctx, coll, id)
		return 0, fmt.Errorf("store: update %s %v at revision %d: %w", coll.Name(), id, expected, ErrConflict)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, merged); err != nil {
		return 0, fmt.Errorf("store: update %s %v at revision %d: %w", coll.Name(), id, expected, err)
	}
	return expected + 1, nil
}

// ReplaceIfRevision replaces the document {_id: id} of coll by doc only if its revision field
// equals expected, as one compare-and-set; doc carries its own new revision (the caller sets
// expected+1). It reports whether the document matched; no document is a miss, not an error.
//
// On MongoDB it is one ReplaceOne with the filter {_id, revision}. On FerretDB it reads by _id,
// compares and replaces by _id under the lock every [Store.UpdateIf] shares, so a replacement
// never interleaves with another compare-and-set of the same document (an UpdateIf whose
// condition the replacement would falsify), and the server answers by _id instead of scanning.
func (s *Store) ReplaceIfRevision(ctx context.Context, coll *mongo.Collection, id any, expected int64, doc any) (bool, error) {
	if !s.ferret {
		res, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: RevisionField, Value: expected}}, doc)
		if err != nil {
			return false, fmt.Errorf("store: replace %s %v at revision %d: %w", coll.Name(), id, expected, err)
		}
		return res.MatchedCount == 1, nil
	}
	s.casMu.Lock()
	defer s.casMu.Unlock()
	if ok, err := s.matchesLocked(ctx, coll, id, bson.D{{Key: RevisionField, Value: expected}}); !ok || err != nil {
		if err == nil {
			_ = s.view.Invalidate(ctx, coll, id) // a miss sends no write: refresh the view's copy
		}
		return false, err
	}
	res, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}}, doc)
	if err != nil {
		return false, fmt.Errorf("store: replace %s %v at revision %d: %w", coll.Name(), id, expected, err)
	}
	return res.MatchedCount == 1, nil
}

// withRevisionInc returns update with revision incremented by one.
func withRevisionInc(coll *mongo.Collection, id any, update bson.M) (bson.M, error) {
	merged := make(bson.M, len(update)+1)
	for k, v := range update {
		merged[k] = v
	}
	inc := bson.M{}
	if v, ok := update["$inc"]; ok {
		m, ok := v.(bson.M)
		if !ok {
			return nil, fmt.Errorf("store: update %s %v: $inc must be a bson.M, got %T", coll.Name(), id, v)
		}
		for k, n := range m {
			inc[k] = n
		}
	}
	if _, ok := inc[RevisionField]; ok {
		return nil, fmt.Errorf("store: update %s %v: the update must not change %q itself", coll.Name(), id, RevisionField)
	}
	inc[RevisionField] = int64(1)
	merged["$inc"] = inc
	return merged, nil
}

// UpdateIf applies update to the document {_id: id} only when every field
// of cond equals its value in the stored document (equality on top-level
// fields: strings, booleans, integers of any width, nil), as one
// compare-and-set. It reports whether the document matched; no document is
// a miss, not an error.
//
// On MongoDB it is one UpdateOne with the filter {_id, cond...}. FerretDB v1
// reads a whole collection for any filter other than a lone _id, so on
// FerretDB (where this Store already holds the only connection and no
// second process may share the server) it reads by _id, compares, and
// writes by _id under a lock of this Store that every UpdateIf shares.
// Writers that bypass UpdateIf must not change the fields in cond.
func (s *Store) UpdateIf(ctx context.Context, coll *mongo.Collection, id any, cond bson.D, update bson.M) (bool, error) {
	if !s.ferret {
		filter := append(bson.D{{Key: "_id", Value: id}}, cond...)
		res, err := coll.UpdateOne(ctx, filter, update)
		if err != nil {
			return false, fmt.Errorf("store: update %s %v: %w", coll.Name(), id, err)
		}
		return res.MatchedCount == 1, nil
	}
	s.casMu.Lock()
	defer s.casMu.Unlock()
	if ok, err := s.matchesLocked(ctx, coll, id, cond); !ok || err != nil {
		if err == nil {
			_ = s.view.Invalidate(ctx, coll, id) // a miss sends no write: refresh the view's copy
		}
		return false, err
	}
	res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, update)
	if err != nil {
		return false, fmt.Errorf("store: update %s %v: %w", coll.Name(), id, err)
	}
	return res.MatchedCount == 1, nil
}

// matchesLocked reports whether the document {_id: id} exists and every field of cond equals
// its stored value (read by _id, compared with [sameValue]). casMu must be held.
func (s *Store) matchesLocked(ctx context.Context, coll *mongo.Collection, id any, cond bson.D) (bool, error) {
	var cur bson.M
	err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&cur)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: read %s %v: %w", coll.Name(), id, err)
	}
	for _, e := range cond {
		if !sameValue(cur[e.Key], e.Value) {
			return false, nil
		}
	}
	return true, nil
}

// sameValue compares a stored value with a condition value the way a
// MongoDB equality filter does for the types UpdateIf accepts: integers
// compare by value whatever their width, and named string, bool and integer
// types compare by their underlying value.
func sameValue(stored, want any) bool {
	if want == nil {
		return stored == nil
	}
	if stored == nil {
		return false
	}
	sv, wv := reflect.ValueOf(stored), reflect.ValueOf(want)
	switch {
	case isInt(sv.Kind()) && isInt(wv.Kind()):
		return sv.Int() == wv.Int()
	case sv.Kind() == reflect.String && wv.Kind() == reflect.String:
		return sv.String() == wv.String()
	case sv.Kind() == reflect.Bool && wv.Kind() == reflect.Bool:
		return sv.Bool() == wv.Bool()
	}
	return false
}

func isInt(k reflect.Kind) bool {
	return k == reflect.Int || k == reflect.Int8 || k == reflect.Int16 || k == reflect.Int32 || k == reflect.Int64
}

// DeleteIf deletes the document {_id: id} only when every field of cond equals its value in the
// stored document (as in [Store.UpdateIf]), as one compare-and-set. It reports whether a
// document was deleted; no document, or one that does not match, is a miss, not an error.
//
// On MongoDB it is one DeleteOne with the filter {_id, cond...}. On FerretDB it reads by _id,
// compares and deletes by _id under the lock every UpdateIf shares, for the reason UpdateIf
// gives.
func (s *Store) DeleteIf(ctx context.Context, coll *mongo.Collection, id any, cond bson.D) (bool, error) {
	if !s.ferret {
		res, err := coll.DeleteOne(ctx, append(bson.D{{Key: "_id", Value: id}}, cond...))
		if err != nil {
			return false, fmt.Errorf("store: delete %s %v: %w", coll.Name(), id, err)
		}
		return res.DeletedCount == 1, nil
	}
	s.casMu.Lock()
	defer s.casMu.Unlock()
	if ok, err := s.matchesLocked(ctx, coll, id, cond); !ok || err != nil {
		if err == nil {
			_ = s.view.Invalidate(ctx, coll, id) // a miss sends no write: refresh the view's copy
		}
		return false, err
	}
	res, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	if err != nil {
		return false, fmt.Errorf("store: delete %s %v: %w", coll.Name(), id, err)
	}
	return res.DeletedCount == 1, nil
}

// HoldCASForTest takes the Store's compare-and-set lock and returns its release: until then
// every compare-and-set of the embedded store waits, as it does behind a stalled store. Against
// a store that takes no such lock (MongoDB) it holds nothing.
func (s *Store) HoldCASForTest() (release func()) {
	if !s.ferret {
		return func() {}
	}
	s.casMu.Lock()
	var once sync.Once
	return func() { once.Do(s.casMu.Unlock) }
}
