package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/buckets"
)

// Collection names the placements: one document per project, spread over [Buckets] collections
// "placements_bNN" by a hash of the project id ([Collections]).
const Collection = "placements"

// Buckets is how many collections hold the placements; part of the storage layout.
const Buckets = 32

// Collections returns the collections that hold the placements in st.
func Collections(st *store.Store) *buckets.Set { return buckets.New(st.DB(), Collection, Buckets) }

// fleetTTL is how long a snapshot of the open nodes proposes candidates before it is read again.
// The snapshot only proposes: the chosen node is read again by id and reserved with a
// compare-and-set on its document, so a stale snapshot costs a retry, never a wrong reservation.
const fleetTTL = 2 * time.Second

// KindReconcile is the kind of the operation that asks the assigned node to converge on a generation.
const KindReconcile = "reconcile"

// SweepGrace is how old a reservation must be before [Service.SweepReservations] may release it: an
// assignment reserves on the node first and records the placement second.
const SweepGrace = time.Minute

const attempts = 16

// Kinds of the lifecycle operations of provider placements (docs/runner-protocol.md section 6.3).
const (
	KindRollback = "rollback"
	KindDelete   = "delete"
)

// RuntimeProtocol marks the reconcile payload of a provider placement.
const RuntimeProtocol = "berth-runtime/1"

// ReconcilePayload is the canonical payload of a reconcile operation.
type ReconcilePayload struct {
	Generation int64    `json:"generation"`
	Release    string   `json:"release"`
	State      RunState `json:"state"`
	// Protocol is RuntimeProtocol for a provider placement, empty otherwise.
	Protocol string `json:"protocol,omitempty"`
}

// LifecyclePayload is the canonical payload of a rollback or delete operation: only the exact
// current generation.
type LifecyclePayload struct {
	Generation int64 `json:"generation"`
}

// Service sets desired placements and assigns them to runner nodes. Safe for concurrent use by
// several berthd processes on one store.
type Service struct {
	colls *buckets.Set
	view  *store.View
	nodes *runners.Registry
	ops   *operations.Queue

	mu    sync.Mutex
	fleet map[string]*runners.Node // open nodes as last read; mu must be held
	at    time.Time                // when fleet was read (registry clock)
	epoch int64                    // the registry's change count when fleet was read
}

// NewService returns a Service. ops may be nil (no reconcile operations are enqueued).
func NewService(s *store.Store, nodes *runners.Registry, ops *operations.Queue) *Service {
	return &Service{colls: Collections(s), view: s.View(), nodes: nodes, ops: ops}
}

// snapshot returns the open nodes (online, unrevoked, undraining) as last read, reading them again
// when force is set, the snapshot is older than fleetTTL, or the registry changed a node's
// declaration since. fresh reports whether it was read by this call.
func (s *Service) snapshot(ctx context.Context, force bool) (nodes map[string]*runners.Node, fresh bool, err error) {
	now := s.nodes.Now()
	s.mu.Lock()
	if !force && s.fleet != nil && now.Sub(s.at) < fleetTTL && now.Sub(s.at) >= 0 && s.epoch == s.nodes.Changes() {
		out := make(map[string]*runners.Node, len(s.fleet))
		for id, n := range s.fleet {
			out[id] = n
		}
		s.mu.Unlock()
		return out, false, nil
	}
	s.mu.Unlock()
	epoch := s.nodes.Changes()
	ns, err := s.nodes.List(ctx) // from the read view; open nodes are chosen here
	if err != nil {
		return nil, false, err
	}
	fleet := make(map[string]*runners.Node, len(ns))
	for i := range ns {
		if n := &ns[i]; !n.Revoked && !n.Draining && n.ExpiresAt.After(now) {
			fleet[n.ID] = n
		}
	}
	s.mu.Lock()
	s.fleet, s.at, s.epoch = fleet, now, epoch
	s.mu.Unlock()
	out := make(map[string]*runners.Node, len(fleet))
	for id, n := range fleet {
		out[id] = n
	}
	return out, true, nil
}

// fleetRecheck is the age below which a snapshot is not read again for a placement that would
// wait: the few matching nodes are read by id instead ([Service.recheck]).
const fleetRecheck = 250 * time.Millisecond

// maxRecheck bounds how many nodes [Service.recheck] reads by id.
const maxRecheck = 16

// snapshotAge returns how old the snapshot is (registry clock); a long time when there is none.
func (s *Service) snapshotAge() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil {
		return time.Duration(1<<63 - 1)
	}
	return s.nodes.Now().Sub(s.at)
}

// recheck reads by id the candidates of p whose region, labels and endpoint match its demand (at
// most maxRecheck of them), records them in the snapshot, and reports whether one of them fits p
// now.
func (s *Service) recheck(ctx context.Context, p *Placement, nodes map[string]*runners.Node) bool {
	req := p.Request()
	var ids []string
	for id, n := range nodes {
		if code, _ := Satisfied(req, RunnerNode(n, s.nodes.Now())); code == "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 || len(ids) > maxRecheck {
		return false
	}
	fits := false
	for _, id := range ids {
		n, err := s.nodes.Get(ctx, id)
		if err != nil {
			s.remember(id, nil)
			continue
		}
		s.remember(id, n)
		c := RunnerNode(n, s.nodes.Now())
		if r, ok := n.Reservations[p.ProjectID]; ok {
			c.Used = units(n.Reserved - r.Units)
		}
		if code, _ := Feasible(req, c); code == "" {
			fits = true
		}
	}
	return fits
}

// remember records n as read (or drops id when n is nil) in the snapshot.
func (s *Service) remember(id string, n *runners.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleet == nil {
		return
	}
	if n == nil {
		delete(s.fleet, id)
		return
	}
	s.fleet[id] = n
}

// forgetFleet drops the snapshot (capacity was released: the next placement reads the nodes).
func (s *Service) forgetFleet() {
	s.mu.Lock()
	s.fleet = nil
	s.mu.Unlock()
}

// Get returns a project's placement. Errors: wrapping [store.ErrNotFound].
func (s *Service) Get(ctx context.Context, projectID string) (*Placement, error) {
	var p Placement
	if err := s.view.Get(ctx, s.colls.For(projectID), projectID, &p); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return &p, nil
}

func (s *Service) write(ctx context.Context, cur *Placement, next Placement) (Placement, error) {
	if cur == nil {
		next.Revision = 0
		if _, err := s.colls.For(next.ProjectID).InsertOne(ctx, next); err != nil {
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
	rev, err := store.UpdateIfRevision(ctx, s.colls.For(cur.ProjectID), cur.ProjectID, cur.Revision, bson.M{"$set": set})
	next.Revision = rev
	return next, err
}

// SetDesired records the next desired generation of a project's placement ([Next], one
// compare-and-set on the placement document) and then assigns it ([Service.Assign]). Errors:
// [ErrInvalid], [ErrModeImmutable], [ErrPinned] (wrapped).
func (s *Service) SetDesired(ctx context.Context, projectID string, req DesiredRequest) (*Placement, error) {
	err := store.RetryOnConflict(ctx, func() error {
		cur, err := s.Get(ctx, projectID)
		if errors.Is(err, store.ErrNotFound) {
			cur, err = nil, nil
		}
		if err != nil {
			return err
		}
		next, err := Next(cur, req, s.nodes.Now())
		if err != nil {
			return fmt.Errorf("placement: %s: %w", projectID, err)
		}
		next.ProjectID = projectID
		if _, err := s.write(ctx, cur, next); err != nil {
			return fmt.Errorf("placement: write %s: %w", projectID, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.Assign(ctx, projectID)
}

// candidates returns the nodes p may use: the open nodes of its region (every region when it names
// none) from the snapshot, plus p's current node read by id whatever its state.
func (s *Service) candidates(ctx context.Context, p *Placement, force bool) (map[string]*runners.Node, bool, error) {
	fleet, fresh, err := s.snapshot(ctx, force)
	if err != nil {
		return nil, false, err
	}
	out := make(map[string]*runners.Node, len(fleet))
	for id, n := range fleet {
		if p.Region == "" || n.Region == p.Region {
			out[id] = n
		}
	}
	if p.NodeID != "" {
		n, err := s.nodes.Get(ctx, p.NodeID)
		switch {
		case errors.Is(err, runners.ErrNotFound):
			delete(out, p.NodeID)
		case err != nil:
			return nil, false, err
		default:
			out[p.NodeID] = n
		}
	}
	return out, fresh, nil
}

// Assign brings a project's placement to a node ([Decide]): the nodes come from a short-lived
// snapshot, the chosen node is read again by id, and selection and reservation are one
// compare-and-set on that node's document; the placement records the node with a second
// compare-and-set, and a reservation orphaned by a lost second step is released (or left to
// [Service.SweepReservations]). A placement that would wait reads the nodes afresh once before it
// does. An assigned placement gets a reconcile operation for its generation, targeted at its node.
// It returns the placement as recorded.
func (s *Service) Assign(ctx context.Context, projectID string) (*Placement, error) {
	force := false
	for i := 0; i < attempts; i++ {
		p, err := s.Get(ctx, projectID)
		if err != nil {
			return nil, err
		}
		if p.Deleting {
			return p, nil // held by the project-delete workflow
		}
		nodes, fresh, err := s.candidates(ctx, p, force)
		if err != nil {
			return nil, err
		}
		now := s.nodes.Now()
		held := map[string]int{}
		for id, n := range nodes {
			if r, ok := n.Reservations[projectID]; ok {
				held[id] = r.Units
			}
		}
		act := Decide(p, nodes, held, now)
		if act.Status == Waiting && !fresh {
			// Nothing fits in the snapshot: read again, by id, the few nodes that have what p
			// needs apart from state and room; read every node when none of those fits and the
			// snapshot is not brand new.
			if s.recheck(ctx, p, nodes) {
				continue
			}
			if s.snapshotAge() >= fleetRecheck {
				force = true
				continue
			}
		}
		force = false
		if act.Reserve != "" {
			n := nodes[act.Reserve]
			if act.Reserve != p.NodeID {
				if n, err = s.nodes.Get(ctx, act.Reserve); errors.Is(err, runners.ErrNotFound) {
					s.remember(act.Reserve, nil)
					continue
				} else if err != nil {
					return nil, err
				}
			}
			res := runners.Reservation{Units: p.CapacityUnits, Labels: p.Requirements.Labels, Endpoint: p.Requirements.Endpoint, Generation: p.Generation, At: now}
			got, err := s.nodes.TryReserve(ctx, n, projectID, res, p.fits(now))
			if errors.Is(err, store.ErrConflict) || errors.Is(err, runners.ErrNoFit) {
				// The node changed since it was read, or does not fit as it is now: remember it as
				// it is and select again.
				if fn, gerr := s.nodes.Get(ctx, act.Reserve); gerr == nil {
					s.remember(act.Reserve, fn)
				} else {
					s.remember(act.Reserve, nil)
				}
				continue
			}
			if err != nil {
				return nil, err
			}
			s.remember(got.ID, got)
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
					s.forgetFleet()
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
			s.forgetFleet()
		}
		if moved := p.NodeID != next.NodeID; next.Status == Assigned && s.ops != nil && (moved || p.Enqueued != next.Generation) {
			if err := s.enqueue(ctx, &next, moved); err != nil {
				return nil, err
			}
			// Later passes skip the enqueue of this generation; a lost write only repeats it.
			if cur, err := s.Get(ctx, projectID); err == nil && cur.Generation == next.Generation && cur.Enqueued != next.Generation {
				_, _ = store.UpdateIfRevision(ctx, s.colls.For(projectID), projectID, cur.Revision, bson.M{"$set": bson.M{"enqueued": next.Generation}})
			}
			changed = true
		}
		if !changed {
			return p, nil
		}
		return s.Get(ctx, projectID)
	}
	return nil, fmt.Errorf("placement: assign %s: %w", projectID, store.ErrConflict)
}

func (s *Service) enqueue(ctx context.Context, p *Placement, moved bool) error {
	rp := ReconcilePayload{Generation: p.Generation, Release: p.Release, State: p.State}
	if p.Provider {
		rp.Protocol = RuntimeProtocol
	}
	payload, _ := json.Marshal(rp)
	_, _, err := s.ops.Enqueue(ctx, operations.EnqueueRequest{ProjectID: p.ProjectID, Kind: KindReconcile,
		IdempotencyKey: "generation:" + strconv.FormatInt(p.Generation, 10), Payload: payload, TargetNode: p.NodeID})
	if err != nil && !errors.Is(err, operations.ErrIdempotencyKeyReused) {
		return fmt.Errorf("placement: enqueue reconcile of %s: %w", p.ProjectID, err)
	}
	if !moved {
		return nil // a move that a crash interrupted is finished by the next [Service.Pass]
	}
	// A failover moves the work of the project to the new node, reclaims included.
	return s.ops.RetargetProject(ctx, p.ProjectID, p.NodeID)
}

// Lifecycle enqueues a provider lifecycle operation (kind [KindRollback] or [KindDelete]) for the
// placement's exact current generation, targeted at its node; the canonical payload holds only that
// generation ([LifecyclePayload]) and a repeat for the same generation returns the same operation.
// Run it under the project lease. Errors: wrapping [ErrNotProvider]; [ErrInvalid] for another kind.
func (s *Service) Lifecycle(ctx context.Context, projectID, kind string) (*operations.Operation, error) {
	if kind != KindRollback && kind != KindDelete {
		return nil, fmt.Errorf("%w: lifecycle kind must be rollback or delete", ErrInvalid)
	}
	p, err := s.Get(ctx, projectID)
	if err != nil {
		return nil, err
	}
	if !p.Provider || p.NodeID == "" || s.ops == nil {
		return nil, fmt.Errorf("placement: %s %s: %w", kind, projectID, ErrNotProvider)
	}
	payload, _ := json.Marshal(LifecyclePayload{Generation: p.Generation})
	op, _, err := s.ops.Enqueue(ctx, operations.EnqueueRequest{ProjectID: projectID, Kind: kind,
		IdempotencyKey: kind + ":generation:" + strconv.FormatInt(p.Generation, 10), Payload: payload, TargetNode: p.NodeID})
	if err != nil {
		return nil, fmt.Errorf("placement: enqueue %s of %s: %w", kind, projectID, err)
	}
	return op, nil
}

// Observe records what the assigned node runs, with one compare-and-set guarded by [Observe].
// Errors: wrapping [ErrStale] for a report from another node or for an older generation than the
// one recorded.
func (s *Service) Observe(ctx context.Context, projectID string, obs Observation) (*Placement, error) {
	err := store.RetryOnConflict(ctx, func() error {
		p, err := s.Get(ctx, projectID)
		if err != nil {
			return err
		}
		if err := Observe(p, obs); err != nil {
			return fmt.Errorf("placement: observe %s generation %d: %w", projectID, obs.Generation, err)
		}
		obs.At = s.nodes.Now()
		if _, err = store.UpdateIfRevision(ctx, s.colls.For(projectID), projectID, p.Revision, bson.M{"$set": bson.M{"observed": obs}}); err != nil {
			return fmt.Errorf("placement: observe %s: %w", projectID, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, projectID)
}

// List returns every placement.
func (s *Service) List(ctx context.Context) ([]Placement, error) {
	out, err := buckets.Find[Placement](ctx, s.colls, nil)
	if err != nil {
		return nil, fmt.Errorf("placement: list: %w", err)
	}
	slices.SortFunc(out, func(a, b Placement) int { return strings.Compare(a.ProjectID, b.ProjectID) })
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
	at := make(map[string]string, len(ps))
	for _, p := range ps {
		q, err := s.Assign(ctx, p.ProjectID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if q.Status == Assigned {
			at[q.ProjectID] = q.NodeID
		}
	}
	if s.ops != nil {
		if err := s.ops.RetargetStray(ctx, at); err != nil {
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
			s.forgetFleet()
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
	s.forgetFleet()
	if _, err := s.colls.For(projectID).DeleteOne(ctx, bson.M{"_id": projectID}); err != nil {
		return fmt.Errorf("placement: remove %s: %w", projectID, err)
	}
	return nil
}
