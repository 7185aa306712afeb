package secrets

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// setLogView is what the change log records of a set: its references (names and versions).
type setLogView struct {
	Project string         `json:"project"`
	Name    string         `json:"name"`
	Secrets map[string]Ref `json:"secrets"`
	Deleted bool           `json:"deleted,omitempty"`
}

// GetSet returns the set name of project projectID. Errors: wrapping [ErrSetNotFound].
func (s *Store) GetSet(ctx context.Context, projectID, name string) (*Set, error) {
	set, err := s.getSet(ctx, projectID, name)
	if err == nil && set.Deleted {
		return nil, fmt.Errorf("%w: %q", ErrSetNotFound, name)
	}
	return set, err
}

func (s *Store) getSet(ctx context.Context, projectID, name string) (*Set, error) {
	var set Set
	err := store.FindByID(ctx, s.sets, DocID(projectID, name), &set)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %q", ErrSetNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: get set %s: %w", name, err)
	}
	return &set, nil
}

// ListSets returns the project's sets by name (a scan by project_id, for the API).
func (s *Store) ListSets(ctx context.Context, projectID string) ([]Set, error) {
	cur, err := s.sets.Find(ctx, bson.M{"project_id": projectID}, options.Find().SetSort(bson.D{{Key: "name", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("secrets: list sets: %w", err)
	}
	var all []Set
	if err := cur.All(ctx, &all); err != nil {
		return nil, fmt.Errorf("secrets: list sets: %w", err)
	}
	out := []Set{}
	for _, x := range all {
		if !x.Deleted {
			out = append(out, x)
		}
	}
	return out, nil
}

// ValidateRefs checks refs (environment name to reference) and that every secret and pinned
// version exists in the project. Errors: wrapping [ErrInvalid], or [ErrNotFound] /
// [ErrVersionNotFound] naming the first missing secret (by key order).
func (s *Store) ValidateRefs(ctx context.Context, projectID string, refs map[string]Ref) error {
	for _, key := range slices.Sorted(maps.Keys(refs)) {
		r := refs[key]
		if err := r.Validate(key); err != nil {
			return err
		}
		if _, _, err := s.Resolve(ctx, projectID, r.Secret, r.Version); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	return nil
}

// PutSet writes set name with refs (replacing its references), with one compare-and-set (an
// insert when new) carrying its change-log entry. expected, when not nil, is the revision the
// caller read (0: the set must not exist). Errors: wrapping [ErrInvalid], [ErrNotFound] or
// [ErrVersionNotFound] for a reference, [ErrConflict].
func (s *Store) PutSet(ctx context.Context, projectID, project, name string, refs map[string]Ref, expected *int64) (*Set, bool, error) {
	if !ValidName(name) {
		return nil, false, fmt.Errorf("%w: set name %q is not a DNS label", ErrInvalid, name)
	}
	if len(refs) > MaxSetEntries {
		return nil, false, fmt.Errorf("%w: a set holds at most %d secrets", ErrInvalid, MaxSetEntries)
	}
	if err := s.ValidateRefs(ctx, projectID, refs); err != nil {
		return nil, false, err
	}
	if refs == nil {
		refs = map[string]Ref{}
	}
	now := s.now().UTC()
	cur, err := s.getSet(ctx, projectID, name)
	fresh := errors.Is(err, ErrSetNotFound)
	if err != nil && !fresh {
		return nil, false, err
	}
	var curRev int64
	if !fresh && !cur.Deleted {
		curRev = cur.Revision
	}
	if expected != nil && *expected != curRev {
		return nil, false, fmt.Errorf("%w: set %s is at revision %d, not %d", ErrConflict, name, curRev, *expected)
	}
	if !fresh && !cur.Deleted && maps.Equal(cur.Secrets, refs) {
		cur.LogOutbox = nil
		return cur, false, nil // the same set again: nothing written
	}
	next := Set{ID: DocID(projectID, name), ProjectID: projectID, Project: project, Name: name, Secrets: refs, CreatedAt: now, UpdatedAt: now, Revision: 1}
	op := node.OpCreate
	if !fresh {
		next.LogOutbox, next.Revision = cur.LogOutbox, cur.Revision+1
		if !cur.Deleted {
			next.CreatedAt, op = cur.CreatedAt, node.OpUpdate
		}
	}
	pend, logged, err := logChange(ctx, "secret_set", next.ID, op, setLogView{Project: project, Name: name, Secrets: refs})
	if err != nil {
		return nil, false, err
	}
	if logged {
		next.LogOutbox = append(slices.Clip(next.LogOutbox), pend)
	}
	if fresh {
		if _, err := s.sets.InsertOne(ctx, next); err != nil {
			if store.IsDuplicateKey(err) {
				return nil, false, fmt.Errorf("%w: set %s", ErrConflict, name)
			}
			return nil, false, fmt.Errorf("secrets: put set %s: %w", name, err)
		}
		return &next, true, nil
	}
	update := bson.M{"$set": bson.M{"secrets": refs, "deleted": false, "created_at": next.CreatedAt, "updated_at": now, "project": project}}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
	}
	if _, err := s.st.UpdateIfRevision(ctx, s.sets, cur.ID, cur.Revision, update); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return nil, false, fmt.Errorf("%w: set %s", ErrConflict, name)
		}
		return nil, false, fmt.Errorf("secrets: put set %s: %w", name, err)
	}
	return &next, op == node.OpCreate, nil
}

// DeleteSet turns set name into a tombstone with one compare-and-set carrying its change-log
// entry. The caller checked that no service attaches it. Errors: wrapping [ErrSetNotFound],
// [ErrConflict].
func (s *Store) DeleteSet(ctx context.Context, projectID, name string, expected *int64) (*Set, error) {
	cur, err := s.GetSet(ctx, projectID, name)
	if err != nil {
		return nil, err
	}
	if expected != nil && *expected != cur.Revision {
		return nil, fmt.Errorf("%w: set %s is at revision %d, not %d", ErrConflict, name, cur.Revision, *expected)
	}
	next := *cur
	next.Deleted, next.Secrets, next.UpdatedAt, next.Revision = true, map[string]Ref{}, s.now().UTC(), cur.Revision+1
	update := bson.M{"$set": bson.M{"deleted": true, "secrets": bson.M{}, "updated_at": next.UpdatedAt}}
	pend, logged, err := logChange(ctx, "secret_set", cur.ID, node.OpDelete, setLogView{Project: cur.Project, Name: name, Secrets: map[string]Ref{}, Deleted: true})
	if err != nil {
		return nil, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
		next.LogOutbox = append(slices.Clip(next.LogOutbox), pend)
	}
	if _, err := s.st.UpdateIfRevision(ctx, s.sets, cur.ID, cur.Revision, update); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: set %s", ErrConflict, name)
		}
		return nil, fmt.Errorf("secrets: delete set %s: %w", name, err)
	}
	return &next, nil
}
