package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
)

// Assignments on the plan log (docs/store.md section 2.3, docs/placement.md): with [WithPlans],
// an assignment is decided as before (the snapshot of open nodes, [Decide]) and submitted as one
// plan whose Decide re-checks it against the applier's view: the placement is still at the
// revision it was decided on, the node still takes the reservation. Its writes (the reservation,
// the release of a node it leaves, the placement's status and node, and for [Service.SetDesired]
// the desired state itself) are committed with the other plans of its batch as one insert. A
// plan that no longer fits is refused with [store.ErrConflict] and decided again from the view,
// which by then shows what won ([store.RetryOnConflict]).

// errReplan asks [store.RetryOnConflict] to decide again: the snapshot proposed nothing that fits,
// or the applier refused the plan.
var errReplan = fmt.Errorf("placement: decide again: %w", store.ErrConflict)

// assignPlanned is [Service.Assign] (desire nil) or [Service.SetDesired] (desire returns the next
// desired state of the placement as it is, nil when there is none) on the plan log.
func (s *Service) assignPlanned(ctx context.Context, projectID string, desire func(cur *Placement) (Placement, error)) (*Placement, error) {
	force := false
	var out *Placement
	err := store.RetryOnConflict(ctx, func() error {
		p, err := s.Get(ctx, projectID)
		if desire != nil && errors.Is(err, store.ErrNotFound) {
			p, err = nil, nil
		}
		if err != nil {
			return err
		}
		if desire == nil && p.Deleting {
			out = p // held by the project-delete workflow (SetDesired's Next refuses it)
			return nil
		}
		base := p // the placement as decided on: the plan checks it is still so
		if desire != nil {
			next, err := desire(p)
			if err != nil {
				return err
			}
			p = &next
		}
		nodes, fresh, err := s.candidates(ctx, p, force)
		if err != nil {
			return err
		}
		held := map[string]int{}
		for id, n := range nodes {
			if r, ok := n.Reservations[projectID]; ok {
				held[id] = r.Units
			}
		}
		act := Decide(p, nodes, held, s.nodes.Now())
		if act.Status == Waiting && !fresh {
			// As [Service.Assign]: read again what may fit before waiting.
			if s.recheck(ctx, p, nodes) {
				return errReplan
			}
			if s.snapshotAge() >= fleetRecheck {
				force = true
				return errReplan
			}
		}
		force = false
		next := *p
		next.Status, next.NodeID = act.Status, act.NodeID
		if act.Status == Assigned && p.Mode == Stateful {
			next.Pinned = true
		}
		changed := desire != nil || next.Status != p.Status || next.NodeID != p.NodeID || next.Pinned != p.Pinned
		if !changed && act.Reserve == "" {
			out = p
		} else {
			reserved, err := s.submitAssignment(ctx, base, &next, desire != nil, act)
			if err != nil {
				if act.Reserve != "" && errors.Is(err, store.ErrConflict) {
					// The node changed since the snapshot: read it again before the next decision.
					if n, gerr := s.nodes.Get(ctx, act.Reserve); gerr == nil {
						s.remember(act.Reserve, n)
					} else {
						s.remember(act.Reserve, nil)
					}
				}
				return err
			}
			if reserved != nil {
				s.remember(reserved.ID, reserved)
			}
			if act.Release != "" && act.Release != act.NodeID {
				s.forgetFleet()
			}
		}
		if moved := p.NodeID != next.NodeID; next.Status == Assigned && s.ops != nil && (moved || p.Enqueued != next.Generation) {
			if err := s.enqueue(ctx, &next, moved); err != nil {
				return err
			}
			// Later passes skip the enqueue of this generation; a lost write only repeats it.
			_, _ = s.plans.Submit(ctx, s.enqueuedPlan(projectID, next.Generation))
		}
		out, err = s.Get(ctx, projectID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// submitAssignment submits the plan that records next (decided on base: nil when the placement
// did not exist) with act's reservation and release, and returns the node as reserved (nil when
// act reserves nothing). whole writes every field of next, upserting the document; otherwise only
// the assignment's fields. Errors: wrapping [store.ErrConflict] when the applier's re-check
// refused it, or the applier's.
func (s *Service) submitAssignment(ctx context.Context, base, next *Placement, whole bool, act Action) (*runners.Node, error) {
	id := next.ProjectID
	coll := s.colls.For(id).Name()
	now := s.nodes.Now()
	res := runners.Reservation{Units: next.CapacityUnits, Labels: next.Requirements.Labels, Endpoint: next.Requirements.Endpoint, Generation: next.Generation, At: now}
	fits := next.fits(now)
	var set map[string]any
	if whole {
		raw, err := bson.Marshal(next)
		if err != nil {
			return nil, fmt.Errorf("placement: encode %s: %w", id, err)
		}
		var m bson.M
		if err := bson.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("placement: encode %s: %w", id, err)
		}
		delete(m, "_id")
		set = maps.Clone(map[string]any(m))
	} else {
		set = map[string]any{"status": next.Status, "node_id": next.NodeID, "pinned": next.Pinned}
	}
	var reserved *runners.Node
	plan := plans.Plan{Name: "assign " + id + " to " + act.NodeID, Decide: func(ctx context.Context, r plans.Reader) ([]store.PlanWrite, error) {
		var cur Placement
		err := r.Get(ctx, coll, id, &cur)
		switch {
		case base == nil && err == nil:
			return nil, fmt.Errorf("placement: %s was created meanwhile: %w", id, store.ErrConflict)
		case base == nil && errors.Is(err, store.ErrNotFound):
		case err != nil && errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("placement: %s was removed meanwhile: %w", id, store.ErrConflict)
		case err != nil:
			return nil, err
		case cur.Revision != base.Revision:
			return nil, fmt.Errorf("placement: %s changed meanwhile (revision %d, decided on %d): %w", id, cur.Revision, base.Revision, store.ErrConflict)
		}
		var ws []store.PlanWrite
		if act.Reserve != "" {
			w, n, err := s.nodes.PlanReserve(ctx, r, act.Reserve, id, res, fits)
			if err != nil {
				return nil, err
			}
			ws, reserved = append(ws, w), n
		}
		if act.Release != "" && act.Release != act.NodeID {
			w, err := s.nodes.PlanUnreserve(ctx, r, act.Release, id)
			if err != nil {
				return nil, err
			}
			if w != nil {
				ws = append(ws, *w)
			}
		}
		pw := store.PlanWrite{Coll: coll, ID: id, Set: maps.Clone(set)}
		if base == nil {
			pw.Set[store.RevisionField], pw.Upsert = int64(0), true
		} else {
			pw.Set[store.RevisionField] = base.Revision + 1
		}
		return append(ws, pw), nil
	}}
	if _, err := s.plans.Submit(ctx, plan); err != nil {
		return nil, err
	}
	return reserved, nil
}

// enqueuedPlan records that generation's reconcile operation of project id was enqueued, if the
// placement is still at that generation.
func (s *Service) enqueuedPlan(id string, generation int64) plans.Plan {
	coll := s.colls.For(id).Name()
	return plans.Plan{Name: "mark the reconcile of " + id + " enqueued", Decide: func(ctx context.Context, r plans.Reader) ([]store.PlanWrite, error) {
		var cur Placement
		if err := r.Get(ctx, coll, id, &cur); err != nil {
			return nil, err
		}
		if cur.Generation != generation || cur.Enqueued == generation {
			return nil, nil
		}
		return []store.PlanWrite{{Coll: coll, ID: id, Set: map[string]any{"enqueued": generation, store.RevisionField: cur.Revision + 1}}}, nil
	}}
}
