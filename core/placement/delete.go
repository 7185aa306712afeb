package placement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// DeletionsCollection holds the intent record of each project-delete workflow in progress, keyed
// by project id.
const DeletionsCollection = "placement_deletions"

// Deletion states reported by [Service.Delete].
const (
	DeleteDone            = "deleted"
	DeleteWaitingProvider = "waiting_for_provider"
)

// DeleteResult is where a project-delete workflow stands after [Service.Delete].
type DeleteResult struct {
	// Status is [DeleteDone] or [DeleteWaitingProvider] (call Delete again once the provider's
	// delete operation has settled).
	Status string `json:"status"`
	// ProviderOperation is the provider's delete operation, for a provider placement.
	ProviderOperation string `json:"provider_operation,omitempty"`
	// ProviderState is that operation's state when it settled.
	ProviderState string `json:"provider_state,omitempty"`
	// Revoked is how many operations this call revoked.
	Revoked int `json:"revoked"`
}

type deletion struct {
	ProjectID string    `bson:"_id"`
	StartedAt time.Time `bson:"started_at"`
}

// Delete runs the orchestration part of deleting a project (docs/runner-protocol.md section 4.1)
// as idempotent steps, with an intent record first, so a call interrupted at any step is finished
// by calling it again:
//
//  1. record the intent;
//  2. hold the placement (no new generation, no new assignment);
//  3. for a provider placement on a node, enqueue the provider's delete operation and wait (status
//     [DeleteWaitingProvider]) until it settles;
//  4. revoke every operation of the project;
//  5. remove the placement and release its reservation;
//  6. remove the project's fence sequence, only once none of its operations is live;
//  7. drop the intent record.
//
// Run it under the project lease. A project without placement or operations is deleted at once.
func (s *Service) Delete(ctx context.Context, projectID string) (*DeleteResult, error) {
	if s.ops == nil {
		return nil, fmt.Errorf("placement: delete %s: no operation queue", projectID)
	}
	dels := s.colls.For(projectID).Database().Collection(DeletionsCollection)
	if _, err := dels.InsertOne(ctx, deletion{ProjectID: projectID, StartedAt: s.nodes.Now()}); err != nil && !store.IsDuplicateKey(err) {
		return nil, fmt.Errorf("placement: delete %s: record the intent: %w", projectID, err)
	}
	res := &DeleteResult{}
	p, err := s.hold(ctx, projectID)
	if err != nil {
		return nil, err
	}
	if p != nil && p.Provider && p.NodeID != "" {
		op, err := s.Lifecycle(ctx, projectID, KindDelete)
		if err != nil {
			return nil, err
		}
		res.ProviderOperation = op.ID
		if !op.State.Terminal() {
			res.Status = DeleteWaitingProvider
			return res, nil
		}
		res.ProviderState = string(op.State)
	}
	if res.Revoked, err = s.ops.RevokeOperations(ctx, projectID); err != nil {
		return nil, err
	}
	if err := s.Remove(ctx, projectID); err != nil {
		return nil, err
	}
	if err := s.ops.RemoveFenceSequence(ctx, projectID); err != nil {
		return nil, err
	}
	if _, err := dels.DeleteOne(ctx, bson.D{{Key: "_id", Value: projectID}}); err != nil {
		return nil, fmt.Errorf("placement: delete %s: drop the intent: %w", projectID, err)
	}
	res.Status = DeleteDone
	return res, nil
}

// hold marks the placement as being deleted (one compare-and-set); nil when there is none.
func (s *Service) hold(ctx context.Context, projectID string) (*Placement, error) {
	var out *Placement
	err := store.RetryOnConflict(ctx, func() error {
		p, err := s.Get(ctx, projectID)
		if errors.Is(err, store.ErrNotFound) {
			out = nil
			return nil
		}
		if err != nil {
			return err
		}
		if p.Deleting {
			out = p
			return nil
		}
		rev, err := store.UpdateIfRevision(ctx, s.colls.For(projectID), projectID, p.Revision, bson.M{"$set": bson.M{"deleting": true}})
		if err != nil {
			return fmt.Errorf("placement: hold %s: %w", projectID, err)
		}
		p.Deleting, p.Revision = true, rev
		out = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
