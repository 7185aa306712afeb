package agent

import (
	"testing"

	"github.com/berthhq/berth/abi/node"
)

func TestDiffObserved(t *testing.T) {
	t.Parallel()
	code := 2
	ws := func(id, status, health string) node.WorkloadStatus {
		return node.WorkloadStatus{WorkloadID: id, ObservedStatus: status, Health: health, LastExitCode: &code}
	}
	prev := map[string]node.WorkloadStatus{
		"wl_a": ws("wl_a", "running", "passing"),
		"wl_b": ws("wl_b", "running", "failing"),
		"wl_c": ws("wl_c", "running", "unknown"),
		"wl_d": ws("wl_d", "running", "failing"),
	}
	cur := []node.WorkloadStatus{
		ws("wl_a", "running", "failing"), // down
		ws("wl_b", "running", "passing"), // up
		ws("wl_c", "crashed", "unknown"), // crashed
		ws("wl_d", "running", "failing"), // unchanged: still down, no new event
		ws("wl_new", "crashed", "failing"),
	}
	got := diffObserved(prev, cur)
	want := []string{"app.down wl_a", "app.up wl_b", "workload.crashed wl_c"}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %v", got, want)
	}
	for i, g := range got {
		if g.Type+" "+g.WorkloadID != want[i] {
			t.Errorf("event %d: %s %s, want %s", i, g.Type, g.WorkloadID, want[i])
		}
	}
	if got[2].Data["exit_code"] != 2 {
		t.Errorf("crash data %v", got[2].Data)
	}
}
