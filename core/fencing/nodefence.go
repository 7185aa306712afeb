package fencing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/store"
)

// nodesCollection is core/nodes' collection; this package writes only the fence fields of a node
// (fence_failure, fence_ack_pending, fence_acked), guarded by fence_rev.
const nodesCollection = "nodes"

// ErrAckMismatch is returned by [Authority.FenceAck] when the lease ids given are not exactly the
// node's outstanding failed fences; the API answers it as fence_ack_mismatch and nothing changes.
var ErrAckMismatch = errors.New("berth: the acknowledged leases are not exactly the node's outstanding failed fences")

// FenceAckEntityType is the change-log entity type of an operator's acknowledgement of a node's
// failed fences: entity id the node id, op update, payload [FenceAckChange]
// (docs/node-protocol.md section 7.6).
const FenceAckEntityType = "node_fence_ack"

// FenceAckChange is the payload of a [FenceAckEntityType] entry: the node and the lease ids
// acknowledged, sorted. Each of those leases is then freed under a higher token.
type FenceAckChange struct {
	NodeID   string   `json:"node_id"`
	LeaseIDs []string `json:"lease_ids"`
}

// ErrNodeNotFound is returned by the node fence methods for an unknown node id.
var ErrNodeNotFound = errors.New("berth: node not found")

func (a *Authority) readNode(ctx context.Context, nodeID string) (*nodes.Node, error) {
	var n nodes.Node
	err := store.FindByID(ctx, a.nodes, nodeID, &n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("fencing: node %s: %w", nodeID, ErrNodeNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("fencing: read node %s: %w", nodeID, err)
	}
	return &n, nil
}

// casNode writes set to node n's fence fields with one compare-and-set on fence_rev, and push
// (when not nil) into its change-log outbox in the same write; it reports false when another
// writer moved fence_rev first.
func (a *Authority) casNode(ctx context.Context, n *nodes.Node, set bson.M, push *changelog.Pending) (bool, error) {
	filter := bson.M{"_id": n.ID, "fence_rev": n.FenceRev}
	if n.FenceRev == 0 {
		filter = bson.M{"_id": n.ID, "$or": bson.A{bson.M{"fence_rev": int64(0)}, bson.M{"fence_rev": bson.M{"$exists": false}}}}
	}
	set["fence_rev"] = n.FenceRev + 1
	update := bson.M{"$set": set}
	if push != nil {
		update["$push"] = bson.M{changelog.OutboxField: *push}
	}
	res, err := a.nodes.UpdateOne(ctx, filter, update)
	if err != nil {
		return false, fmt.Errorf("fencing: update fence state of node %s: %w", n.ID, err)
	}
	return res.MatchedCount == 1, nil
}

// updateNode re-reads node nodeID and applies change to it with [Authority.casNode] until it
// wins (as [store.RetryOnConflict] says). change returns nil to write nothing.
func (a *Authority) updateNode(ctx context.Context, nodeID string, change func(n *nodes.Node) (bson.M, error)) (*nodes.Node, error) {
	return a.updateNodeLogged(ctx, nodeID, change, nil)
}

// updateNodeLogged is [Authority.updateNode] that also puts the change logged returns (when
// logged is not nil and ctx carries the actor, changelog.WithActor) into the node's outbox, in
// the compare-and-set that writes set. The node returned is as read before that write.
func (a *Authority) updateNodeLogged(ctx context.Context, nodeID string, change func(n *nodes.Node) (bson.M, error), logged func(n *nodes.Node) changelog.Change) (*nodes.Node, error) {
	actor, withActor := changelog.ActorFrom(ctx)
	var out *nodes.Node
	err := store.RetryOnConflict(ctx, func() error {
		out = nil
		n, err := a.readNode(ctx, nodeID)
		if err != nil {
			return err
		}
		set, err := change(n)
		if err != nil || set == nil {
			out = n
			return err
		}
		var push *changelog.Pending
		if logged != nil && withActor {
			ch := logged(n)
			ch.ActorType, ch.ActorID = actor.Type, actor.ID
			p, err := changelog.Prepare(ch)
			if err != nil {
				return fmt.Errorf("fencing: node %s: %w", nodeID, err)
			}
			push = &p
		}
		ok, err := a.casNode(ctx, n, set, push)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("fencing: update fence state of node %s: %w", nodeID, store.ErrConflict)
		}
		out = n
		return nil
	})
	if err != nil && out == nil {
		return nil, err
	}
	return out, err // out with an error: change's
}

// RecordFenceFailure records that nodeID's fence of f.LeaseID failed (a lease_revoke answered
// fence_failed, or a node.fence_failed event; docs/node-protocol.md section 8.5 step 1):
//
//  1. the lease document lists nodeID in fence_failed (one compare-and-set), which blocks every
//     grant and renewal of the lease from then on;
//  2. the node document lists f in fence_failure (one compare-and-set on fence_rev), where the
//     operator sees it and acknowledges it.
//
// Step 1 comes first, so a crash between the two leaves the lease blocked (the safe side) and
// [Authority.Sweep] completes step 2. Idempotent: a failure already recorded changes nothing. An
// unknown lease id is recorded on the node only.
func (a *Authority) RecordFenceFailure(ctx context.Context, nodeID string, f nodes.FenceFailure) error {
	_, err := a.apply(ctx, f.LeaseID, "", "", false, func(s State, _ time.Time) (State, bool, error) {
		next, changed := FenceFailed(s, nodeID)
		return next, changed, nil
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if f.At.IsZero() {
		f.At = a.now().UTC()
	}
	if f.WorkloadIDs == nil {
		f.WorkloadIDs = []string{}
	}
	_, err = a.updateNode(ctx, nodeID, func(n *nodes.Node) (bson.M, error) {
		for _, have := range n.FenceFailure {
			if have.LeaseID == f.LeaseID {
				return nil, nil
			}
		}
		return bson.M{"fence_failure": append(slices.Clone(n.FenceFailure), f)}, nil
	})
	if err == nil {
		a.log.Warn("failed fence recorded; the lease is granted to nobody until an operator acknowledges it",
			"node_id", nodeID, "lease_id", f.LeaseID, "workload_ids", f.WorkloadIDs)
	}
	return err
}

// FenceAck records an operator's acknowledgement of nodeID's failed fences (POST
// /api/v1/nodes/{id}/fence-ack, docs/node-protocol.md section 8.5 steps 2 and 3). leaseIDs must
// equal the node's outstanding fence_failure lease ids as a set, else [ErrAckMismatch] (wrapped,
// naming both lists) and nothing changes. Then:
//
//  1. one compare-and-set on the node clears fence_failure and adds the ids to fence_ack_pending
//     (the node is sent command fence_ack until it answers ok) and to fence_acked (the intent);
//  2. each lease document gets a higher token and is free again, by one compare-and-set each;
//  3. the ids leave fence_acked.
//
// A crash after step 1 is completed by [Authority.Sweep]; until then the leases stay blocked.
// Step 1 is the acknowledgement's commit point: when ctx carries the actor
// (changelog.WithActor), it also puts a [FenceAckEntityType] change in the node's outbox
// (nodes.Node.LogOutbox), so the acknowledgement reaches the log exactly once whatever happens
// after it (docs/node-protocol.md section 7.2); a refused acknowledgement records nothing.
// It returns the leases as acknowledged.
func (a *Authority) FenceAck(ctx context.Context, nodeID string, leaseIDs []string) ([]Lease, error) {
	want := uniqSorted(leaseIDs)
	_, err := a.updateNodeLogged(ctx, nodeID, func(n *nodes.Node) (bson.M, error) {
		have := make([]string, 0, len(n.FenceFailure))
		for _, f := range n.FenceFailure {
			have = append(have, f.LeaseID)
		}
		have = uniqSorted(have)
		if len(want) == 0 || !slices.Equal(have, want) {
			return nil, fmt.Errorf("%w: outstanding [%s], acknowledged [%s]", ErrAckMismatch, strings.Join(have, ", "), strings.Join(want, ", "))
		}
		return bson.M{
			"fence_failure":     []nodes.FenceFailure{},
			"fence_ack_pending": uniqSorted(append(slices.Clone(n.FenceAckPending), want...)),
			"fence_acked":       uniqSorted(append(slices.Clone(n.FenceAcked), want...)),
		}, nil
	}, func(n *nodes.Node) changelog.Change {
		return changelog.Change{EntityType: FenceAckEntityType, EntityID: n.ID, Op: node.OpUpdate,
			Payload: FenceAckChange{NodeID: n.ID, LeaseIDs: want}}
	})
	if err != nil {
		return nil, err
	}
	return a.applyAcks(ctx, nodeID, want)
}

// applyAcks is steps 2 and 3 of [Authority.FenceAck].
func (a *Authority) applyAcks(ctx context.Context, nodeID string, leaseIDs []string) ([]Lease, error) {
	var out []Lease
	for _, id := range leaseIDs {
		l, err := a.apply(ctx, id, "", "", false, func(s State, now time.Time) (State, bool, error) {
			next, changed := Ack(s, nodeID, now)
			return next, changed, nil
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return out, err
		default:
			out = append(out, *l)
		}
	}
	_, err := a.updateNode(ctx, nodeID, func(n *nodes.Node) (bson.M, error) {
		rest := slices.DeleteFunc(slices.Clone(n.FenceAcked), func(id string) bool { return slices.Contains(leaseIDs, id) })
		if len(rest) == len(n.FenceAcked) {
			return nil, nil
		}
		return bson.M{"fence_acked": rest}, nil
	})
	return out, err
}

// AckDelivered records that nodeID answered command fence_ack for leaseIDs with ok: they leave
// its fence_ack_pending (section 8.5 step 4). Idempotent.
func (a *Authority) AckDelivered(ctx context.Context, nodeID string, leaseIDs []string) error {
	_, err := a.updateNode(ctx, nodeID, func(n *nodes.Node) (bson.M, error) {
		rest := slices.DeleteFunc(slices.Clone(n.FenceAckPending), func(id string) bool { return slices.Contains(leaseIDs, id) })
		if len(rest) == len(n.FenceAckPending) {
			return nil, nil
		}
		return bson.M{"fence_ack_pending": rest}, nil
	})
	return err
}

// Sweep completes interrupted multi-document steps: acknowledgements recorded on a node but not
// yet applied to their leases, and failed fences recorded on a lease but not yet on its node. It
// is idempotent and cheap when nothing is pending; the reconciler runs it on every pass.
func (a *Authority) Sweep(ctx context.Context) error {
	// From the read view: this runs on every reconciler pass and must not scan the nodes.
	var all []nodes.Node
	if err := a.st.View().Find(ctx, a.nodes, nil, &all); err != nil {
		return fmt.Errorf("fencing: sweep: %w", err)
	}
	for _, n := range all {
		if n.FenceRev <= 0 {
			continue
		}
		if len(n.FenceAcked) == 0 {
			continue
		}
		a.log.Info("completing an interrupted fence acknowledgement", "node_id", n.ID, "lease_ids", n.FenceAcked)
		if _, err := a.applyAcks(ctx, n.ID, n.FenceAcked); err != nil {
			return err
		}
	}
	// Every lease document carries holder (Lease has no omitempty on it and nothing unsets it), so
	// the whole list, from the read view, is the set that has one.
	leases, err := a.List(ctx, nil)
	if err != nil {
		return err
	}
	for _, l := range leases {
		for _, nodeID := range l.FenceFailed {
			n, err := a.readNode(ctx, nodeID)
			if errors.Is(err, ErrNodeNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			listed := slices.Contains(n.FenceAcked, l.ID)
			for _, f := range n.FenceFailure {
				listed = listed || f.LeaseID == l.ID
			}
			if listed {
				continue
			}
			a.log.Info("completing an interrupted failed-fence record", "node_id", nodeID, "lease_id", l.ID)
			if err := a.RecordFenceFailure(ctx, nodeID, nodes.FenceFailure{LeaseID: l.ID, ResourceID: l.ResourceID,
				FencingToken: l.FencingToken, Detail: "recorded again after an interrupted write"}); err != nil {
				return err
			}
		}
	}
	return nil
}

func uniqSorted(ids []string) []string {
	out := slices.Clone(ids)
	sort.Strings(out)
	return slices.Compact(out)
}
