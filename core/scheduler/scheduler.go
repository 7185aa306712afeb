// Package scheduler decides where a service's slots run. It is a pure decider:
// it takes the service, the nodes and the current workloads and returns actions,
// with no I/O, clock or goroutines; core/server applies the actions.
package scheduler

import (
	"sort"
)

// Node is a candidate node as the scheduler sees it.
type Node struct {
	ID string
	// Schedulable reports whether new work may be placed on the node (it is
	// connected and not draining).
	Schedulable bool
	// Load is the number of workloads of every service on the node.
	Load int
}

// Workload is an existing slot of the service being placed.
type Workload struct {
	ID     string
	Slot   int
	NodeID string
	// SpecHash identifies what the workload runs; a workload whose hash differs
	// from the service's is replaced.
	SpecHash string
}

// Service is what should run: Replicas slots numbered 0..Replicas-1 of SpecHash.
type Service struct {
	Replicas int
	SpecHash string
}

// ActionKind names what to do with a slot.
type ActionKind string

// Action kinds.
const (
	// Create places slot Slot on NodeID.
	Create ActionKind = "create"
	// Remove deletes workload WorkloadID (scale down, replaced spec, duplicate slot).
	Remove ActionKind = "remove"
)

// Action is one step to converge.
type Action struct {
	Kind       ActionKind
	Slot       int
	NodeID     string // Create
	WorkloadID string // Remove
}

// Place returns the actions that converge the service's workloads on svc.
// Rules, in order:
//  1. Workloads of a slot >= Replicas, duplicates of a slot, and workloads whose
//     SpecHash differs are removed.
//  2. A slot whose workload stays is kept where it is, even on a node that is not
//     schedulable (a disconnected node keeps serving; moving work is not this
//     version's job).
//  3. Every missing slot is created on a schedulable node: spread first (the node
//     with the fewest workloads of this service), then the least loaded, then
//     the lowest id. With no schedulable node the slot waits.
//
// Place is deterministic: the same input gives the same actions.
func Place(svc Service, nodes []Node, existing []Workload) []Action {
	var actions []Action
	ws := append([]Workload(nil), existing...)
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].Slot != ws[j].Slot {
			return ws[i].Slot < ws[j].Slot
		}
		return ws[i].ID < ws[j].ID
	})
	kept := map[int]bool{}
	perNode := map[string]int{}
	for _, w := range ws {
		if w.Slot < 0 || w.Slot >= svc.Replicas || kept[w.Slot] || w.SpecHash != svc.SpecHash {
			actions = append(actions, Action{Kind: Remove, Slot: w.Slot, WorkloadID: w.ID})
			continue
		}
		kept[w.Slot] = true
		perNode[w.NodeID]++
	}
	load := map[string]int{}
	var cands []string
	for _, n := range nodes {
		load[n.ID] = n.Load
		if n.Schedulable {
			cands = append(cands, n.ID)
		}
	}
	// Removals free capacity on their nodes.
	for _, a := range actions {
		for _, w := range ws {
			if w.ID == a.WorkloadID {
				load[w.NodeID]--
			}
		}
	}
	if len(cands) == 0 {
		return actions
	}
	for slot := 0; slot < svc.Replicas; slot++ {
		if kept[slot] {
			continue
		}
		best := ""
		for _, id := range cands {
			if best == "" || better(id, best, perNode, load) {
				best = id
			}
		}
		actions = append(actions, Action{Kind: Create, Slot: slot, NodeID: best})
		perNode[best]++
		load[best]++
	}
	return actions
}

func better(a, b string, perNode, load map[string]int) bool {
	if perNode[a] != perNode[b] {
		return perNode[a] < perNode[b]
	}
	if load[a] != load[b] {
		return load[a] < load[b]
	}
	return a < b
}
