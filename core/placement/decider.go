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

// Resources is an amount of node capacity: CPU in millicores, memory in MiB, extended resources
// an operator declares (gpu, ...) in their own units, and the capacity units of runner nodes
// (docs/runner-protocol.md section 4). A field that is zero asks for (or offers) none of it.
type Resources struct {
	CPUMilli  int64
	MemoryMiB int64
	Extended  map[string]int64
	// Units are runner capacity units; only runner nodes offer them and only runner projects
	// ask for them.
	Units int64
}

// IsZero reports whether r holds no resource at all.
func (r Resources) IsZero() bool {
	if r.CPUMilli != 0 || r.MemoryMiB != 0 || r.Units != 0 {
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
	out := Resources{CPUMilli: r.CPUMilli + o.CPUMilli, MemoryMiB: r.MemoryMiB + o.MemoryMiB, Units: r.Units + o.Units}
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
	out := Resources{CPUMilli: r.CPUMilli * n, MemoryMiB: r.MemoryMiB * n, Units: r.Units * n}
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
	// Used is, with [Request.Explain], every node's Used after the decision (the input plus what
	// was chosen), by id; nil otherwise.
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
//     (node, region or label value), then on the node itself, then most preferences matched,
//     then least loaded after the
//     placement (the sum of the fractions in use of its CPU, memory and each extended resource
//     the request needs), then the lowest id.
//
// Each choice reserves the replica's resources on the chosen node before the next replica is
// decided, so one call never fills a node past its capacity. Choose is pure and deterministic:
// the order of nodes does not matter. nodes is not changed. It costs O(replicas × nodes), with
// no allocation per node unless req.Explain is set.
func Choose(req Request, nodes []Node) Result {
	ns := nodes // read only; the ranking's total order (id last) makes the input order moot
	if req.Explain {
		ns = slices.Clone(nodes)
		slices.SortFunc(ns, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	}
	used := make([]Resources, len(ns))
	for i := range ns {
		used[i] = ns[i].Used
	}
	q := compile(&req)
	// Replicas of the request per node and per spread domain.
	perNode := make([]int, len(ns))
	perDomain := map[string]int{}
	if len(req.Existing) > 0 {
		index := make(map[string]int, len(ns))
		for i := range ns {
			index[ns[i].ID] = i
		}
		for _, id := range slices.Sorted(maps.Keys(req.Existing)) {
			if i, ok := index[req.Existing[id]]; ok {
				perNode[i]++
				perDomain[q.domain(&ns[i])]++
			}
		}
	}
	res := Result{Choices: make([]Choice, 0, len(req.Place))}
	for _, replica := range req.Place {
		c := Choice{Replica: replica}
		var refused []NodeVerdict
		var feasible []int
		tally := map[Code]int{}
		var short shortage
		best, bestScore := -1, score{}
		for i := range ns {
			n := &ns[i]
			if code := q.check(n, &used[i], perNode[i], &short); code != "" {
				tally[code]++
				if req.Explain {
					refused = append(refused, NodeVerdict{NodeID: n.ID, Code: code, Text: q.why(code, n, &used[i], perNode[i])})
				}
				continue
			}
			sc := q.rank(n, &used[i], perNode[i], perDomain)
			if best < 0 || compareScores(sc, bestScore) < 0 {
				best, bestScore = i, sc
			}
			if req.Explain {
				feasible = append(feasible, i)
			}
		}
		if best < 0 {
			c.Reason = q.unplaceable(len(ns), tally, short)
			c.Considered = refused
			res.Choices = append(res.Choices, c)
			continue
		}
		if req.Explain {
			scores := make([]score, len(ns))
			for _, i := range feasible {
				scores[i] = q.rank(&ns[i], &used[i], perNode[i], perDomain)
			}
			slices.SortFunc(feasible, func(a, b int) int { return compareScores(scores[a], scores[b]) })
			for k, i := range feasible {
				v := NodeVerdict{NodeID: ns[i].ID, Code: Outranked, Text: scores[i].text(req.SpreadBy)}
				if k == 0 {
					v.Code, v.Text = Taken, "taken: "+v.Text
				}
				c.Considered = append(c.Considered, v)
			}
			c.Considered = append(c.Considered, refused...)
		}
		n := &ns[best]
		c.NodeID = n.ID
		used[best] = used[best].Add(req.Resources)
		perNode[best]++
		perDomain[q.domain(n)]++
		res.Choices = append(res.Choices, c)
	}
	if req.Explain {
		res.Used = make(map[string]Resources, len(ns))
		for i := range ns {
			res.Used[ns[i].ID] = used[i]
		}
	}
	return res
}

// Feasible returns why node n is refused one more replica of req (a [Code] and its text), ""
// when n may take it. It is the feasibility step of [Choose] for one node: a caller that
// reserves on n's own ledger by compare-and-set checks the node as it read it with Feasible.
// req.Existing counts toward max_per_node.
func Feasible(req Request, n Node) (Code, string) {
	mine := 0
	for _, id := range req.Existing {
		if id == n.ID {
			mine++
		}
	}
	q := compile(&req)
	var short shortage
	if code := q.check(&n, &n.Used, mine, &short); code != "" {
		return code, q.why(code, &n, &n.Used, mine)
	}
	return "", ""
}

// compiled is a request prepared for checking many nodes: keys sorted once.
type compiled struct {
	req      *Request
	selector []string // sorted keys of req.NodeSelector
	avoid    []string // sorted services of req.AntiAffinity, without the request's own
	extended []string // sorted extended resources req needs
	prefs    []string // sorted keys of req.Preferences
	spread   string   // the spread label key, "" for node or region
}

func compile(req *Request) *compiled {
	q := &compiled{req: req, selector: slices.Sorted(maps.Keys(req.NodeSelector)), prefs: slices.Sorted(maps.Keys(req.Preferences))}
	for _, s := range req.AntiAffinity {
		if s != "" && s != req.Service && !slices.Contains(q.avoid, s) {
			q.avoid = append(q.avoid, s)
		}
	}
	slices.Sort(q.avoid)
	for _, k := range slices.Sorted(maps.Keys(req.Resources.Extended)) {
		if req.Resources.Extended[k] > 0 {
			q.extended = append(q.extended, k)
		}
	}
	if k, ok := strings.CutPrefix(string(req.SpreadBy), "label:"); ok {
		q.spread = k
	}
	return q
}

// domain returns the spread domain of n: its id, its region, or the value of the spread label
// (a node without the label is in the domain of the empty value).
func (q *compiled) domain(n *Node) string {
	switch {
	case q.req.SpreadBy == SpreadRegion:
		return n.Region
	case q.spread != "":
		return n.Labels[q.spread]
	}
	return n.ID
}

// shortage remembers, over the nodes refused only for capacity, how many lacked each resource
// (the first one short on each node) and the largest free amount of it.
type shortage struct {
	nodes int // refused for capacity
	by    map[string]*lack
}

type lack struct {
	nodes int
	free  int64
}

func (s *shortage) add(resource string, free int64) {
	s.nodes++
	if s.by == nil {
		s.by = map[string]*lack{}
	}
	l := s.by[resource]
	if l == nil {
		s.by[resource] = &lack{nodes: 1, free: free}
		return
	}
	l.nodes++
	l.free = max(l.free, free)
}

// worst returns the resource most nodes lacked (ties: cpu, memory, then by name), whatever the
// order the nodes were checked in.
func (s *shortage) worst() (string, *lack) {
	best, bl := "", (*lack)(nil)
	rank := func(r string) string {
		switch r {
		case "cpu":
			return "0"
		case "memory":
			return "1"
		}
		return "2" + r
	}
	for r, l := range s.by {
		if bl == nil || l.nodes > bl.nodes || l.nodes == bl.nodes && rank(r) < rank(best) {
			best, bl = r, l
		}
	}
	return best, bl
}

// check returns the first refusal of n for one more replica of the request ("" when n is
// feasible), with used what n holds and mine the request's replicas on it; a capacity refusal
// is recorded in short.
func (q *compiled) check(n *Node, used *Resources, mine int, short *shortage) Code {
	req := q.req
	switch {
	case n.Unavailable != "":
		return ReasonUnavailable
	case n.Cordoned:
		return ReasonCordoned
	case req.Region != "" && n.Region != req.Region:
		return ReasonRegion
	}
	for _, k := range q.selector {
		if got, ok := n.Labels[k]; !ok || got != req.NodeSelector[k] {
			return ReasonSelector
		}
	}
	if req.Endpoint && !n.Endpoint {
		return ReasonEndpoint
	}
	for _, s := range q.avoid {
		if n.Services[s] > 0 {
			return ReasonAntiAffinity
		}
	}
	if req.MaxPerNode > 0 && mine >= req.MaxPerNode {
		return ReasonMaxPerNode
	}
	if name, free, ok := q.fits(n, used); !ok {
		short.add(name, free)
		return ReasonCapacity
	}
	return ""
}

// why says for a person why n was refused with code.
func (q *compiled) why(code Code, n *Node, used *Resources, mine int) string {
	req := q.req
	switch code {
	case ReasonUnavailable:
		return n.Unavailable
	case ReasonCordoned:
		return "cordoned"
	case ReasonRegion:
		return fmt.Sprintf("region is %q, wants %q", n.Region, req.Region)
	case ReasonSelector:
		for _, k := range q.selector {
			want := req.NodeSelector[k]
			if got, ok := n.Labels[k]; !ok {
				return fmt.Sprintf("no label %s (wants %s=%s)", k, k, want)
			} else if got != want {
				return fmt.Sprintf("label %s=%s, wants %s=%s", k, got, k, want)
			}
		}
	case ReasonEndpoint:
		return "no endpoint registered"
	case ReasonAntiAffinity:
		for _, s := range q.avoid {
			if n.Services[s] > 0 {
				return fmt.Sprintf("runs %d replica(s) of %s", n.Services[s], s)
			}
		}
	case ReasonMaxPerNode:
		return fmt.Sprintf("holds %d replica(s), max_per_node %d", mine, req.MaxPerNode)
	case ReasonCapacity:
		name, free, _ := q.fits(n, used)
		return fmt.Sprintf("needs %s, %s free", amount(name, q.need(name)), amount(name, max(free, 0)))
	}
	return string(code)
}

// need returns how much of resource one replica needs.
func (q *compiled) need(resource string) int64 {
	switch resource {
	case "cpu":
		return q.req.Resources.CPUMilli
	case "memory":
		return q.req.Resources.MemoryMiB
	case unitsName:
		return q.req.Resources.Units
	}
	return q.req.Resources.Extended[resource]
}

// fits reports whether one replica fits in n's capacity minus used; when not, the first
// resource short (cpu, memory, then extended ones by name) and how much of it is free. A node
// that reports neither CPU nor memory is not limited on them.
func (q *compiled) fits(n *Node, used *Resources) (resource string, free int64, ok bool) {
	need, capacity := &q.req.Resources, &n.Capacity
	if capacity.CPUMilli != 0 || capacity.MemoryMiB != 0 {
		if need.CPUMilli > 0 && capacity.CPUMilli-used.CPUMilli < need.CPUMilli {
			return "cpu", capacity.CPUMilli - used.CPUMilli, false
		}
		if need.MemoryMiB > 0 && capacity.MemoryMiB-used.MemoryMiB < need.MemoryMiB {
			return "memory", capacity.MemoryMiB - used.MemoryMiB, false
		}
	}
	for _, k := range q.extended {
		if free := capacity.Extended[k] - used.Extended[k]; free < need.Extended[k] {
			return k, free, false
		}
	}
	if need.Units > 0 && capacity.Units-used.Units < need.Units {
		return unitsName, capacity.Units - used.Units, false
	}
	return "", 0, true
}

// unitsName names runner capacity units in reasons.
const unitsName = "capacity_units"

// amount formats v of resource for a person: "cpu 500m", "memory 256 MiB", "gpu 1".
func amount(resource string, v int64) string { return resource + " " + quantity(resource, v) }

// quantity formats v in resource's unit: "500m", "256 MiB", "1".
func quantity(resource string, v int64) string {
	switch resource {
	case "cpu":
		return strconv.FormatInt(v, 10) + "m"
	case "memory":
		return strconv.FormatInt(v, 10) + " MiB"
	}
	return strconv.FormatInt(v, 10)
}

// unplaceable says why none of total nodes took a replica: the resource short on the nodes that
// met every requirement, or how many nodes each requirement refused.
func (q *compiled) unplaceable(total int, tally map[Code]int, short shortage) string {
	if total == 0 {
		return "no nodes"
	}
	match := q.matching()
	if short.nodes > 0 {
		r, l := short.worst()
		s := fmt.Sprintf("needs %s, largest free %s on %d node", amount(r, q.need(r)), quantity(r, max(l.free, 0)), l.nodes)
		if l.nodes != 1 {
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
	return s + " (refused: " + strings.Join(parts, ", ") + ")"
}

// matching renders the request's region and selector as "region=eu,disk=ssd" ("" for none).
func (q *compiled) matching() string {
	var parts []string
	if q.req.Region != "" {
		parts = append(parts, "region="+q.req.Region)
	}
	for _, k := range q.selector {
		parts = append(parts, k+"="+q.req.NodeSelector[k])
	}
	return strings.Join(parts, ",")
}

// score is a feasible node's rank for one replica; lower sorts first.
type score struct {
	spread    int    // replicas of the request in the node's spread domain
	mine      int    // replicas of the request on the node itself
	preferred int    // preferences the node matches
	load      int64  // parts per million in use after the placement, summed over the resources
	id        string // the tie-break
}

func (q *compiled) rank(n *Node, used *Resources, mine int, perDomain map[string]int) score {
	s := score{mine: mine, id: n.ID}
	if len(perDomain) > 0 {
		s.spread = perDomain[q.domain(n)]
	}
	for _, k := range q.prefs {
		if v, ok := n.Labels[k]; ok && v == q.req.Preferences[k] {
			s.preferred++
		}
	}
	need := &q.req.Resources
	if c := n.Capacity.CPUMilli; c > 0 {
		s.load += (used.CPUMilli + need.CPUMilli) * 1_000_000 / c
	}
	if c := n.Capacity.MemoryMiB; c > 0 {
		s.load += (used.MemoryMiB + need.MemoryMiB) * 1_000_000 / c
	}
	for _, k := range q.extended {
		if c := n.Capacity.Extended[k]; c > 0 {
			s.load += (used.Extended[k] + need.Extended[k]) * 1_000_000 / c
		}
	}
	if c := n.Capacity.Units; c > 0 && need.Units > 0 {
		s.load += (used.Units + need.Units) * 1_000_000 / c
	}
	return s
}

func compareScores(a, b score) int {
	if c := cmp.Compare(a.spread, b.spread); c != 0 {
		return c
	}
	if c := cmp.Compare(a.mine, b.mine); c != 0 {
		return c
	}
	if c := cmp.Compare(b.preferred, a.preferred); c != 0 {
		return c
	}
	if c := cmp.Compare(a.load, b.load); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

func (s score) text(by Spread) string {
	if by == "" {
		by = SpreadNode
	}
	return fmt.Sprintf("%d replica(s) in its %s domain, %d on it, %d preference(s) matched, load %.1f%% after", s.spread, by, s.mine, s.preferred, float64(s.load)/20_000)
}
