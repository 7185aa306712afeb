package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/scheduler"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one placement document per project.
const Collection = "placements"

// KindReconcile is the kind of the operation that asks the assigned node to converge on a generation.
const KindReconcile = "reconcile"

// SweepGrace is how old a reservation must be before [Service.SweepReservations] may release it: an
// assignment reserves on the node first and records the placement second.
const SweepGrace = time.Minute

const attempts = 16

// ReconcilePayload is the canonical payload of a reconcile operation.
type ReconcilePayload struct {
	Generation int64    `json:"generation"`
	Release    string   `json:"release"`
	State      RunState `json:"state"`
}

// Service sets desired placements and assigns them to runner nodes. Safe for concurrent use by
// several berthd processes on one store.
type Service struct {
	coll  *mongo.Collection
	nodes *runners.Registry
	ops   *operations.Queue
}

// NewService returns a Service. ops may be nil (no reconcile operations are enqueued).
func NewService(s *store.Store, nodes *runners.Registry, ops *operations.Queue) *Service {
	return &Service{coll: s.Collection(Collection), nodes: nodes, ops: ops}
}

// Get returns a project's placement. Errors: wrapping [store.ErrNotFound].
func (s *Service) Get(ctx context.Context, projectID string) (*Placement, error) {
	var p Placement
	if err := store.FindByID(ctx, s.coll, projectID, &p); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return &p, nil
}

func (s *Service) write(ctx context.Context, cur *Placement, next Placement) (Placement, error) {
	if cur == nil {
		next.Revision = 0
		if _, err := s.coll.InsertOne(ctx, next); err != nil {
			if store.IsDuplicateKey(err) {
				return next, store.ErrConflict
			}
			return next, err
		}
		return next, nil
	}
	raw, err := bson.Marshal(next)
	if err != nil {
		return next, err
	}
	var set bson.M
	if err := bson.Unmarshal(raw, &set); err != nil {
		return next, err
	}
	delete(set, "_id")
	delete(set, "revision")
	rev, err := store.UpdateIfRevision(ctx, s.coll, cur.ProjectID, cur.Revision, bson.M{"$set": set})
	next.Revision = rev
	return next, err
}

// SetDesired records the next desired generation of a project's placement ([Next], one
// compare-and-set on the placement document) and then assigns it ([Service.Assign]). Errors:
// [ErrInvalid], [ErrModeImmutable], [ErrPinned] (wrapped).
func (s *Service) SetDesired(ctx context.Context, projectID string, req DesiredRequest) (*Placement, error) {
	for i := 0; i < attempts; i++ {
		cur, err := s.Get(ctx, projectID)
		if errors.Is(err, store.ErrNotFound) {
			cur, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		next, err := Next(cur, req, s.nodes.Now())
		if err != nil {
			return nil, fmt.Errorf("placement: %s: %w", projectID, err)
		}
		next.ProjectID = projectID
		if _, err := s.write(ctx, cur, next); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("placement: write %s: %w", projectID, err)
		}
		return s.Assign(ctx, projectID)
	}
	return nil, fmt.Errorf("placement: %s: %w", projectID, store.ErrConflict)
}

// candidates reads the nodes p may use: online, unrevoked, undraining nodes of its region (every
// region when it names none), plus p's current node whatever its state.
func (s *Service) candidates(ctx context.Context, p *Placement) (map[string]*runners.Node, error) {
	open := bson.M{"revoked": false, "draining": false, "expires_at": bson.M{"$gt": s.nodes.Now()}}
	if p.Region != "" {
		open["region"] = p.Region
	}
	filter := open
	if p.NodeID != "" {
		filter = bson.M{"$or": bson.A{bson.M{"_id": p.NodeID}, open}}
	}
	ns, err := s.nodes.Find(ctx, filter)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*runners.Node, len(ns))
	for i := range ns {
		out[ns[i].ID] = &ns[i]
	}
	return out, nil
}

// Assign brings a project's placement to a node ([Decide]): selection and reservation are one
// compare-and-set on the chosen node's document; the placement records the node with a second
// compare-and-set, and a reservation orphaned by a lost second step is released (or left to
// [Service.SweepReservations]). An assigned placement gets a reconcile operation for its generation,
// targeted at its node. It returns the placement as recorded.
func (s *Service) Assign(ctx context.Context, projectID string) (*Placement, error) {
	for i := 0; i < attempts; i++ {
		p, err := s.Get(ctx, projectID)
		if err != nil {
			return nil, err
		}
		nodes, err := s.candidates(ctx, p)
		if err != nil {
			return nil, err
		}
		now := s.nodes.Now()
		cands := make(map[string]scheduler.Candidate, len(nodes))
		held := map[string]int{}
		for id, n := range nodes {
			cands[id] = n.Candidate(now)
			if r, ok := n.Reservations[projectID]; ok {
				held[id] = r.Units
			}
		}
		act := Decide(p, cands, held)
		if act.Reserve != "" {
			res := runners.Reservation{Units: p.CapacityUnits, Labels: p.Requirements.Labels, Endpoint: p.Requirements.Endpoint, Generation: p.Generation, At: now}
			err := s.nodes.TryReserve(ctx, nodes[act.Reserve], projectID, res, p.Demand())
			if errors.Is(err, store.ErrConflict) || errors.Is(err, runners.ErrNoFit) {
				continue // the node changed under us: read again and select again
			}
			if err != nil {
				return nil, err
			}
		}
		next := *p
		next.Status, next.NodeID = act.Status, act.NodeID
		if act.Status == Assigned && p.Mode == Stateful {
			next.Pinned = true
		}
		changed := next.Status != p.Status || next.NodeID != p.NodeID || next.Pinned != p.Pinned
		if changed {
			if _, err := s.write(ctx, p, next); err != nil {
				if act.Reserve != "" && act.Reserve != p.NodeID {
					_ = s.nodes.Unreserve(context.WithoutCancel(ctx), act.Reserve, projectID)
				}
				if errors.Is(err, store.ErrConflict) {
					continue
				}
				return nil, fmt.Errorf("placement: record assignment of %s: %w", projectID, err)
			}
		}
		if act.Release != "" && act.Release != act.NodeID {
			if err := s.nodes.Unreserve(ctx, act.Release, projectID); err != nil {
				return nil, err
			}
		}
		if next.Status == Assigned && s.ops != nil {
			if err := s.enqueue(ctx, &next); err != nil {
				return nil, err
			}
		}
		return s.Get(ctx, projectID)
	}
	return nil, fmt.Errorf("placement: assign %s: %w", projectID, store.ErrConflict)
}

func (s *Service) enqueue(ctx context.Context, p *Placement) error {
	payload, _ := json.Marshal(ReconcilePayload{Generation: p.Generation, Release: p.Release, State: p.State})
	_, _, err := s.ops.Enqueue(ctx, operations.EnqueueRequest{ProjectID: p.ProjectID, Kind: KindReconcile,
		IdempotencyKey: "generation:" + strconv.FormatInt(p.Generation, 10), Payload: payload, TargetNode: p.NodeID})
	if err != nil && !errors.Is(err, operations.ErrIdempotencyKeyReused) {
		return fmt.Errorf("placement: enqueue reconcile of %s: %w", p.ProjectID, err)
	}
	// A failover moves the work of the project to the new node, reclaims included.
	return s.ops.RetargetProject(ctx, p.ProjectID, p.NodeID)
}

// Observe records what the assigned node runs, with one compare-and-set guarded by [Observe].
// Errors: wrapping [ErrStale] for a report from another node or for an older generation than the
// one recorded.
func (s *Service) Observe(ctx context.Context, projectID string, obs Observation) (*Placement, error) {
	for i := 0; i < attempts; i++ {
		p, err := s.Get(ctx, projectID)
		if err != nil {
			return nil, err
		}
		if err := Observe(p, obs); err != nil {
			return nil, fmt.Errorf("placement: observe %s generation %d: %w", projectID, obs.Generation, err)
		}
		obs.At = s.nodes.Now()
		_, err = store.UpdateIfRevision(ctx, s.coll, projectID, p.Revision, bson.M{"$set": bson.M{"observed": obs}})
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("placement: observe %s: %w", projectID, err)
		}
		return s.Get(ctx, projectID)
	}
	return nil, fmt.Errorf("placement: observe %s: %w", projectID, store.ErrConflict)
}

// List returns every placement.
func (s *Service) List(ctx context.Context) ([]Placement, error) {
	cur, err := s.coll.Find(ctx, bson.M{})
	if err != nil {
		return nil, fmt.Errorf("placement: list: %w", err)
	}
	out := []Placement{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("placement: list: %w", err)
	}
	return out, nil
}

// Pass assigns every placement (failover of portable placements, waiting ones when capacity
// appears, unavailable stateful ones when their node returns) and sweeps orphaned reservations.
func (s *Service) Pass(ctx context.Context) error {
	ps, err := s.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ps {
		if _, err := s.Assign(ctx, p.ProjectID); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := s.SweepReservations(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SweepReservations releases every reservation older than [SweepGrace] that no placement references
// (its project has no placement, or the placement is on another node) and returns how many.
func (s *Service) SweepReservations(ctx context.Context) (int, error) {
	ns, err := s.nodes.List(ctx)
	if err != nil {
		return 0, err
	}
	now := s.nodes.Now()
	n := 0
	for _, node := range ns {
		for key, r := range node.Reservations {
			if now.Sub(r.At) < SweepGrace {
				continue
			}
			p, err := s.Get(ctx, key)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return n, err
			}
			if err == nil && p.NodeID == node.ID {
				continue
			}
			if err := s.nodes.Unreserve(ctx, node.ID, key); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// Remove deletes a project's placement after releasing its reservation (project deletion, under the
// project lease, after its operations were revoked). Idempotent.
func (s *Service) Remove(ctx context.Context, projectID string) error {
	p, err := s.Get(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if p.NodeID != "" {
		if err := s.nodes.Unreserve(ctx, p.NodeID, projectID); err != nil {
			return err
		}
	}
	if _, err := s.coll.DeleteOne(ctx, bson.M{"_id": projectID}); err != nil {
		return fmt.Errorf("placement: remove %s: %w", projectID, err)
	}
	return nil
}
