package placement

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// This file is the one placement decider of Berth (docs/placement.md): services, stateful lease
// holders and runner projects all choose their nodes with [Choose]. It is pure: nodes and a
// request in, a node per replica and the reasons out, with no clock, I/O or goroutines. Callers
// reserve what it chose with one compare-and-set on the node's ledger (runner projects) or on the
// service's slot set (services), and decide again on a conflict.

// Resources is an amount of node capacity: CPU in millicores, memory in MiB, and extended
// resources an operator declares (gpu, ...) in their own units. A field that is zero asks for
// (or offers) none of it.
type Resources struct {
	CPUMilli  int64
	MemoryMiB int64
	Extended  map[string]int64
}

// IsZero reports whether r holds no resource at all.
func (r Resources) IsZero() bool {
	if r.CPUMilli != 0 || r.MemoryMiB != 0 {
		return false
	}
	for _, v := range r.Extended {
		if v != 0 {
			return false
		}
	}
	return true
}

// Add returns r + o (a new Extended map; neither argument is changed).
func (r Resources) Add(o Resources) Resources {
	out := Resources{CPUMilli: r.CPUMilli + o.CPUMilli, MemoryMiB: r.MemoryMiB + o.MemoryMiB}
	if len(r.Extended)+len(o.Extended) > 0 {
		out.Extended = make(map[string]int64, len(r.Extended)+len(o.Extended))
		for k, v := range r.Extended {
			out.Extended[k] += v
		}
		for k, v := range o.Extended {
			out.Extended[k] += v
		}
	}
	return out
}

// Times returns r scaled by n.
func (r Resources) Times(n int64) Resources {
	out := Resources{CPUMilli: r.CPUMilli * n, MemoryMiB: r.MemoryMiB * n}
	if len(r.Extended) > 0 {
		out.Extended = make(map[string]int64, len(r.Extended))
		for k, v := range r.Extended {
			out.Extended[k] = v * n
		}
	}
	return out
}

// Node is a node as the decider sees it.
type Node struct {
	ID     string
	Region string
	Labels map[string]string
	// Capacity is what the node may give to placements (allocatable, or the operator's override).
	// A node whose CPU and memory are both zero reports no capacity for them and is not limited
	// on them (agents older than capacity reports); extended resources a node does not list are
	// zero.
	Capacity Resources
	// Used is what placements already hold on the node, the replicas of the request that stand
	// on it included.
	Used Resources
	// Cordoned reports whether the node takes no new placements (it keeps what it runs).
	Cordoned bool
	// Unavailable, when not empty, says why the node takes nothing new whatever the request
	// (offline, draining, revoked, retiring, lacks the runtime driver): refused [ReasonUnavailable].
	Unavailable string
	// Endpoint reports whether the node registered a private provider origin (runner nodes).
	Endpoint bool
	// Services counts, by service name, the replicas standing on the node (for anti-affinity);
	// the request's own service is counted from [Request.Existing] instead.
	Services map[string]int
}

// Spread names how replicas of one request are spread.
type Spread string

// Spread kinds: SpreadNode (also when empty) counts replicas per node, SpreadRegion per region,
// and "label:<key>" (see [SpreadLabel]) per value of that node label.
const (
	SpreadNode   Spread = "node"
	SpreadRegion Spread = "region"
)

// SpreadLabel returns the spread over the values of label key.
func SpreadLabel(key string) Spread { return Spread("label:" + key) }

// ParseSpread checks s: "", "node", "region" or "label:<key>".
func ParseSpread(s string) (Spread, error) {
	switch {
	case s == "" || s == string(SpreadNode):
		return SpreadNode, nil
	case s == string(SpreadRegion):
		return SpreadRegion, nil
	case strings.HasPrefix(s, "label:") && len(s) > len("label:"):
		return Spread(s), nil
	}
	return "", fmt.Errorf("spread_by %q: want node, region or label:<key>", s)
}

// Constraints are what a node must satisfy to take a replica.
type Constraints struct {
	// NodeSelector labels must be on the node with exactly these values.
	NodeSelector map[string]string
	// Region, when not empty, must be the node's region.
	Region string
	// Endpoint reports whether the node must have registered an endpoint (runner projects).
	Endpoint bool
	// MaxPerNode, when positive, bounds the replicas of the request on one node.
	MaxPerNode int
	// AntiAffinity names services none of whose replicas may stand on the node.
	AntiAffinity []string
}

// Request is what is placed: replicas of one service (or one runner project, or one stateful
// lease holder), each needing Resources.
type Request struct {
	// Service is the name the request's replicas count under (anti-affinity of other requests
	// names it).
	Service string
	// Resources is what one replica needs.
	Resources Resources
	Constraints
	// SpreadBy spreads the replicas ("" spreads per node).
	SpreadBy Spread
	// Preferences are labels that rank a node higher for each one it has, without excluding
	// the nodes that lack them.
	Preferences map[string]string
	// Existing maps the replicas that already stand somewhere to their node; they count toward
	// spread and max_per_node, and their resources are in that node's Used.
	Existing map[string]string
	// Place lists the replicas to choose a node for, in order.
	Place []string
	// Explain reports whether every node's verdict is kept ([Choice.Considered]); without it
	// only the refusal counts the summary needs are.
	Explain bool
}

// Code names why a node was refused (or that it was taken).
type Code string

// Verdict codes, in the order the decider checks them.
const (
	Taken              Code = "taken"
	ReasonUnavailable  Code = "unavailable"   // the node takes nothing new (offline, draining, revoked, ...)
	ReasonCordoned     Code = "cordoned"      // an operator cordoned the node
	ReasonRegion       Code = "region"        // the node is in another region
	ReasonSelector     Code = "node_selector" // a selector label is missing or differs
	ReasonEndpoint     Code = "endpoint"      // the node has no endpoint and the request needs one
	ReasonAntiAffinity Code = "anti_affinity" // a replica of a service the request avoids stands on the node
	ReasonMaxPerNode   Code = "max_per_node"  // the node holds max_per_node replicas of the request
	ReasonCapacity     Code = "capacity"      // not enough free CPU, memory or an extended resource
	// Outranked: the node was feasible and another ranked higher.
	Outranked Code = "outranked"
)

// NodeVerdict is the decider's word about one node for one replica.
type NodeVerdict struct {
	NodeID string `json:"node_id"`
	Code   Code   `json:"code"`
	// Text says it for a person: "taken", "region is us, wants eu", "needs memory 512 MiB, 256 MiB free".
	Text string `json:"text"`
}

// Choice is the decision for one replica.
type Choice struct {
	Replica string `json:"replica"`
	// NodeID is the node chosen, "" when the replica fits nowhere.
	NodeID string `json:"node_id,omitempty"`
	// Existing reports whether the replica already stood on NodeID (nothing was chosen).
	Existing bool `json:"existing,omitempty"`
	// Reason is, for an unplaceable replica, why ("needs memory 512 MiB, largest free 256 MiB on
	// 3 nodes matching region=eu"); empty otherwise.
	Reason string `json:"reason,omitempty"`
	// Considered is every node's verdict, taken first, then feasible nodes by rank, then refused
	// nodes by id; only with [Request.Explain].
	Considered []NodeVerdict `json:"considered,omitempty"`
}

// Result is the decision for a request.
type Result struct {
	// Choices holds one entry per replica of [Request.Place], in that order.
	Choices []Choice
	// Used is every node's Used after the decision (the input plus what was chosen), by id.
	Used map[string]Resources
}

// Placed returns the node chosen for each placed replica.
func (r Result) Placed() map[string]string {
	out := make(map[string]string, len(r.Choices))
	for _, c := range r.Choices {
		if c.NodeID != "" {
			out[c.Replica] = c.NodeID
		}
	}
	return out
}

// Unplaceable returns the reason of the first replica that fits nowhere, "" when all fit.
func (r Result) Unplaceable() string {
	for _, c := range r.Choices {
		if c.NodeID == "" {
			return c.Reason
		}
	}
	return ""
}

// Choose places each replica of req.Place, in order, on one of nodes:
//
//  1. feasibility: a node is refused when it is unavailable, cordoned, in another region, lacks a
//     selector label, lacks an endpoint the request needs, holds a replica of a service the
//     request avoids, already holds MaxPerNode replicas of the request, or has not the free
//     capacity one replica needs (checked in this order; the first failure is the reason);
//  2. ranking, among feasible nodes: fewest replicas of the request in the node's spread domain
//     (node, region or label value), then most preferences matched, then least loaded after the
//     placement (the sum of its CPU and memory fractions in use), then the lowest id.
//
// Each choice reserves the replica's resources on the chosen node before the next replica is
// decided, so one call never fills a node past its capacity. Choose is pure and deterministic:
// the order of nodes does not matter. nodes is not changed.
func Choose(req Request, nodes []Node) Result {
	ns := slices.Clone(nodes)
	slices.SortFunc(ns, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	used := make(map[string]Resources, len(ns))
	index := make(map[string]int, len(ns))
	for i := range ns {
		used[ns[i].ID] = ns[i].Used
		index[ns[i].ID] = i
	}
	// Replicas of the request per node and per spread domain.
	perNode := map[string]int{}
	perDomain := map[string]int{}
	for _, id := range slices.Sorted(maps.Keys(req.Existing)) {
		nid := req.Existing[id]
		perNode[nid]++
		if i, ok := index[nid]; ok {
			perDomain[domain(req.SpreadBy, &ns[i])]++
		}
	}
	avoid := map[string]bool{}
	for _, s := range req.AntiAffinity {
		if s != "" && s != req.Service {
			avoid[s] = true
		}
	}
	res := Result{Used: used, Choices: make([]Choice, 0, len(req.Place))}
	for _, replica := range req.Place {
		c := Choice{Replica: replica}
		var feasible []int
		var refused []NodeVerdict
		tally := map[Code]int{}
		var short shortage
		for i := range ns {
			n := &ns[i]
			code, text := check(&req, n, used[n.ID], perNode[n.ID], avoid, &short)
			if code != "" {
				tally[code]++
				if req.Explain {
					refused = append(refused, NodeVerdict{NodeID: n.ID, Code: code, Text: text})
				}
				continue
			}
			feasible = append(feasible, i)
		}
		if len(feasible) == 0 {
			c.Reason = unplaceable(&req, len(ns), tally, short)
			c.Considered = refused
			res.Choices = append(res.Choices, c)
			continue
		}
		scores := make(map[int]score, len(feasible))
		for _, i := range feasible {
			scores[i] = rank(&req, &ns[i], used[ns[i].ID], perDomain)
		}
		slices.SortStableFunc(feasible, func(a, b int) int { return compareScores(scores[a], scores[b], ns[a].ID, ns[b].ID) })
		best := &ns[feasible[0]]
		c.NodeID = best.ID
		used[best.ID] = used[best.ID].Add(req.Resources)
		perNode[best.ID]++
		perDomain[domain(req.SpreadBy, best)]++
		if req.Explain {
			for k, i := range feasible {
				v := NodeVerdict{NodeID: ns[i].ID, Code: Outranked, Text: scores[i].text(req.SpreadBy)}
				if k == 0 {
					v.Code, v.Text = Taken, "taken: "+v.Text
				}
				c.Considered = append(c.Considered, v)
			}
			c.Considered = append(c.Considered, refused...)
		}
		res.Choices = append(res.Choices, c)
	}
	return res
}

// domain returns the spread domain of n: its id, its region, or the value of the spread label
// ("" for a node without it, one domain of its own).
func domain(s Spread, n *Node) string {
	switch {
	case s == SpreadRegion:
		return "region=" + n.Region
	case strings.HasPrefix(string(s), "label:"):
		k := strings.TrimPrefix(string(s), "label:")
		return k + "=" + n.Labels[k]
	}
	return "node=" + n.ID
}

// shortage remembers, over the nodes refused only for capacity, the resource the request lacked
// first and the largest free amount of it.
type shortage struct {
	nodes    int
	resource string
	need     int64
	free     int64
	seen     bool
}

// check returns the first refusal of n for one more replica of req ("" when n is feasible).
func check(req *Request, n *Node, used Resources, mine int, avoid map[string]bool, short *shortage) (Code, string) {
	if n.Unavailable != "" {
		return ReasonUnavailable, n.Unavailable
	}
	if n.Cordoned {
		return ReasonCordoned, "cordoned"
	}
	if req.Region != "" && n.Region != req.Region {
		return ReasonRegion, fmt.Sprintf("region is %q, wants %q", n.Region, req.Region)
	}
	for _, k := range slices.Sorted(maps.Keys(req.NodeSelector)) {
		want := req.NodeSelector[k]
		if got, ok := n.Labels[k]; !ok {
			return ReasonSelector, fmt.Sprintf("no label %s (wants %s=%s)", k, k, want)
		} else if got != want {
			return ReasonSelector, fmt.Sprintf("label %s=%s, wants %s=%s", k, got, k, want)
		}
	}
	if req.Endpoint && !n.Endpoint {
		return ReasonEndpoint, "no endpoint registered"
	}
	if len(avoid) > 0 {
		for _, s := range slices.Sorted(maps.Keys(avoid)) {
			if n.Services[s] > 0 {
				return ReasonAntiAffinity, fmt.Sprintf("runs %d replica(s) of %s", n.Services[s], s)
			}
		}
	}
	if req.MaxPerNode > 0 && mine >= req.MaxPerNode {
		return ReasonMaxPerNode, fmt.Sprintf("holds %d replica(s), max_per_node %d", mine, req.MaxPerNode)
	}
	if name, need, free, ok := fits(req.Resources, n.Capacity, used); !ok {
		short.nodes++
		if !short.seen || name == short.resource && free > short.free {
			short.resource, short.need, short.free, short.seen = name, need, free, true
		}
		return ReasonCapacity, fmt.Sprintf("needs %s, %s free", amount(name, need), amount(name, max(free, 0)))
	}
	return "", ""
}

// fits reports whether need fits in capacity minus used; when not, the first resource short (cpu,
// memory, then extended ones by name), the amount needed and the amount free. A node that
// reports neither CPU nor memory is not limited on them.
func fits(need, capacity, used Resources) (resource string, want, free int64, ok bool) {
	if capacity.CPUMilli != 0 || capacity.MemoryMiB != 0 {
		if need.CPUMilli > 0 && capacity.CPUMilli-used.CPUMilli < need.CPUMilli {
			return "cpu", need.CPUMilli, capacity.CPUMilli - used.CPUMilli, false
		}
		if need.MemoryMiB > 0 && capacity.MemoryMiB-used.MemoryMiB < need.MemoryMiB {
			return "memory", need.MemoryMiB, capacity.MemoryMiB - used.MemoryMiB, false
		}
	}
	for _, k := range slices.Sorted(maps.Keys(need.Extended)) {
		if v := need.Extended[k]; v > 0 && capacity.Extended[k]-used.Extended[k] < v {
			return k, v, capacity.Extended[k] - used.Extended[k], false
		}
	}
	return "", 0, 0, true
}

// amount formats v of resource for a person.
func amount(resource string, v int64) string {
	switch resource {
	case "cpu":
		return "cpu " + strconv.FormatInt(v, 10) + "m"
	case "memory":
		return "memory " + strconv.FormatInt(v, 10) + " MiB"
	}
	return resource + " " + strconv.FormatInt(v, 10)
}

// unplaceable says why no node of total took a replica.
func unplaceable(req *Request, total int, tally map[Code]int, short shortage) string {
	if total == 0 {
		return "no nodes"
	}
	match := matching(req)
	if short.seen && tally[ReasonCapacity] > 0 {
		s := fmt.Sprintf("needs %s, largest free %s on %d node", amount(short.resource, short.need), amount(short.resource, max(short.free, 0)), short.nodes)
		if short.nodes != 1 {
			s += "s"
		}
		if match != "" {
			s += " matching " + match
		}
		return s
	}
	var parts []string
	for _, code := range []Code{ReasonUnavailable, ReasonCordoned, ReasonRegion, ReasonSelector, ReasonEndpoint, ReasonAntiAffinity, ReasonMaxPerNode} {
		if n := tally[code]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, code))
		}
	}
	s := "no node fits"
	if match != "" {
		s = "no node matches " + match
	}
	return s + " (" + strings.Join(parts, ", ") + ")"
}

// matching renders the request's region and selector as "region=eu,disk=ssd" ("" for none).
func matching(req *Request) string {
	var parts []string
	if req.Region != "" {
		parts = append(parts, "region="+req.Region)
	}
	for _, k := range slices.Sorted(maps.Keys(req.NodeSelector)) {
		parts = append(parts, k+"="+req.NodeSelector[k])
	}
	return strings.Join(parts, ",")
}

// score is a feasible node's rank for one replica; lower sorts first.
type score struct {
	spread    int   // replicas of the request in the node's spread domain
	preferred int   // preferences the node matches
	load      int64 // parts per million of CPU plus memory in use after the placement
}

func rank(req *Request, n *Node, used Resources, perDomain map[string]int) score {
	s := score{spread: perDomain[domain(req.SpreadBy, n)]}
	for k, v := range req.Preferences {
		if n.Labels[k] == v {
			s.preferred++
		}
	}
	after := used.Add(req.Resources)
	if c := n.Capacity.CPUMilli; c > 0 {
		s.load += after.CPUMilli * 1_000_000 / c
	}
	if c := n.Capacity.MemoryMiB; c > 0 {
		s.load += after.MemoryMiB * 1_000_000 / c
	}
	return s
}

func compareScores(a, b score, aID, bID string) int {
	if c := cmp.Compare(a.spread, b.spread); c != 0 {
		return c
	}
	if c := cmp.Compare(b.preferred, a.preferred); c != 0 {
		return c
	}
	if c := cmp.Compare(a.load, b.load); c != 0 {
		return c
	}
	return strings.Compare(aID, bID)
}

func (s score) text(by Spread) string {
	if by == "" {
		by = SpreadNode
	}
	return fmt.Sprintf("%d in its %s domain, %d preference(s) matched, load %.1f%% after", s.spread, by, s.preferred, float64(s.load)/20_000)
}
