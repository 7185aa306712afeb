package plans_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/store"
)

// The tests' ledgers: nodes with a capacity in units and the keys reserved on them, and
// operations with at most one holder. They are the shapes of the real ledgers (core/runners'
// reservations, core/operations' claims) cut to what the applier's guarantees are about.

const (
	nodesColl = "test_nodes"
	opsColl   = "test_ops"
)

type testNode struct {
	ID           string         `bson:"_id"`
	Capacity     int            `bson:"capacity"`
	Reserved     int            `bson:"reserved"`
	Reservations map[string]int `bson:"reservations"`
}

type testOp struct {
	ID     string `bson:"_id"`
	Holder string `bson:"holder"`
}

// reservePlan reserves units for key on node: refused with a conflict when the node has no room
// left or key is reserved anywhere already (as the submitter saw it: on node, or on where).
func reservePlan(node, key string, units int, placedOn func(ctx context.Context, r plans.Reader, key string) (string, error)) plans.Plan {
	return plans.Plan{Name: "reserve " + key + " on " + node, Decide: func(ctx context.Context, r plans.Reader) ([]store.PlanWrite, error) {
		if at, err := placedOn(ctx, r, key); err != nil {
			return nil, err
		} else if at != "" {
			return nil, fmt.Errorf("%s is placed on %s already: %w", key, at, store.ErrConflict)
		}
		var n testNode
		if err := r.Get(ctx, nodesColl, node, &n); err != nil {
			return nil, err
		}
		if n.Reserved+units > n.Capacity {
			return nil, fmt.Errorf("%s has %d of %d units free: %w", node, n.Capacity-n.Reserved, n.Capacity, store.ErrConflict)
		}
		return []store.PlanWrite{
			{Coll: nodesColl, ID: node, Set: map[string]any{"reservations." + key: units, "reserved": n.Reserved + units}},
			{Coll: "test_placements", ID: key, Set: map[string]any{"node": node}, Upsert: true},
		}, nil
	}}
}

// placedOn reads where key is placed from its placement document (as the applier sees it).
func placedOn(ctx context.Context, r plans.Reader, key string) (string, error) {
	var p struct {
		Node string `bson:"node"`
	}
	err := r.Get(ctx, "test_placements", key, &p)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	return p.Node, err
}

// claimPlan makes holder the holder of operation op, refused when it has one.
func claimPlan(op, holder string) plans.Plan {
	return plans.Plan{Name: "claim " + op + " for " + holder, Decide: func(ctx context.Context, r plans.Reader) ([]store.PlanWrite, error) {
		var o testOp
		if err := r.Get(ctx, opsColl, op, &o); err != nil {
			return nil, err
		}
		if o.Holder != "" {
			return nil, fmt.Errorf("%s is held by %s: %w", op, o.Holder, store.ErrConflict)
		}
		return []store.PlanWrite{{Coll: opsColl, ID: op, Set: map[string]any{"holder": holder}}}, nil
	}}
}

// place plans key onto a node with room as the view shows the nodes, submits it, and plans again
// after a conflict (at most 16 times). It returns the node and the entry, or "" when no node
// has room.
func place(ctx context.Context, st *store.Store, a *plans.Applier, rng *rand.Rand, key string) (string, int64, error) {
	for attempt := 0; attempt < 16; attempt++ {
		var nodes []testNode
		if err := st.View().Find(ctx, st.Collection(nodesColl), nil, &nodes); err != nil {
			return "", 0, err
		}
		var free []string
		for _, n := range nodes {
			if n.Reserved < n.Capacity {
				free = append(free, n.ID)
			}
		}
		if len(free) == 0 {
			return "", 0, nil
		}
		node := free[rng.IntN(len(free))]
		rc, err := a.Submit(ctx, reservePlan(node, key, 1, placedOn))
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return "", 0, err
		}
		return node, rc.Seq, nil
	}
	return "", 0, fmt.Errorf("place %s: %w", key, store.ErrConflict)
}
