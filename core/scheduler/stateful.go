package scheduler

import "sort"

// Lease is a stateful service's lease as the scheduler sees it (docs/node-protocol.md section 8).
// The zero value is a lease never granted that may be granted at once when Movable is set.
type Lease struct {
	// Holder is the node holding the lease, "" when nobody does.
	Holder string
	// Movable reports whether the lease may be granted to a node other than Holder now: a free
	// lease whose gate is open, or an expiring lease whose holder went silent past
	// T_grant + D + 2M. It is false while Blocked.
	Movable bool
	// Blocked reports whether an unacknowledged failed fence forbids every grant.
	Blocked bool
}

// PlaceStateful returns the actions that converge a stateful service (at most one slot, slot 0)
// and the node to grant its lease to first ("" when no grant is needed or possible now). The
// caller grants the lease with one compare-and-set and applies the actions only when that grant
// succeeded. Rules, in order:
//
//  1. Workloads of a slot >= Replicas, duplicates of slot 0, and workloads whose SpecHash differs
//     are removed (a replaced spec is created again on the lease's node).
//  2. While the lease is Blocked nothing else happens: the workload stays where it is.
//  3. The target node is the holder while the lease is not Movable (a local holder keeps its
//     workload even while disconnected). A Movable lease stays with its holder when the holder is
//     schedulable, else goes to the node of the existing workload when schedulable, else to the
//     schedulable node with the least load (then the lowest id). With no schedulable node it
//     stays with its holder and nothing is granted.
//  4. Slot 0 workloads on another node than the target are removed; a missing slot 0 is created
//     on the target.
//
// PlaceStateful is deterministic: the same input gives the same output.
func PlaceStateful(svc Service, lease Lease, nodes []Node, existing []Workload) (grantTo string, actions []Action) {
	ws := append([]Workload(nil), existing...)
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].Slot != ws[j].Slot {
			return ws[i].Slot < ws[j].Slot
		}
		return ws[i].ID < ws[j].ID
	})
	replicas := min(svc.Replicas, 1)
	var kept *Workload
	for i := range ws {
		w := &ws[i]
		if w.Slot != 0 || w.Slot >= replicas || kept != nil || w.SpecHash != svc.SpecHash {
			actions = append(actions, Action{Kind: Remove, Slot: w.Slot, WorkloadID: w.ID})
			continue
		}
		kept = w
	}
	if replicas == 0 || lease.Blocked {
		return "", actions
	}
	schedulable := map[string]bool{}
	load := map[string]int{}
	for _, n := range nodes {
		schedulable[n.ID] = n.Schedulable
		load[n.ID] = n.Load
	}
	target := lease.Holder
	if lease.Movable && !schedulable[lease.Holder] {
		switch {
		case kept != nil && kept.NodeID != lease.Holder && schedulable[kept.NodeID]:
			target = kept.NodeID
		default:
			best := ""
			for _, n := range nodes {
				if n.Schedulable && (best == "" || load[n.ID] < load[best] || load[n.ID] == load[best] && n.ID < best) {
					best = n.ID
				}
			}
			if best != "" {
				target = best
			}
		}
	}
	if target == "" {
		return "", actions
	}
	if target != lease.Holder {
		grantTo = target
	}
	if kept != nil && kept.NodeID != target {
		actions = append(actions, Action{Kind: Remove, Slot: 0, WorkloadID: kept.ID})
		kept = nil
	}
	if kept == nil {
		actions = append(actions, Action{Kind: Create, Slot: 0, NodeID: target})
	}
	return grantTo, actions
}
