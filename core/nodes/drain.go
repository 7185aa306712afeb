package nodes

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Drain is a node's drain (docs/operating.md, "Cordon and drain"): from StartedAt the node takes
// no new placement (it is cordoned too) and the rollout moves its scheduled replicas to other
// nodes, handing stateful leases over in order. Deadline, when set, is when the operator wanted
// it done; past it the drain reports itself late and keeps going.
type Drain struct {
	StartedAt time.Time  `bson:"started_at" json:"started_at"`
	Deadline  *time.Time `bson:"deadline,omitempty" json:"deadline,omitempty"`
}

// Schedulable reports whether new placements may land on n: a member that is neither cordoned
// nor draining. Replicas already on an unschedulable node stay, unless it drains.
func (n *Node) Schedulable() bool { return n.Member() && !n.Cordoned && n.Drain == nil }

// Draining reports whether n is being drained: its scheduled replicas and stateful leases move
// away (a portable slot on it counts as needing replacement).
func (n *Node) Draining() bool { return n.Member() && n.Drain != nil }

// ShownStatus is the status an operator sees: [StatusDraining] while the node drains, its
// session status otherwise.
func (n *Node) ShownStatus() string {
	if n.Draining() {
		return StatusDraining
	}
	return n.Status
}

// Cordon sets (on) or clears node id's cordon with one compare-and-set on the node: a cordoned
// node takes no new placement, and what runs on it stays. Clearing the cordon of a draining
// node ends the drain too (uncordon returns the node to placement). Idempotent. Errors:
// ErrNotFound, ErrNotMember, ErrConflict, or a store error.
func (r *Registry) Cordon(ctx context.Context, id string, on bool) (*Node, error) {
	what := "cordon node"
	if !on {
		what = "uncordon node"
	}
	return r.operatorChange(ctx, id, what, func(n *Node) (bson.M, error) {
		if n.Cordoned == on && (on || n.Drain == nil) {
			return nil, nil
		}
		n.Cordoned = on
		set := bson.M{"cordoned": on}
		if !on && n.Drain != nil {
			n.Drain, set["drain"] = nil, nil
		}
		return set, nil
	})
}

// StartDrain cordons node id and marks it draining, with one compare-and-set on the node;
// deadline zero sets none. A node already draining keeps its start and takes the new deadline
// (zero keeps the old one). Errors: ErrInvalid (a deadline not after now), ErrNotFound,
// ErrNotMember, ErrConflict, or a store error.
func (r *Registry) StartDrain(ctx context.Context, id string, deadline time.Time) (*Node, error) {
	now := r.now().UTC().Truncate(time.Millisecond) // the store keeps milliseconds
	deadline = deadline.UTC().Truncate(time.Millisecond)
	if !deadline.IsZero() && !deadline.After(now) {
		return nil, fmt.Errorf("%w: the drain deadline %s is not in the future", ErrInvalid, deadline.UTC().Format(time.RFC3339))
	}
	return r.operatorChange(ctx, id, "drain node", func(n *Node) (bson.M, error) {
		d := Drain{StartedAt: now}
		if n.Drain != nil {
			d = *n.Drain
		}
		if !deadline.IsZero() {
			dl := deadline.UTC()
			d.Deadline = &dl
		}
		if n.Cordoned && n.Drain != nil && sameDrain(*n.Drain, d) {
			return nil, nil
		}
		n.Cordoned, n.Drain = true, &d
		return bson.M{"cordoned": true, "drain": d}, nil
	})
}

func sameDrain(a, b Drain) bool {
	if !a.StartedAt.Equal(b.StartedAt) || (a.Deadline == nil) != (b.Deadline == nil) {
		return false
	}
	return a.Deadline == nil || a.Deadline.Equal(*b.Deadline)
}
