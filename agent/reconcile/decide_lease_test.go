package reconcile

import (
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
)

func stateful(token int64) func(*node.WorkloadSpec) {
	return func(s *node.WorkloadSpec) { s.Stateful, s.LeaseID, s.FencingToken = true, "lse_a", token }
}

// TestDecideStateful covers the stateful start rule (docs/node-protocol.md
// section 6.4): start only while the lease is startable with the spec's
// token and the node is not failed; otherwise stay stopped, recorded, with
// no error.
func TestDecideStateful(t *testing.T) {
	t.Parallel()
	held := map[string]lease.Status{"lse_a": {State: node.LeaseHeld, Token: 7, Startable: true}}
	uncertain := map[string]lease.Status{"lse_a": {State: node.LeaseUncertain, Token: 7}}
	tests := []struct {
		name    string
		spec    node.WorkloadSpec
		rec     *localstore.Workload
		running bool
		leases  map[string]lease.Status
		failed  bool
		want    ActionKind // "" means no action
		msg     string     // part of the recorded message
	}{
		{"held with the spec's token: start", spec("wl_a", stateful(7)), nil, false, held, false, ActStart, ""},
		{"uncertain: stays stopped", spec("wl_a", stateful(7)), nil, false, uncertain, false, ActRecord, "not held"},
		{"token differs: stays stopped", spec("wl_a", stateful(6)), nil, false, held, false, ActRecord, "token 7"},
		{"lease unknown: stays stopped", spec("wl_a", stateful(7)), nil, false, nil, false, ActRecord, "not held by this node"},
		{"node failed: stays stopped", spec("wl_a", stateful(7)), nil, false, held, true, ActRecord, "failed"},
		{"no lease named: stays stopped", spec("wl_a", func(s *node.WorkloadSpec) { s.Stateful = true }), nil, false, held, false, ActRecord, "names no lease"},
		{"crashed, lease gone: stays stopped", spec("wl_a", stateful(7)), ptr(rec("wl_a", PhaseCrashed)), false, uncertain, false, ActRecord, "not held"},
		{"already recorded stopped with the reason: nothing", spec("wl_a", stateful(7)),
			ptr(rec("wl_a", PhaseStopped, func(r *localstore.Workload) {
				r.Message = "waiting for lease: lease lse_a is uncertain, not held"
			})), false, uncertain, false, "", ""},
		{"running while uncertain: kept running", spec("wl_a", stateful(7)), ptr(rec("wl_a", PhaseRunning)), true, uncertain, false, "", ""},
		{"running, spec changed, lease uncertain: not restarted", spec("wl_a", stateful(7), func(s *node.WorkloadSpec) { s.Command = []string{"./v2"} }),
			ptr(rec("wl_a", PhaseRunning)), true, uncertain, false, "", ""},
		{"desired stopped while the lease is gone: stopped", spec("wl_a", stateful(7), func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped }),
			ptr(rec("wl_a", PhaseRunning)), true, nil, false, ActStop, ""},
		{"not stateful: unaffected by a failed node", spec("wl_a"), nil, false, nil, true, ActStart, ""},
		{"interrupted attempt running, lease held: the same attempt again", spec("wl_a", stateful(7)),
			ptr(rec("wl_a", PhaseStarting, func(r *localstore.Workload) { r.StartAttempt = 1 })), true, held, false, ActStart, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := Input{Snapshot: snap(tc.spec), Records: map[string]localstore.Workload{}, Now: t0, Leases: tc.leases, NodeFailed: tc.failed}
			if tc.rec != nil {
				in.Records[tc.rec.WorkloadID] = *tc.rec
			}
			if tc.running {
				in.Driver = map[string]*runtime.WorkloadState{"wl_a": running("wl_a")}
			}
			d := Decide(in)
			if tc.want == "" {
				if len(d.Actions) != 0 {
					t.Fatalf("actions = %+v, want none", d.Actions)
				}
				return
			}
			if len(d.Actions) != 1 || d.Actions[0].Kind != tc.want {
				t.Fatalf("actions = %+v, want one %s", d.Actions, tc.want)
			}
			a := d.Actions[0]
			if tc.want == ActRecord {
				if a.Record == nil || Phase(a.Record.Phase) != PhaseStopped || !strings.Contains(a.Record.Message, tc.msg) {
					t.Errorf("record = %+v, want stopped with a message containing %q", a.Record, tc.msg)
				}
				if a.Record.LeaseID != tc.spec.LeaseID && tc.rec == nil {
					t.Errorf("new record names lease %q, want %q", a.Record.LeaseID, tc.spec.LeaseID)
				}
			}
		})
	}
}

// TestDecideInterruptedStatefulAttemptWithoutLease: a stateful start the
// driver ran but the agent never recorded is not retried while the lease
// may not start anything; the running workload is only adopted (it is never
// stopped here, section 6.4).
func TestDecideInterruptedStatefulAttemptWithoutLease(t *testing.T) {
	t.Parallel()
	uncertain := map[string]lease.Status{"lse_a": {State: node.LeaseUncertain, Token: 7}}
	s := spec("wl_a", stateful(7))
	r := rec("wl_a", PhaseStarting, func(r *localstore.Workload) { r.StartAttempt = 1 })
	d := Decide(Input{Snapshot: snap(s), Records: map[string]localstore.Workload{"wl_a": r}, Now: t0, Leases: uncertain,
		Driver: map[string]*runtime.WorkloadState{"wl_a": running("wl_a")}})
	if len(d.Actions) != 1 || d.Actions[0].Kind != ActRecord || Phase(d.Actions[0].Record.Phase) != PhaseRunning {
		t.Fatalf("actions = %+v; want the running workload adopted", d.Actions)
	}
}
