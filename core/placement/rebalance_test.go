package placement_test

import (
	"testing"

	"github.com/berthhq/berth/core/placement"
)

// TestRebalance: moves only what lowers the spread score, never to a node that fails
// feasibility, and nothing when the spread is already as good as the decider can make it.
func TestRebalance(t *testing.T) {
	one := res(100, 128)
	// on returns nodes with the Used of the replicas of existing on each.
	on := func(existing map[string]string, ns ...placement.Node) []placement.Node {
		for i := range ns {
			for _, id := range existing {
				if id == ns[i].ID {
					ns[i].Used = ns[i].Used.Add(one)
				}
			}
		}
		return ns
	}
	cordoned := func(n *placement.Node) { n.Cordoned = true }
	twoOnA := map[string]string{"0": "a", "1": "b", "2": "a"}
	cases := []struct {
		name  string
		req   placement.Request
		nodes []placement.Node
		want  []string // "replica from>to"
	}{
		{"a newcomer takes one replica", placement.Request{Service: "web", Resources: one, Existing: twoOnA},
			on(twoOnA, node("a"), node("b"), node("c")), []string{"2 a>c"}},
		{"a cordoned newcomer takes none", placement.Request{Service: "web", Resources: one, Existing: twoOnA},
			on(twoOnA, node("a"), node("b"), node("c", cordoned)), nil},
		{"a full newcomer takes none", placement.Request{Service: "web", Resources: one, Existing: twoOnA},
			on(twoOnA, node("a"), node("b"), node("c", used(950, 0))), nil},
		{"a newcomer lacking the selector takes none",
			placement.Request{Service: "web", Resources: one, Existing: twoOnA, Constraints: placement.Constraints{NodeSelector: map[string]string{"disk": "ssd"}}},
			on(twoOnA, node("a", labels("disk", "ssd")), node("b", labels("disk", "ssd")), node("c")), nil},
		{"even already", placement.Request{Service: "web", Resources: one, Existing: map[string]string{"0": "a", "1": "b", "2": "c"}},
			on(map[string]string{"0": "a", "1": "b", "2": "c"}, node("a"), node("b"), node("c")), nil},
		{"a move that only swaps the imbalance is not made",
			placement.Request{Service: "web", Resources: one, Existing: map[string]string{"0": "a", "1": "b", "2": "b"}},
			on(map[string]string{"0": "a", "1": "b", "2": "b"}, node("a"), node("b")), nil},
		{"by region: one replica leaves the crowded region",
			placement.Request{Service: "web", Resources: one, SpreadBy: placement.SpreadRegion, Existing: map[string]string{"0": "a", "1": "b"}},
			on(map[string]string{"0": "a", "1": "b"}, node("a"), node("b"), node("c", region("us"))), []string{"1 b>c"}},
		{"four on one node over four nodes: three moves",
			placement.Request{Service: "web", Resources: one, Existing: map[string]string{"0": "a", "1": "a", "2": "a", "3": "a"}},
			on(map[string]string{"0": "a", "1": "a", "2": "a", "3": "a"}, node("a"), node("b"), node("c"), node("d")),
			[]string{"1 a>d", "2 a>c", "3 a>b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			moves := placement.Rebalance(tc.req, tc.nodes)
			var got []string
			for _, m := range moves {
				got = append(got, m.Replica+" "+m.From+">"+m.To)
				if m.Why == "" {
					t.Errorf("move %+v says not why", m)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("moves %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("moves %v, want %v", got, tc.want)
				}
			}
			after := tc.req
			after.Existing = map[string]string{}
			for r, id := range tc.req.Existing {
				after.Existing[r] = id
			}
			for _, m := range moves {
				after.Existing[m.Replica] = m.To
			}
			if len(moves) > 0 && !placement.SpreadOf(after, tc.nodes).Less(placement.SpreadOf(tc.req, tc.nodes)) {
				t.Fatalf("the moves did not lower the spread score")
			}
			if again := placement.Rebalance(after, tc.nodes); len(moves) > 0 && len(again) != 0 {
				// Used is not moved here, so only the spread decides: a second pass finds nothing.
				t.Fatalf("a second rebalance over the result moves %v", again)
			}
		})
	}
}
