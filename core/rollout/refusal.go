package rollout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
)

// RefusalsCollection holds at most one document per service: the latest change to what the
// service runs that a policy refused with no caller to answer (core/deploy), so the verdict
// shows it until the service is written again.
const RefusalsCollection = "deploy_refusals"

// DeployRefusal is a document of [RefusalsCollection].
type DeployRefusal struct {
	ServiceID string `bson:"_id"`
	// ServiceRevision is the revision the refused change was judged against; the refusal is
	// shown only while the service is still at it.
	ServiceRevision int64     `bson:"service_revision"`
	Cause           string    `bson:"cause"`
	Module          string    `bson:"module"`
	Reason          string    `bson:"reason"`
	At              time.Time `bson:"at"`
}

// Verdict returns the verdict the refusal shows: refused(policy: <module>: <reason>).
func (r *DeployRefusal) Verdict(specRevision int64) slots.Verdict {
	reason := "policy: " + r.Module
	if r.Reason != "" {
		reason += ": " + r.Reason
	}
	return slots.Verdict{SpecRevision: specRevision, State: slots.Refused, Reason: slots.Reason(reason)}
}

// PutRefusal records r as the service's latest refused change (one write by _id; the latest
// refusal wins).
func (s *Store) PutRefusal(ctx context.Context, r DeployRefusal) error {
	r.At = r.At.UTC()
	if _, err := s.refusals.ReplaceOne(ctx, bson.D{{Key: "_id", Value: r.ServiceID}}, r, replaceUpsert()); err != nil {
		return fmt.Errorf("record the refused change of %s: %w", r.ServiceID, err)
	}
	return nil
}

// Refusal returns the service's latest refused change, nil when there is none.
func (s *Store) Refusal(ctx context.Context, serviceID string) (*DeployRefusal, error) {
	var r DeployRefusal
	err := s.st.View().Get(ctx, s.refusals, serviceID, &r)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}
