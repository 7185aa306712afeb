package services

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReplicaResources: stated fields win; otherwise the container limits, else capacity_units
// (at least 1) times one unit.
func TestReplicaResources(t *testing.T) {
	tests := []struct {
		name string
		svc  Service
		want Resources
	}{
		{"nothing stated: one unit", Service{}, Resources{CPUMilli: 100, MemoryMiB: 128}},
		{"capacity_units is an alias", Service{CapacityUnits: 3}, Resources{CPUMilli: 300, MemoryMiB: 384}},
		{"container limits", Service{CPUMillis: 250, MemoryMB: 64, CapacityUnits: 3}, Resources{CPUMilli: 250, MemoryMiB: 64}},
		{"resources win, field by field", Service{Resources: Resources{MemoryMiB: 512, Extended: map[string]int64{"gpu": 1}}, CPUMillis: 250},
			Resources{CPUMilli: 250, MemoryMiB: 512, Extended: map[string]int64{"gpu": 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.svc.ReplicaResources()); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestValidatePlacement: each bad field is refused with a message naming it.
func TestValidatePlacement(t *testing.T) {
	if err := ValidatePlacement("web", Resources{CPUMilli: 250, MemoryMiB: 512, Extended: map[string]int64{"example.com/fpga": 1}},
		Scheduling{NodeSelector: map[string]string{"disk": "ssd"}, Region: "eu", SpreadBy: "label:zone", MaxPerNode: 2,
			AntiAffinity: []string{"db"}, Preferences: map[string]string{"tier": "fast"}}); err != nil {
		t.Fatalf("a valid placement refused: %v", err)
	}
	for _, tt := range []struct {
		res  Resources
		sch  Scheduling
		want string
	}{
		{Resources{CPUMilli: -1}, Scheduling{}, "resources.cpu_m"},
		{Resources{MemoryMiB: 1 << 30}, Scheduling{}, "resources.memory_mib"},
		{Resources{Extended: map[string]int64{"GPU!": 1}}, Scheduling{}, "resources.extended"},
		{Resources{Extended: map[string]int64{"gpu": -1}}, Scheduling{}, "resources.extended.gpu"},
		{Resources{}, Scheduling{NodeSelector: map[string]string{"Disk Type": "ssd"}}, "node_selector"},
		{Resources{}, Scheduling{SpreadBy: "rack"}, "spread_by"},
		{Resources{}, Scheduling{SpreadBy: "label:"}, "spread_by"},
		{Resources{}, Scheduling{MaxPerNode: -1}, "max_per_node"},
		{Resources{}, Scheduling{AntiAffinity: []string{"web"}}, "anti_affinity"},
		{Resources{}, Scheduling{AntiAffinity: []string{"db", "db"}}, "anti_affinity"},
		{Resources{}, Scheduling{Preferences: map[string]string{"": "x"}}, "preferences"},
	} {
		err := ValidatePlacement("web", tt.res, tt.sch)
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%+v %+v: %v, want an error naming %s", tt.res, tt.sch, err, tt.want)
		}
	}
}
