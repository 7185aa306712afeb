package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/core/placement"
)

// BenchmarkPlacementDecide is the pure placement decider over 1,000 nodes (4 regions, two label
// kinds, uneven load, a few cordoned) for 100 services of 3 replicas each with a mix of
// resources, selectors, regions, spreads, max_per_node, anti-affinity and preferences; one
// iteration decides every replica of the 100 services. It reports replica decisions per second
// and whole services per second.
func BenchmarkPlacementDecide(b *testing.B) {
	nodes := make([]placement.Node, 1000)
	for i := range nodes {
		nodes[i] = placement.Node{ID: fmt.Sprintf("nod_%04d", i), Region: fmt.Sprintf("r%d", i%4),
			Labels:   map[string]string{"disk": []string{"ssd", "hdd"}[i%2], "zone": fmt.Sprintf("z%d", i%8)},
			Capacity: placement.Resources{CPUMilli: 16000, MemoryMiB: 32768, Extended: map[string]int64{"gpu": int64(i % 3 / 2)}},
			Used:     placement.Resources{CPUMilli: int64(i%16) * 900, MemoryMiB: int64(i%32) * 1000},
			Cordoned: i%97 == 0, Services: map[string]int{fmt.Sprintf("shop/svc-%d", i%100): 1}}
	}
	reqs := make([]placement.Request, 100)
	for i := range reqs {
		r := placement.Request{Service: fmt.Sprintf("shop/svc-%d", i), Place: []string{"0", "1", "2"},
			Resources: placement.Resources{CPUMilli: int64(100 * (1 + i%8)), MemoryMiB: int64(128 * (1 + i%16))}}
		switch i % 5 {
		case 0:
			r.NodeSelector = map[string]string{"disk": "ssd"}
		case 1:
			r.Region, r.SpreadBy = fmt.Sprintf("r%d", i%4), placement.SpreadLabel("zone")
		case 2:
			r.MaxPerNode, r.AntiAffinity = 1, []string{fmt.Sprintf("shop/svc-%d", (i+1)%100)}
		case 3:
			r.SpreadBy, r.Preferences = placement.SpreadRegion, map[string]string{"disk": "hdd"}
		case 4:
			r.Resources.Extended = map[string]int64{"gpu": 1}
		}
		reqs[i] = r
	}
	b.ResetTimer()
	start := time.Now()
	placed := 0
	for n := 0; n < b.N; n++ {
		for i := range reqs {
			for _, c := range placement.Choose(reqs[i], nodes).Choices {
				if c.NodeID != "" {
					placed++
				}
			}
		}
	}
	el := time.Since(start).Seconds()
	if placed == 0 {
		b.Fatal("nothing was placed")
	}
	b.ReportMetric(float64(b.N*len(reqs)*3)/el, "decisions/s")
	b.ReportMetric(float64(b.N*len(reqs))/el, "services/s")
}
