package session

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/services"
)

// TestSessionMetricsAndFailureReports runs a real session: its messages, heartbeats and open
// session are counted, a status report's last failure is kept on the workload, and the end of
// the session is counted by why.
func TestSessionMetricsAndFailureReports(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := newFixture(t, func(c *Config) { c.Metrics = reg })
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	ctx := context.Background()
	p1, _, _ := f.cat.EnsureProject(ctx, "p")
	svc, _, err := f.cat.PutService(ctx, p1, &services.Service{Name: "s", BundleDigest: "sha256:x", Command: []string{"x"}, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := f.cat.CreateWorkload(ctx, svc, 0, f.node.ID)
	code := 2
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	p.send(1, node.TypeHeartbeat, node.Heartbeat{Time: time.Now()})
	p.send(1, node.TypeHeartbeat, node.Heartbeat{Time: time.Now()})
	p.send(1, node.TypeStatusReport, node.StatusReport{Workloads: []node.WorkloadStatus{{WorkloadID: w.ID, ObservedStatus: "crashed",
		Health: "unknown", LastFailure: &node.Failure{Kind: node.FailureExit, ExitCode: &code, At: at, Count: 3}}}})
	p.send(1, node.TypePing, struct{}{}) // messages are handled in order: the pong follows the rest
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("got %s, want pong", env.Type)
	}
	for typ, want := range map[string]float64{"heartbeat": 2, "status_report": 1, "ping": 1} {
		if got := value(t, reg, "berth_node_session_messages_total", "type", typ); got != want {
			t.Errorf("berth_node_session_messages_total{type=%s} = %v, want %v", typ, got, want)
		}
	}
	if got := value(t, reg, "berth_node_heartbeats_total", "", ""); got != 2 {
		t.Errorf("berth_node_heartbeats_total = %v, want 2", got)
	}
	if got := value(t, reg, "berth_node_sessions", "status", "connected"); got != 1 {
		t.Errorf("berth_node_sessions{status=connected} = %v, want 1", got)
	}
	got, err := f.cat.GetWorkload(ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if lf := got.LastFailure; lf == nil || lf.Kind != "exit" || lf.ExitCode == nil || *lf.ExitCode != 2 || lf.Count != 3 || !lf.At.Equal(at.Truncate(time.Millisecond)) {
		t.Fatalf("last failure kept %+v", got.LastFailure)
	}

	// The node goes: the session's end is counted, and no session stays open.
	p.ws.CloseNow()
	deadline := time.Now().Add(10 * time.Second)
	for value(t, reg, "berth_node_sessions_ended_total", "reason", "session_closed") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the closed session was never counted")
		}
		waitChange(t, f.changes, "node.disconnected")
	}
}

// value gathers reg and returns the sample of family name whose label has value (label "":
// the family's only sample), 0 when there is none.
func value(t *testing.T, reg *prometheus.Registry, name, label, val string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" || hasLabel(m, label, val) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, val string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == val {
			return true
		}
	}
	return false
}
