package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlaceStateful(t *testing.T) {
	svc := Service{Replicas: 1, SpecHash: "h"}
	up := []Node{{ID: "a", Schedulable: true, Load: 3}, {ID: "b", Schedulable: true, Load: 1}, {ID: "c", Schedulable: false}}
	tests := []struct {
		name     string
		svc      Service
		lease    Lease
		existing []Workload
		grantTo  string
		want     []Action
	}{
		{name: "never granted: least loaded node, grant first", svc: svc, lease: Lease{Movable: true},
			grantTo: "b", want: []Action{{Kind: Create, Slot: 0, NodeID: "b"}}},
		{name: "free, gate closed: nothing", svc: svc, lease: Lease{}},
		{name: "held: stays, created on the holder", svc: svc, lease: Lease{Holder: "a"},
			want: []Action{{Kind: Create, Slot: 0, NodeID: "a"}}},
		{name: "local holder disconnected: stays there", svc: svc, lease: Lease{Holder: "c"},
			existing: []Workload{{ID: "w1", NodeID: "c", SpecHash: "h"}}},
		{name: "held elsewhere than the workload: moved to the holder", svc: svc, lease: Lease{Holder: "a"},
			existing: []Workload{{ID: "w1", NodeID: "b", SpecHash: "h"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w1"}, {Kind: Create, Slot: 0, NodeID: "a"}}},
		{name: "movable, holder silent: to the workload's node if up", svc: svc, lease: Lease{Holder: "c", Movable: true},
			existing: []Workload{{ID: "w1", NodeID: "a", SpecHash: "h"}}, grantTo: "a"},
		{name: "movable, holder silent: to the least loaded", svc: svc, lease: Lease{Holder: "c", Movable: true},
			existing: []Workload{{ID: "w1", NodeID: "c", SpecHash: "h"}}, grantTo: "b",
			want: []Action{{Kind: Remove, Slot: 0, WorkloadID: "w1"}, {Kind: Create, Slot: 0, NodeID: "b"}}},
		{name: "movable but the holder is up: stays", svc: svc, lease: Lease{Holder: "a", Movable: true},
			existing: []Workload{{ID: "w1", NodeID: "a", SpecHash: "h"}}},
		{name: "blocked: nothing moves", svc: svc, lease: Lease{Holder: "c", Blocked: true},
			existing: []Workload{{ID: "w1", NodeID: "c", SpecHash: "h"}}},
		{name: "spec drift: replaced on the holder", svc: svc, lease: Lease{Holder: "a"},
			existing: []Workload{{ID: "w1", NodeID: "a", SpecHash: "old"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w1"}, {Kind: Create, Slot: 0, NodeID: "a"}}},
		{name: "scaled to zero and duplicates removed", svc: Service{Replicas: 0, SpecHash: "h"}, lease: Lease{Holder: "a"},
			existing: []Workload{{ID: "w1", NodeID: "a", SpecHash: "h"}, {ID: "w2", Slot: 1, NodeID: "b", SpecHash: "h"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w1"}, {Kind: Remove, Slot: 1, WorkloadID: "w2"}}},
		{name: "no schedulable node: waits", svc: svc, lease: Lease{Movable: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := up
			if tt.name == "no schedulable node: waits" {
				nodes = []Node{{ID: "c"}}
			}
			grantTo, acts := PlaceStateful(tt.svc, tt.lease, nodes, tt.existing)
			if grantTo != tt.grantTo {
				t.Fatalf("grantTo %q, want %q", grantTo, tt.grantTo)
			}
			if diff := cmp.Diff(tt.want, acts); diff != "" {
				t.Fatalf("actions (-want +got):\n%s", diff)
			}
		})
	}
}
