package runners

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/store"
)

// The ledger on the plan log (docs/store.md section 2.3): a placement decided through the plan
// applier records its reservation with a [store.PlanWrite] instead of a compare-and-set. The
// applier re-checks the ledger as its [plans.Reader] shows it (the view with every accepted
// decision laid over it), so two plans can never both take a node's last unit, and each write
// sets the node's revision one past what it decided on: a compare-and-set on the node that
// read it before (a heartbeat, a drain) is refused once the write is materialized, and waits
// for that until then ([store.Store.Settled]).

// PlanReserve decides key's reservation res on node id as rd shows the node (the applier's
// re-check) and returns the write that records it, with the node as it is after the write.
// Errors: wrapping [ErrNoFit] (with [store.ErrConflict], so the submitter plans again) when the
// node cannot take it as it is now; wrapping [ErrNotFound] (also with [store.ErrConflict]) when
// the node is gone.
func (r *Registry) PlanReserve(ctx context.Context, rd plans.Reader, id, key string, res Reservation, fits Fits) (store.PlanWrite, *Node, error) {
	n, err := r.planNode(ctx, rd, id)
	if err != nil {
		return store.PlanWrite{}, nil, err
	}
	l, total, err := Reserve(n, key, res, fits)
	if err != nil {
		return store.PlanWrite{}, nil, fmt.Errorf("runners: reserve %d units on %s: %w (%w)", res.Units, id, err, store.ErrConflict)
	}
	w := store.PlanWrite{Coll: r.nodes.For(id).Name(), ID: id, Set: map[string]any{"reserved": total, store.RevisionField: n.Revision + 1}}
	if n.Reservations != nil && pathSafe(key) {
		w.Set["reservations."+key] = res
	} else {
		w.Set["reservations"] = l
	}
	out := *n
	out.Reservations, out.Reserved, out.Revision = l, total, n.Revision+1
	return w, &out, nil
}

// PlanUnreserve decides the release of key's reservation on node id as rd shows the node and
// returns the write that records it, or nil when the node holds none (or is gone).
func (r *Registry) PlanUnreserve(ctx context.Context, rd plans.Reader, id, key string) (*store.PlanWrite, error) {
	n, err := r.planNode(ctx, rd, id)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l, total, changed := Unreserve(n, key)
	if !changed {
		return nil, nil
	}
	w := &store.PlanWrite{Coll: r.nodes.For(id).Name(), ID: id, Set: map[string]any{"reserved": total, store.RevisionField: n.Revision + 1}}
	if pathSafe(key) {
		w.Unset = []string{"reservations." + key}
	} else {
		w.Set["reservations"] = l
	}
	return w, nil
}

// planNode reads node id as rd shows it. Errors: wrapping [ErrNotFound] and [store.ErrConflict].
func (r *Registry) planNode(ctx context.Context, rd plans.Reader, id string) (*Node, error) {
	var n Node
	err := rd.Get(ctx, r.nodes.For(id).Name(), id, &n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("runners: %s: %w (%w)", id, ErrNotFound, store.ErrConflict)
	}
	if err != nil {
		return nil, fmt.Errorf("runners: read %s for a plan: %w", id, err)
	}
	return &n, nil
}

// pathSafe reports whether key may be one element of a dotted field path.
func pathSafe(key string) bool {
	return key != "" && !strings.ContainsAny(key, ".$") && !strings.HasPrefix(key, " ")
}
