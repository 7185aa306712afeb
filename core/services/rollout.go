package services

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
)

// RolloutAction is what `berth rollout pause|resume|restart` asks of a service's rollout.
type RolloutAction string

// Rollout actions (docs/reconciliation.md section 5.2).
const (
	// RolloutPause holds the rollout where it is: no replacement begins; those under way finish.
	RolloutPause RolloutAction = "pause"
	// RolloutResume lets a paused rollout continue.
	RolloutResume RolloutAction = "resume"
	// RolloutRestart replaces every replica under the rollout's bounds: a new restart
	// generation, which is part of every replica's desired attempt key.
	RolloutRestart RolloutAction = "restart"
)

// ErrRolloutAction is returned by [Catalog.ControlRollout] for an action it does not know.
var ErrRolloutAction = errors.New("berth: unknown rollout action")

// ControlRollout writes action to the rollout of the service name in p with one
// compare-and-set on its revision (expected, when not nil, is the revision the caller read),
// recorded in the change log as any service write, and returns the service after it and
// whether it wrote. Pausing a paused service and resuming a running one write nothing
// (idempotent); every restart writes a new generation. It judges nothing: the one caller
// outside tests is core/deploy's ControlRollout, which runs the admission policies first and
// passes the revision they judged as expected. Errors: ErrServiceNotFound,
// ErrServiceDeleting, ErrRevisionConflict, ErrRolloutAction.
func (c *Catalog) ControlRollout(ctx context.Context, p *Project, name string, action RolloutAction, expected *int64) (*Service, bool, error) {
	cur, err := c.GetService(ctx, p, name)
	if err != nil {
		return nil, false, err
	}
	switch {
	case expected != nil && *expected != cur.Revision:
		return nil, false, fmt.Errorf("%w: service %s/%s is at revision %d, not %d", ErrRevisionConflict, p.Name, name, cur.Revision, *expected)
	case cur.Deleting:
		return nil, false, fmt.Errorf("%w: %s/%s", ErrServiceDeleting, p.Name, name)
	}
	next := *cur
	set := bson.M{}
	switch action {
	case RolloutPause, RolloutResume:
		paused := action == RolloutPause
		if cur.RolloutPaused == paused {
			cur.LogOutbox = nil // nothing written, nothing to log
			return cur, false, nil
		}
		next.RolloutPaused, set["rollout_paused"] = paused, paused
	case RolloutRestart:
		next.RestartGeneration++
		set["restart_generation"] = next.RestartGeneration
	default:
		return nil, false, fmt.Errorf("%w: %q", ErrRolloutAction, action)
	}
	next.Revision, next.UpdatedAt = cur.Revision+1, c.now().UTC()
	// The reconcile request rides in the same compare-and-set: the pause, the resume or the
	// restart takes effect at the focused pass it wakes, not at the next sweep.
	next.Reconcile = newRequest("rollout."+string(action), next.Revision, next.UpdatedAt)
	set["updated_at"], set[reconcileField] = next.UpdatedAt, next.Reconcile
	update := bson.M{"$set": set}
	pend, logged, err := logChange(ctx, cur.ID, node.OpUpdate, &next)
	if err != nil {
		return nil, false, err
	}
	if logged {
		update["$push"] = bson.M{changelog.OutboxField: pend}
		next.LogOutbox = append(slices.Clip(next.LogOutbox), pend)
	}
	if _, err := c.st.UpdateIfRevision(ctx, c.services, cur.ID, cur.Revision, update); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			return nil, false, fmt.Errorf("%w: service %s/%s changed concurrently", ErrRevisionConflict, p.Name, name)
		}
		return nil, false, fmt.Errorf("%s rollout of %s/%s: %w", action, p.Name, name, err)
	}
	return &next, true, nil
}
