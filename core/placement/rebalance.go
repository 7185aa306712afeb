package placement

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Move is one replica move a rebalance proposes ([Rebalance]).
type Move struct {
	Replica string `json:"replica"`
	From    string `json:"from"`
	To      string `json:"to"`
	// Why says for a person how the spread improves.
	Why string `json:"why"`
}

// SpreadScore is how unevenly a request's replicas are spread, from the decider's first two
// ranking keys: Domains is the sum over spread domains of the square of the replicas in each,
// Nodes the same over nodes. Lower is better; Domains decides first.
type SpreadScore struct {
	Domains int `json:"domains"`
	Nodes   int `json:"nodes"`
}

// Less reports whether s is a better (more even) spread than o.
func (s SpreadScore) Less(o SpreadScore) bool {
	if s.Domains != o.Domains {
		return s.Domains < o.Domains
	}
	return s.Nodes < o.Nodes
}

// SpreadOf returns the [SpreadScore] of the replicas of req.Existing over nodes (a replica on a
// node not among nodes is not counted).
func SpreadOf(req Request, nodes []Node) SpreadScore {
	q := compile(&req)
	byID := make(map[string]*Node, len(nodes))
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	perNode, perDomain := map[string]int{}, map[string]int{}
	for _, id := range req.Existing {
		if n := byID[id]; n != nil {
			perNode[id]++
			perDomain[q.domain(n)]++
		}
	}
	return spreadOf(perNode, perDomain)
}

func spreadOf(perNode, perDomain map[string]int) SpreadScore {
	var s SpreadScore
	for _, c := range perDomain {
		s.Domains += c * c
	}
	for _, c := range perNode {
		s.Nodes += c * c
	}
	return s
}

// Rebalance proposes moves of the replicas that stand somewhere (req.Existing, their resources
// in their nodes' Used) that make their spread better. It asks [Choose] where it would place
// every replica from scratch over nodes (no replica kept, their own reservations left out),
// takes the nodes that would hold more replicas than they do as targets and those that hold more
// than they would as sources, and moves a replica from a source to a target only when the
// move lowers the [SpreadScore] and the target passes [Feasible] for it (counting the moves
// before it: a successor reserves beside the replica it replaces). A replica on a node missing
// from nodes is left alone. Sources are taken in node id order, replicas from the highest index
// down; the answer is in replica order, deterministic, and empty when the spread is as good as
// the decider can make it. Pure, like [Choose].
func Rebalance(req Request, nodes []Node) []Move {
	q := compile(&req)
	index := make(map[string]int, len(nodes))
	for i := range nodes {
		index[nodes[i].ID] = i
	}
	at := map[string]string{} // replica: node, the replicas on known nodes
	onNode := map[string][]string{}
	for r, id := range req.Existing {
		if _, ok := index[id]; ok {
			at[r] = id
			onNode[id] = append(onNode[id], r)
		}
	}
	if len(at) < 2 {
		return nil
	}
	// From scratch: every node without this request's replicas, all replicas to place.
	fresh := slices.Clone(nodes)
	for _, id := range at {
		i := index[id]
		fresh[i].Used = fresh[i].Used.Add(req.Resources.Times(-1))
	}
	scratch := req
	scratch.Existing, scratch.Explain = nil, false
	scratch.Place = slices.SortedFunc(maps.Keys(at), compareReplicas)
	want := map[string]int{}
	for _, c := range Choose(scratch, fresh).Choices {
		if c.NodeID != "" {
			want[c.NodeID]++
		}
	}
	perNode, perDomain := map[string]int{}, map[string]int{}
	for _, id := range at {
		perNode[id]++
		perDomain[q.domain(&nodes[index[id]])]++
	}
	var targets []string
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if want[id] > perNode[id] {
			targets = append(targets, id)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	var moving []string // replicas on sources, in the order they are offered
	for _, id := range slices.Sorted(maps.Keys(onNode)) {
		extra := perNode[id] - want[id]
		if extra <= 0 {
			continue
		}
		rs := slices.SortedFunc(slices.Values(onNode[id]), compareReplicas)
		for k := len(rs) - 1; k >= 0 && extra > 0; k, extra = k-1, extra-1 {
			moving = append(moving, rs[k])
		}
	}
	added := map[string]Resources{} // what the moves reserve on their targets
	var moves []Move
	for _, r := range moving {
		from := at[r]
		src := &nodes[index[from]]
		for _, to := range targets {
			if perNode[to] >= want[to] {
				continue
			}
			dst := nodes[index[to]]
			before := spreadOf(perNode, perDomain)
			fd, td := q.domain(src), q.domain(&dst)
			perNode[from]--
			perDomain[fd]--
			perNode[to]++
			perDomain[td]++
			after := spreadOf(perNode, perDomain)
			check := req
			check.Existing = make(map[string]string, len(at))
			for k, id := range at {
				if k != r {
					check.Existing[k] = id
				}
			}
			dst.Used = dst.Used.Add(added[to])
			if code, _ := Feasible(check, dst); code != "" || !after.Less(before) {
				perNode[from]++
				perDomain[fd]++
				perNode[to]--
				perDomain[td]--
				continue
			}
			at[r] = to
			added[to] = added[to].Add(req.Resources)
			moves = append(moves, Move{Replica: r, From: from, To: to, Why: why(req.SpreadBy, fd, td, from, to, perDomain, perNode, before, after)})
			break
		}
	}
	slices.SortFunc(moves, func(a, b Move) int { return compareReplicas(a.Replica, b.Replica) })
	return moves
}

// why says how a move from node from (domain fd) to node to (domain td) improves the spread;
// the counts are those after the move.
func why(by Spread, fd, td, from, to string, perDomain, perNode map[string]int, before, after SpreadScore) string {
	if by == "" {
		by = SpreadNode
	}
	if fd != td {
		return fmt.Sprintf("spread by %s: %d replica(s) in the domain of %s and %d in that of %s, was %d and %d (score %d, was %d)",
			by, perDomain[fd], from, perDomain[td], to, perDomain[fd]+1, perDomain[td]-1, after.Domains, before.Domains)
	}
	return fmt.Sprintf("same %s domain: %d replica(s) on %s and %d on %s, was %d and %d (score %d, was %d)",
		by, perNode[from], from, perNode[to], to, perNode[from]+1, perNode[to]-1, after.Nodes, before.Nodes)
}

// compareReplicas orders replica names numerically where both are numbers, else as strings.
func compareReplicas(a, b string) int {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	if errA == nil && errB == nil {
		return cmp.Compare(x, y)
	}
	return strings.Compare(a, b)
}
