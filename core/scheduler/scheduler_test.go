package scheduler

import (
	"reflect"
	"testing"
)

func TestPlace(t *testing.T) {
	two := []Node{{ID: "a", Schedulable: true}, {ID: "b", Schedulable: true}}
	tests := []struct {
		name     string
		svc      Service
		nodes    []Node
		existing []Workload
		want     []Action
	}{
		{
			name:  "spread over two nodes",
			svc:   Service{Replicas: 3, SpecHash: "h"},
			nodes: two,
			want: []Action{
				{Kind: Create, Slot: 0, NodeID: "a"},
				{Kind: Create, Slot: 1, NodeID: "b"},
				{Kind: Create, Slot: 2, NodeID: "a"},
			},
		},
		{
			name:  "least loaded wins a tie in spread",
			svc:   Service{Replicas: 1, SpecHash: "h"},
			nodes: []Node{{ID: "a", Schedulable: true, Load: 5}, {ID: "b", Schedulable: true, Load: 1}},
			want:  []Action{{Kind: Create, Slot: 0, NodeID: "b"}},
		},
		{
			name:     "scale down removes the highest slots",
			svc:      Service{Replicas: 1, SpecHash: "h"},
			nodes:    two,
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "h"}, {ID: "w1", Slot: 1, NodeID: "b", SpecHash: "h"}, {ID: "w2", Slot: 2, NodeID: "a", SpecHash: "h"}},
			want:     []Action{{Kind: Remove, Slot: 1, WorkloadID: "w1"}, {Kind: Remove, Slot: 2, WorkloadID: "w2"}},
		},
		{
			name:     "converged does nothing",
			svc:      Service{Replicas: 2, SpecHash: "h"},
			nodes:    two,
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "h"}, {ID: "w1", Slot: 1, NodeID: "b", SpecHash: "h"}},
		},
		{
			name:     "a disconnected node keeps its slot",
			svc:      Service{Replicas: 2, SpecHash: "h"},
			nodes:    []Node{{ID: "a", Schedulable: false}, {ID: "b", Schedulable: true}},
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "h"}},
			want:     []Action{{Kind: Create, Slot: 1, NodeID: "b"}},
		},
		{
			name:     "no schedulable node: slots wait",
			svc:      Service{Replicas: 2, SpecHash: "h"},
			nodes:    []Node{{ID: "a"}},
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "old"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w0"}},
		},
		{
			name:     "changed spec replaces in place",
			svc:      Service{Replicas: 1, SpecHash: "new"},
			nodes:    []Node{{ID: "a", Schedulable: true, Load: 1}},
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "old"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w0"}, {Kind: Create, Slot: 0, NodeID: "a"}},
		},
		{
			name:     "duplicate slot is removed",
			svc:      Service{Replicas: 1, SpecHash: "h"},
			nodes:    two,
			existing: []Workload{{ID: "w0", Slot: 0, NodeID: "a", SpecHash: "h"}, {ID: "w9", Slot: 0, NodeID: "b", SpecHash: "h"}},
			want:     []Action{{Kind: Remove, Slot: 0, WorkloadID: "w9"}},
		},
		{
			name:  "zero replicas",
			svc:   Service{Replicas: 0, SpecHash: "h"},
			nodes: two,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Place(tt.svc, tt.nodes, tt.existing)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Place() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// TestPlaceConverges checks, for many shapes, that applying Place's actions
// once yields a state for which Place returns nothing.
func TestPlaceConverges(t *testing.T) {
	for replicas := 0; replicas <= 5; replicas++ {
		for nodes := 1; nodes <= 3; nodes++ {
			for existing := 0; existing <= 6; existing++ {
				var ns []Node
				for i := 0; i < nodes; i++ {
					ns = append(ns, Node{ID: string(rune('a' + i)), Schedulable: true})
				}
				var ws []Workload
				for i := 0; i < existing; i++ {
					hash := "h"
					if i%3 == 2 {
						hash = "old"
					}
					ws = append(ws, Workload{ID: "w" + string(rune('0'+i)), Slot: i % 4, NodeID: ns[i%nodes].ID, SpecHash: hash})
				}
				svc := Service{Replicas: replicas, SpecHash: "h"}
				acts := Place(svc, ns, ws)
				after := apply(ws, acts)
				if again := Place(svc, ns, after); len(again) != 0 {
					t.Fatalf("replicas=%d nodes=%d existing=%d: not converged after one pass: %+v", replicas, nodes, existing, again)
				}
				if len(after) != replicas {
					t.Fatalf("replicas=%d: %d workloads after apply", replicas, len(after))
				}
			}
		}
	}
}

func apply(ws []Workload, acts []Action) []Workload {
	removed := map[string]bool{}
	var out []Workload
	for _, a := range acts {
		if a.Kind == Remove {
			removed[a.WorkloadID] = true
		}
	}
	for _, w := range ws {
		if !removed[w.ID] {
			out = append(out, w)
		}
	}
	for i, a := range acts {
		if a.Kind == Create {
			out = append(out, Workload{ID: "n" + string(rune('0'+i)), Slot: a.Slot, NodeID: a.NodeID, SpecHash: "h"})
		}
	}
	return out
}
