package slots

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

func TestNextSpecDefaults(t *testing.T) {
	t.Parallel()
	svc := ServiceFacts{Exists: true, Ports: []int{8080}}
	got, err := NextSpec(SpecWrite{Spec: Spec{Replicas: Replicas{Total: 3}}}, svc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Revision: 1, RunRevision: 1, Placement: Placement{Mode: PlacementScheduled}, Replicas: Replicas{Total: 3}, Network: NetworkHost,
		Readiness: Probe{Kind: ProbeProcess, InitialDelayMS: 1000, StartupGraceMS: 30000, IntervalMS: 5000, TimeoutMS: 2000, Successes: 2, Failures: 3}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("spec (-want +got):\n%s", diff)
	}
	next, err := NextSpec(SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementPinned, Nodes: []string{"n2", "n1"}}, Replicas: Replicas{PerNode: 2},
		Readiness: Probe{Kind: ProbeHTTP, Port: 8080}}, ExpectedRevision: ptr(int64(1))}, svc, &got, map[string]bool{"n1": true, "n2": true})
	if err != nil {
		t.Fatal(err)
	}
	if next.Revision != 2 || next.Placement.Nodes[0] != "n1" || next.Readiness.Path != "/" || next.Readiness.IntervalMS != 5000 {
		t.Fatalf("second write: %+v", next)
	}
}

func TestNextSpecRefusals(t *testing.T) {
	t.Parallel()
	svc := ServiceFacts{Exists: true, Ports: []int{8080}}
	cur := &Spec{Revision: 4}
	nodes := map[string]bool{"n1": true}
	ok := Spec{Replicas: Replicas{Total: 1}}
	tests := []struct {
		name    string
		w       SpecWrite
		svc     ServiceFacts
		current *Spec
		want    Reason
	}{
		{"service-not-found", SpecWrite{Spec: ok}, ServiceFacts{}, nil, ReasonServiceNotFound},
		{"service-deleting", SpecWrite{Spec: ok}, ServiceFacts{Exists: true, Deleting: true}, nil, ReasonServiceDeleting},
		{"null against existing", SpecWrite{Spec: ok}, svc, cur, ReasonConflict},
		{"number against none", SpecWrite{Spec: ok, ExpectedRevision: ptr(int64(4))}, svc, nil, ReasonConflict},
		{"stale number", SpecWrite{Spec: ok, ExpectedRevision: ptr(int64(3))}, svc, cur, ReasonConflict},
		{"spec-node-unknown", SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementPinned, Nodes: []string{"n9"}}, Replicas: Replicas{PerNode: 1}}}, svc, nil, ReasonSpecNodeUnknown},
		{"pinned twice", SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementPinned, Nodes: []string{"n1", "n1"}}, Replicas: Replicas{PerNode: 1}}}, svc, nil, ReasonSpecPlacementInvalid},
		{"pinned none", SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementPinned}, Replicas: Replicas{PerNode: 1}}}, svc, nil, ReasonSpecPlacementInvalid},
		{"nodes for every-node", SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementEveryNode, Nodes: []string{"n1"}}, Replicas: Replicas{PerNode: 1}}}, svc, nil, ReasonSpecPlacementInvalid},
		{"unknown placement", SpecWrite{Spec: Spec{Placement: Placement{Mode: "random"}}}, svc, nil, ReasonSpecPlacementInvalid},
		{"per node on scheduled", SpecWrite{Spec: Spec{Replicas: Replicas{PerNode: 1}}}, svc, nil, ReasonSpecReplicasInvalid},
		{"too many per node", SpecWrite{Spec: Spec{Placement: Placement{Mode: PlacementEveryNode}, Replicas: Replicas{PerNode: 65}}}, svc, nil, ReasonSpecReplicasInvalid},
		{"too many total", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 257}}}, svc, nil, ReasonSpecReplicasInvalid},
		{"memory too small", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Resources: Resources{MemoryBytes: 1024}}}, svc, nil, ReasonSpecResourcesInvalid},
		{"negative cpu", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Resources: Resources{CPUMillis: -1}}}, svc, nil, ReasonSpecResourcesInvalid},
		{"unknown network", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Network: "bridge"}}, svc, nil, ReasonSpecNetworkInvalid},
		{"spec-readiness-target-undeclared", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Readiness: Probe{Kind: ProbeTCP, Port: 9090}}}, svc, nil, ReasonSpecReadinessUndeclared},
		{"probe on isolated network", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Network: NetworkIsolated, Readiness: Probe{Kind: ProbeTCP, Port: 8080}}}, svc, nil, ReasonSpecReadinessUnsupported},
		{"timeout above interval", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Readiness: Probe{IntervalMS: 1000, TimeoutMS: 2000}}}, svc, nil, ReasonSpecReadinessInvalid},
		{"unknown probe", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Readiness: Probe{Kind: "exec"}}}, svc, nil, ReasonSpecReadinessInvalid},
		{"http path", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Readiness: Probe{Kind: ProbeHTTP, Port: 8080, Path: "healthz"}}}, svc, nil, ReasonSpecReadinessInvalid},
		{"failures out of bounds", SpecWrite{Spec: Spec{Replicas: Replicas{Total: 1}, Readiness: Probe{Failures: 11}}}, svc, nil, ReasonSpecReadinessInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NextSpec(tc.w, tc.svc, tc.current, nodes)
			var r *Refusal
			if !errors.As(err, &r) || r.Reason != tc.want || !errors.Is(err, &Refusal{Reason: tc.want}) {
				t.Fatalf("err %v, want %s", err, tc.want)
			}
		})
	}
}

func TestDesire(t *testing.T) {
	t.Parallel()
	nodes := []Node{{ID: "n2", Platform: "linux/amd64", Member: true}, {ID: "n1", Platform: "linux/arm64", Member: true},
		{ID: "n3", Member: true}, {ID: "n4", Platform: "linux/amd64"}}
	every := &Spec{Placement: Placement{Mode: PlacementEveryNode}, Replicas: Replicas{PerNode: 2}}
	got := Desire(every, false, nodes, nil)
	want := DesireResult{Placed: []Placed{{"n1.0", "n1", "linux/arm64"}, {"n1.1", "n1", "linux/arm64"}, {"n2.0", "n2", "linux/amd64"}, {"n2.1", "n2", "linux/amd64"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("every-node (-want +got):\n%s", diff)
	}
	pinned := &Spec{Placement: Placement{Mode: PlacementPinned, Nodes: []string{"n1", "n4"}}, Replicas: Replicas{PerNode: 1}}
	got = Desire(pinned, false, nodes, nil)
	want = DesireResult{Placed: []Placed{{"n1.0", "n1", "linux/arm64"}}, Unplaced: []string{"n4.0"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("pinned (-want +got):\n%s", diff)
	}
	lost := &Spec{Placement: Placement{Mode: PlacementPinned, Nodes: []string{"n4"}}, Replicas: Replicas{PerNode: 1}}
	if got := Desire(lost, false, nodes, nil); got.Refused != ReasonNoEligibleNode || len(got.Placed)+len(got.Unplaced) != 0 {
		t.Fatalf("pinned to a non-member: %+v", got)
	}
	sched := &Spec{Placement: Placement{Mode: PlacementScheduled}, Replicas: Replicas{Total: 3}}
	got = Desire(sched, false, nodes, map[string]string{"0": "n2", "1": "n4"})
	want = DesireResult{Placed: []Placed{{"0", "n2", "linux/amd64"}}, Unplaced: []string{"1", "2"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("scheduled (-want +got):\n%s", diff)
	}
	if got := Desire(sched, false, nodes[2:], nil); got.Refused != ReasonNoEligibleNode {
		t.Fatalf("scheduled without assignable nodes: %+v", got)
	}
	for name, got := range map[string]DesireResult{
		"hold":     Desire(&Spec{Hold: true, Placement: Placement{Mode: PlacementEveryNode}, Replicas: Replicas{PerNode: 1}}, false, nodes, nil),
		"deleting": Desire(every, true, nodes, nil),
		"no spec":  Desire(nil, false, nodes, nil),
		"zero":     Desire(&Spec{Placement: Placement{Mode: PlacementScheduled}}, false, nil, nil),
	} {
		if got.Refused != "" || len(got.Placed) != 0 || len(got.Unplaced) != 0 {
			t.Errorf("%s: %+v, want an empty desire", name, got)
		}
	}
}

func TestCheckServiceUpdate(t *testing.T) {
	t.Parallel()
	probe := &Spec{Readiness: Probe{Kind: ProbeTCP, Port: 8080}}
	for name, tc := range map[string]struct {
		spec   *Spec
		states bool
		ports  []int
		want   Reason
	}{
		"no spec":             {nil, true, nil, ""},
		"owns placement":      {&Spec{}, true, nil, ReasonSpecOwnsPlacement},
		"process probe":       {&Spec{Readiness: Probe{Kind: ProbeProcess}}, false, nil, ""},
		"port kept":           {probe, false, []int{8080, 9090}, ""},
		"port dropped":        {probe, false, []int{9090}, ReasonSpecReadinessUndeclared},
		"placement and ports": {probe, true, []int{9090}, ReasonSpecOwnsPlacement},
	} {
		err := CheckServiceUpdate(tc.spec, tc.states, tc.ports)
		if tc.want == "" && err != nil || tc.want != "" && !errors.Is(err, &Refusal{Reason: tc.want}) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// TestNextSpecKeepsRunRevisionOnReplicaChanges: a write that changes only replica counts,
// placement or hold keeps the key revision, so no running replica drifts; a change of what a
// slot runs moves it; a spec stored before RunRevision existed keys by its revision.
func TestNextSpecKeepsRunRevisionOnReplicaChanges(t *testing.T) {
	t.Parallel()
	svc := ServiceFacts{Exists: true, Ports: []int{8080}}
	cur := Spec{Revision: 4, Placement: Placement{Mode: PlacementScheduled}, Replicas: Replicas{Total: 2}, Network: NetworkHost,
		Readiness: Probe{Kind: ProbeProcess, InitialDelayMS: 1000, StartupGraceMS: 30000, IntervalMS: 5000, TimeoutMS: 2000, Successes: 2, Failures: 3}}
	if cur.KeyRevision() != 4 {
		t.Fatalf("legacy key revision %d, want 4", cur.KeyRevision())
	}
	w := cur
	w.Replicas.Total, w.Hold = 3, true
	next, err := NextSpec(SpecWrite{Spec: w, ExpectedRevision: ptr(int64(4))}, svc, &cur, nil)
	if err != nil {
		t.Fatal(err)
	}
	if next.Revision != 5 || next.KeyRevision() != 4 {
		t.Fatalf("replicas only: revision %d, key revision %d; want 5, 4", next.Revision, next.KeyRevision())
	}
	w = next
	w.Resources.CPUMillis = 500
	third, err := NextSpec(SpecWrite{Spec: w, ExpectedRevision: ptr(int64(5))}, svc, &next, nil)
	if err != nil {
		t.Fatal(err)
	}
	if third.KeyRevision() != 6 {
		t.Fatalf("resources changed: key revision %d, want 6", third.KeyRevision())
	}
}
