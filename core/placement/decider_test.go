package placement_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/core/placement"
)

func res(cpu, mem int64) placement.Resources {
	return placement.Resources{CPUMilli: cpu, MemoryMiB: mem}
}

// node returns a connected node with 1000m and 1024 MiB, nothing used.
func node(id string, mods ...func(*placement.Node)) placement.Node {
	n := placement.Node{ID: id, Region: "eu", Capacity: res(1000, 1024)}
	for _, m := range mods {
		m(&n)
	}
	return n
}

func labels(kv ...string) func(*placement.Node) {
	return func(n *placement.Node) {
		n.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}

func region(r string) func(*placement.Node) { return func(n *placement.Node) { n.Region = r } }

func used(cpu, mem int64) func(*placement.Node) {
	return func(n *placement.Node) { n.Used = res(cpu, mem) }
}

// TestChooseRefusals: every refusal reason, with the code and text the decider gives, and the
// node it takes instead.
func TestChooseRefusals(t *testing.T) {
	ok := node("z-ok")
	tests := []struct {
		name string
		req  placement.Request
		n    placement.Node
		code placement.Code
		text string
	}{
		{"unavailable", placement.Request{}, node("a", func(n *placement.Node) { n.Unavailable = "not connected (disconnected)" }),
			placement.ReasonUnavailable, "not connected (disconnected)"},
		{"cordoned", placement.Request{}, node("a", func(n *placement.Node) { n.Cordoned = true }), placement.ReasonCordoned, "cordoned"},
		{"region", placement.Request{Constraints: placement.Constraints{Region: "eu"}}, node("a", region("us")),
			placement.ReasonRegion, `region is "us", wants "eu"`},
		{"selector missing", placement.Request{Constraints: placement.Constraints{NodeSelector: map[string]string{"gpu": "true"}}}, node("a"),
			placement.ReasonSelector, "no label gpu (wants gpu=true)"},
		{"selector differs", placement.Request{Constraints: placement.Constraints{NodeSelector: map[string]string{"gpu": "true"}}}, node("a", labels("gpu", "false")),
			placement.ReasonSelector, "label gpu=false, wants gpu=true"},
		{"endpoint", placement.Request{Constraints: placement.Constraints{Endpoint: true}}, node("a"), placement.ReasonEndpoint, "no endpoint registered"},
		{"anti-affinity", placement.Request{Service: "shop/web", Constraints: placement.Constraints{AntiAffinity: []string{"shop/db"}}},
			node("a", func(n *placement.Node) { n.Services = map[string]int{"shop/db": 1} }), placement.ReasonAntiAffinity, "runs 1 replica(s) of shop/db"},
		{"max per node", placement.Request{Constraints: placement.Constraints{MaxPerNode: 1}, Existing: map[string]string{"1": "a"}}, node("a"),
			placement.ReasonMaxPerNode, "holds 1 replica(s), max_per_node 1"},
		{"cpu", placement.Request{Resources: res(600, 10)}, node("a", used(500, 0)), placement.ReasonCapacity, "needs cpu 600m, cpu 500m free"},
		{"memory", placement.Request{Resources: res(10, 512)}, node("a", used(0, 768)), placement.ReasonCapacity, "needs memory 512 MiB, memory 256 MiB free"},
		{"extended", placement.Request{Resources: placement.Resources{Extended: map[string]int64{"gpu": 1}}}, node("a"),
			placement.ReasonCapacity, "needs gpu 1, gpu 0 free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, text := placement.Feasible(tt.req, tt.n)
			if code != tt.code || text != tt.text {
				t.Fatalf("Feasible = %s %q, want %s %q", code, text, tt.code, tt.text)
			}
			req := tt.req
			req.Place, req.Explain = []string{"0"}, true
			extra := ok
			if tt.name == "extended" {
				extra.Capacity.Extended = map[string]int64{"gpu": 1}
			}
			if tt.name == "endpoint" {
				extra.Endpoint = true
			}
			if tt.name == "selector missing" || tt.name == "selector differs" {
				extra.Labels = map[string]string{"gpu": "true"}
			}
			got := placement.Choose(req, []placement.Node{tt.n, extra}).Choices[0]
			want := placement.Choice{Replica: "0", NodeID: "z-ok", Considered: []placement.NodeVerdict{
				{NodeID: "z-ok", Code: placement.Taken, Text: got.Considered[0].Text},
				{NodeID: "a", Code: tt.code, Text: tt.text}}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("Choose (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChooseUnplaceable: a replica that fits nowhere gets no node and a reason that says what
// was short, or which requirements refused how many nodes.
func TestChooseUnplaceable(t *testing.T) {
	eu := placement.Constraints{Region: "eu"}
	tests := []struct {
		name  string
		req   placement.Request
		nodes []placement.Node
		want  string
	}{
		{"memory short on the matching nodes", placement.Request{Resources: res(100, 512), Constraints: eu},
			[]placement.Node{node("a", used(0, 768)), node("b", used(0, 900)), node("c", used(0, 1000)), node("d", region("us"))},
			"needs memory 512 MiB, largest free 256 MiB on 3 nodes matching region=eu"},
		{"one node short of a gpu", placement.Request{Resources: placement.Resources{Extended: map[string]int64{"gpu": 1}}},
			[]placement.Node{node("a")}, "needs gpu 1, largest free 0 on 1 node"},
		{"no node matches", placement.Request{Constraints: placement.Constraints{Region: "eu", NodeSelector: map[string]string{"disk": "ssd"}}},
			[]placement.Node{node("a", region("us")), node("b"), node("c", func(n *placement.Node) { n.Cordoned = true })},
			"no node matches region=eu,disk=ssd (refused: 1 cordoned, 1 region, 1 node_selector)"},
		{"no nodes", placement.Request{}, nil, "no nodes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Place = []string{"0"}
			r := placement.Choose(tt.req, tt.nodes)
			if c := r.Choices[0]; c.NodeID != "" || c.Reason != tt.want {
				t.Fatalf("choice %+v, want no node and reason %q", c, tt.want)
			}
			if r.Unplaceable() != tt.want {
				t.Fatalf("Unplaceable() = %q", r.Unplaceable())
			}
		})
	}
}

// TestChooseRanking: spread (node, region, label), then preferences, then least loaded, then
// the lowest id; each choice counts toward the next, and capacity is reserved as it goes.
func TestChooseRanking(t *testing.T) {
	tests := []struct {
		name  string
		req   placement.Request
		nodes []placement.Node
		want  []string // node per replica
	}{
		{"spread over nodes, lowest id on a tie", placement.Request{Place: []string{"0", "1", "2"}},
			[]placement.Node{node("b"), node("a")}, []string{"a", "b", "a"}},
		{"existing replicas count toward spread", placement.Request{Place: []string{"1"}, Existing: map[string]string{"0": "a"}},
			[]placement.Node{node("a"), node("b")}, []string{"b"}},
		{"least loaded wins a spread tie", placement.Request{Place: []string{"0"}},
			[]placement.Node{node("a", used(500, 0)), node("b", used(100, 0))}, []string{"b"}},
		{"spread by region before load", placement.Request{Place: []string{"0", "1"}, SpreadBy: placement.SpreadRegion},
			[]placement.Node{node("a"), node("b"), node("c", region("us"), used(900, 900))}, []string{"a", "c"}},
		{"spread by label", placement.Request{Place: []string{"0", "1", "2"}, SpreadBy: placement.SpreadLabel("zone")},
			[]placement.Node{node("a", labels("zone", "1")), node("b", labels("zone", "1")), node("c", labels("zone", "2"))}, []string{"a", "c", "b"}},
		{"preferences rank without excluding", placement.Request{Place: []string{"0", "1"}, Preferences: map[string]string{"disk": "ssd"}, Constraints: placement.Constraints{MaxPerNode: 1}},
			[]placement.Node{node("a"), node("b", labels("disk", "ssd"), used(800, 800))}, []string{"b", "a"}},
		{"capacity is reserved between replicas", placement.Request{Place: []string{"0", "1", "2"}, Resources: res(600, 100)},
			[]placement.Node{node("a"), node("b")}, []string{"a", "b", ""}},
		{"a node without capacity reports is not limited", placement.Request{Place: []string{"0", "1"}, Resources: res(600, 100)},
			[]placement.Node{{ID: "a"}}, []string{"a", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := placement.Choose(tt.req, tt.nodes)
			var got []string
			for _, c := range r.Choices {
				got = append(got, c.NodeID)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("nodes %q, want %q", got, tt.want)
			}
		})
	}
}

// TestChooseDeterministic: the same cluster in any order gives the same choices and reasons.
func TestChooseDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	nodes, req := randomCluster(rng, 40), randomRequest(rng, 6)
	req.Explain = true
	want := placement.Choose(req, nodes)
	for i := 0; i < 20; i++ {
		shuffled := slices.Clone(nodes)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		if diff := cmp.Diff(want, placement.Choose(req, shuffled)); diff != "" {
			t.Fatalf("shuffle %d changed the decision (-want +got):\n%s", i, diff)
		}
	}
	quiet := req
	quiet.Explain = false
	for i := 0; i < 20; i++ {
		shuffled := slices.Clone(nodes)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		for j, c := range placement.Choose(quiet, shuffled).Choices {
			if c.NodeID != want.Choices[j].NodeID || c.Reason != want.Choices[j].Reason {
				t.Fatalf("replica %s: explaining or the order changed the choice: %+v vs %+v", c.Replica, c, want.Choices[j])
			}
		}
	}
	// Every seed of a few small clusters: the unplaceable reason does not depend on the order.
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		ns, q := randomCluster(r, 1+r.IntN(12)), randomRequest(r, 3)
		q.Resources.CPUMilli *= 4
		first := placement.Choose(q, ns)
		slices.Reverse(ns)
		if diff := cmp.Diff(first, placement.Choose(q, ns)); diff != "" {
			t.Fatalf("seed %d: the reversed node order changed the decision:\n%s", seed, diff)
		}
	}
}

func randomCluster(rng *rand.Rand, n int) []placement.Node {
	nodes := make([]placement.Node, n)
	for i := range nodes {
		capacity := res(int64(500+rng.IntN(4)*500), int64(512+rng.IntN(4)*512))
		if rng.IntN(4) == 0 {
			capacity.Extended = map[string]int64{"gpu": int64(rng.IntN(3))}
		}
		u := res(rng.Int64N(capacity.CPUMilli+1), rng.Int64N(capacity.MemoryMiB+1))
		nd := placement.Node{ID: fmt.Sprintf("nod_%03d", i), Region: []string{"eu", "us"}[rng.IntN(2)], Capacity: capacity, Used: u,
			Labels:   map[string]string{"disk": []string{"ssd", "hdd"}[rng.IntN(2)], "zone": fmt.Sprint(rng.IntN(3))},
			Cordoned: rng.IntN(10) == 0}
		if rng.IntN(10) == 0 {
			nd.Unavailable = "not connected (disconnected)"
		}
		if rng.IntN(5) == 0 {
			nd.Services = map[string]int{"shop/db": 1}
		}
		nodes[i] = nd
	}
	return nodes
}

func randomRequest(rng *rand.Rand, replicas int) placement.Request {
	req := placement.Request{Service: "shop/web", Resources: res(int64(50+rng.IntN(8)*100), int64(64+rng.IntN(8)*128))}
	for i := 0; i < replicas; i++ {
		req.Place = append(req.Place, fmt.Sprint(i))
	}
	if rng.IntN(3) == 0 {
		req.Region = "eu"
	}
	if rng.IntN(3) == 0 {
		req.NodeSelector = map[string]string{"disk": "ssd"}
	}
	if rng.IntN(3) == 0 {
		req.MaxPerNode = 1 + rng.IntN(2)
	}
	if rng.IntN(3) == 0 {
		req.AntiAffinity = []string{"shop/db"}
	}
	if rng.IntN(4) == 0 {
		req.Resources.Extended = map[string]int64{"gpu": 1}
	}
	req.SpreadBy = []placement.Spread{"", placement.SpreadRegion, placement.SpreadLabel("zone")}[rng.IntN(3)]
	if rng.IntN(2) == 0 {
		req.Preferences = map[string]string{"disk": "hdd"}
	}
	return req
}

// TestChooseProperty places random requests on random clusters (seeded, 400 rounds) and checks
// against a simple reference: a chosen node has room (it is never filled past its capacity) and
// meets every requirement; a replica is left unplaced only when no node could take it.
func TestChooseProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 2026))
	for round := 0; round < 400; round++ {
		nodes := randomCluster(rng, 1+rng.IntN(30))
		req := randomRequest(rng, 1+rng.IntN(8))
		req.Explain = round%2 == 0
		r := placement.Choose(req, nodes)
		// Replay the choices one by one on a copy, checking each against Feasible on the state
		// before it.
		state := map[string]*placement.Node{}
		for i := range nodes {
			n := nodes[i]
			n.Used.Extended = maps.Clone(n.Used.Extended)
			state[n.ID] = &n
		}
		existing := map[string]string{}
		for i, c := range r.Choices {
			ref := req
			ref.Existing = maps.Clone(existing)
			if c.NodeID == "" {
				for _, n := range state {
					if code, _ := placement.Feasible(ref, *n); code == "" {
						t.Fatalf("round %d replica %d: unplaced (%s) but %s could take it", round, i, c.Reason, n.ID)
					}
				}
				continue
			}
			n := state[c.NodeID]
			if code, text := placement.Feasible(ref, *n); code != "" {
				t.Fatalf("round %d replica %d: placed on %s, which refuses it: %s %s", round, i, n.ID, code, text)
			}
			n.Used = n.Used.Add(req.Resources)
			existing[c.Replica] = c.NodeID
			if n.Capacity.CPUMilli > 0 && (n.Used.CPUMilli > n.Capacity.CPUMilli || n.Used.MemoryMiB > n.Capacity.MemoryMiB) {
				t.Fatalf("round %d: %s over capacity: used %+v of %+v", round, n.ID, n.Used, n.Capacity)
			}
			for k, v := range n.Used.Extended {
				if v > n.Capacity.Extended[k] {
					t.Fatalf("round %d: %s over its %s: %d of %d", round, n.ID, k, v, n.Capacity.Extended[k])
				}
			}
			if req.Region != "" && n.Region != req.Region || n.Cordoned || n.Unavailable != "" {
				t.Fatalf("round %d: %s breaks a requirement", round, n.ID)
			}
		}
		for id, n := range state {
			if !req.Explain {
				break
			}
			if diff := cmp.Diff(n.Used, r.Used[id], cmp.Comparer(func(a, b map[string]int64) bool { return maps.Equal(a, b) })); diff != "" {
				t.Fatalf("round %d: Result.Used of %s differs from the replay:\n%s", round, id, diff)
			}
		}
	}
}

// TestLeaseTarget: where a stateful service's lease goes.
func TestLeaseTarget(t *testing.T) {
	nodes := []placement.Node{node("a", used(300, 0)), node("b", used(100, 0)),
		node("c", func(n *placement.Node) { n.Unavailable = "not connected (disconnected)" }),
		node("d", labels("disk", "ssd"), used(900, 0))}
	ssd := placement.Request{Constraints: placement.Constraints{NodeSelector: map[string]string{"disk": "ssd"}}}
	tests := []struct {
		name    string
		lease   placement.Lease
		wants   bool
		req     placement.Request
		current string
		grantTo string
	}{
		{"never granted: the decider's node", placement.Lease{Movable: true}, true, placement.Request{}, "", "b"},
		{"never granted, with a selector", placement.Lease{Movable: true}, true, ssd, "", "d"},
		{"free, gate closed: nothing", placement.Lease{}, true, placement.Request{}, "", ""},
		{"held, not movable: stays", placement.Lease{Holder: "c"}, true, placement.Request{}, "c", ""},
		{"movable, holder up: stays", placement.Lease{Holder: "a", Movable: true}, true, placement.Request{}, "a", ""},
		{"movable, holder silent: to the workload's node", placement.Lease{Holder: "c", Movable: true}, true, placement.Request{}, "a", "a"},
		{"movable, holder silent: to the decider's node", placement.Lease{Holder: "c", Movable: true}, true, placement.Request{}, "c", "b"},
		{"movable, holder no longer matches: moved", placement.Lease{Holder: "a", Movable: true}, true, ssd, "a", "d"},
		{"blocked: nothing", placement.Lease{Holder: "c", Movable: true, Blocked: true}, true, placement.Request{}, "c", ""},
		{"no replica wanted: nothing", placement.Lease{Movable: true}, false, placement.Request{}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := placement.LeaseTarget(tt.lease, tt.wants, tt.req, nodes, tt.current)
			if got != tt.grantTo {
				t.Fatalf("grant to %q, want %q", got, tt.grantTo)
			}
		})
	}
	// Nothing fits: no grant, and the choice says why.
	got, c := placement.LeaseTarget(placement.Lease{Movable: true}, true, placement.Request{Resources: res(5000, 1)}, nodes, "")
	if got != "" || c == nil || c.Reason != "needs cpu 5000m, largest free 900m on 3 nodes" {
		t.Fatalf("grant %q, choice %+v", got, c)
	}
}
