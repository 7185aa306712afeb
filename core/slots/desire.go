package slots

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Node is what the desire reads of one node.
type Node struct {
	ID string
	// Platform is "<os>/<arch>" as the node reported it; "" leaves the node unassignable.
	Platform string
	// Member reports whether the node is enrolled and not retiring, withdrawn, lost or removed. An
	// offline node stays a member: its replicas stay on it (a replica never moves node).
	Member bool
}

// Assignable reports whether new slots may be placed on n: a member with a known platform.
func (n Node) Assignable() bool { return n.Member && n.Platform != "" }

// Placed is one desired replica on its node.
type Placed struct {
	// Replica is the slot's replica id: "<i>" for scheduled placement, "<node id>.<i>" otherwise.
	Replica  string
	NodeID   string
	Platform string
}

// DesireResult is the outcome of [Desire].
type DesireResult struct {
	// Placed are the replicas with a node, in replica order.
	Placed []Placed
	// Unplaced are replica ids the desire wants but cannot place yet: scheduled replicas without a
	// (still assignable) node, for the caller's scheduler to place, and replicas of pinned nodes
	// that are momentarily not assignable. They keep the verdict converging.
	Unplaced []string
	// Refused is ReasonNoEligibleNode when the spec wants at least one replica and nothing can be
	// desired; "" otherwise.
	Refused Reason
}

// Desire returns what a service desires (docs/reconciliation.md section 5). It desires nothing
// without a spec, while the spec holds, and while the service is deleting (an empty desire). nodes
// may be in any order; placed maps a scheduled replica id to the node the scheduler chose for it
// earlier (read from its slot row), nil for none. Pure.
func Desire(spec *Spec, deleting bool, nodes []Node, placed map[string]string) DesireResult {
	var out DesireResult
	if spec == nil || spec.Hold || deleting {
		return out
	}
	byID := make(map[string]Node, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n
	}
	perNode := func(n Node) {
		for i := 0; i < spec.Replicas.PerNode; i++ {
			out.Placed = append(out.Placed, Placed{Replica: n.ID + "." + strconv.Itoa(i), NodeID: n.ID, Platform: n.Platform})
		}
	}
	assignable := 0
	switch spec.Placement.Mode {
	case PlacementEveryNode:
		ids := make([]string, 0, len(nodes))
		for _, n := range nodes {
			if n.Assignable() {
				ids = append(ids, n.ID)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			perNode(byID[id])
		}
		assignable = len(ids)
	case PlacementPinned:
		for _, id := range spec.Placement.Nodes {
			if n, ok := byID[id]; ok && n.Assignable() {
				perNode(n)
				assignable++
				continue
			}
			for i := 0; i < spec.Replicas.PerNode; i++ {
				out.Unplaced = append(out.Unplaced, id+"."+strconv.Itoa(i))
			}
		}
	case PlacementScheduled:
		for _, n := range nodes {
			if n.Assignable() {
				assignable++
			}
		}
		if assignable == 0 {
			break
		}
		for i := 0; i < spec.Replicas.Total; i++ {
			r := strconv.Itoa(i)
			if n, ok := byID[placed[r]]; ok && n.Assignable() {
				out.Placed = append(out.Placed, Placed{Replica: r, NodeID: n.ID, Platform: n.Platform})
			} else {
				out.Unplaced = append(out.Unplaced, r)
			}
		}
	}
	wants := spec.Replicas.PerNode > 0
	if spec.Placement.Mode == PlacementScheduled {
		wants = spec.Replicas.Total > 0
	}
	if wants && assignable == 0 {
		out.Refused, out.Placed, out.Unplaced = ReasonNoEligibleNode, nil, nil
	}
	return out
}

// compareReplicas orders slot names by their replica ([BaseReplica]), a replica's primary name
// before its surge name.
func compareReplicas(a, b string) int {
	if c := compareBase(BaseReplica(a), BaseReplica(b)); c != 0 {
		return c
	}
	return strings.Compare(a, b) // "3" before "3~"
}

// compareBase orders replica ids: "<i>" numerically, "<node>.<i>" by node and then index, and
// anything else as a string after both.
func compareBase(a, b string) int {
	pa, ia, oka := splitReplica(a)
	pb, ib, okb := splitReplica(b)
	switch {
	case oka && okb:
		if c := strings.Compare(pa, pb); c != 0 {
			return c
		}
		return cmp.Compare(ia, ib)
	case oka:
		return -1
	case okb:
		return 1
	}
	return strings.Compare(a, b)
}

// splitReplica splits "<prefix>.<i>" or "<i>" into its prefix and index.
func splitReplica(r string) (string, int, bool) {
	prefix, num := "", r
	if i := strings.LastIndexByte(r, '.'); i >= 0 {
		prefix, num = r[:i], r[i+1:]
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || strconv.Itoa(n) != num {
		return "", 0, false
	}
	return prefix, n, true
}
