package policy

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestEvaluationsCountedByModuleAndDecision: each answer of a bound module is counted by module,
// hook, decision and whether it came from memory, and only real runs are timed.
func TestEvaluationsCountedByModuleAndDecision(t *testing.T) {
	ctx := context.Background()
	st, blobs, rt := newTestDeps(t)
	reg := prometheus.NewRegistry()
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Metrics: reg})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	deny, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "no-deploys", Answer: `{"decision":"deny","reasons":["not today"]}`})))
	if err != nil {
		t.Fatal(err)
	}
	allow, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "all-fine", Answer: `{"decision":"allow"}`})))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{deny.Digest, allow.Digest} {
		if _, err := e.Bind(ctx, Binding{Hook: "deploy", ModuleDigest: m}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &services.Service{Project: "default", Name: "web", Replicas: 1}
	n := &nodes.Node{ID: "nod_1", Hostname: "h", Address: "127.0.0.1"}
	for range 2 {
		if ok, _, err := (Deploy{Engine: e}).AdmitDeploy(ctx, svc, 0, n); err != nil || ok {
			t.Fatalf("admit: %v %v", ok, err)
		}
	}
	for _, tc := range []struct {
		module, decision, cached string
	}{
		{"no-deploys", "deny", "false"},
		{"no-deploys", "deny", "true"},
		{"all-fine", "allow", "false"},
		{"all-fine", "allow", "true"},
	} {
		got := testutil.ToFloat64(e.metrics.evaluations.WithLabelValues(tc.module, "deploy", tc.decision, tc.cached))
		if got != 1 {
			t.Errorf("berth_policy_evaluations_total{module=%q,decision=%q,cached=%q} = %v, want 1", tc.module, tc.decision, tc.cached, got)
		}
	}
	// One run per module: the second admission is answered from memory.
	if n := testutil.CollectAndCount(e.metrics.seconds, "berth_policy_evaluation_duration_seconds"); n != 2 {
		t.Errorf("%d duration series, want one per module", n)
	}
	// Both admissions read the bindings and ran (or looked up) the modules;
	// only the first recorded decisions (the second was answered from
	// memory), and without a change log none was appended.
	for stage, want := range map[string]uint64{stageBindings: 2, stageEvaluate: 2, stageIndex: 1, stageLog: 0} {
		var m dto.Metric
		if err := e.metrics.stages.WithLabelValues(stage).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("berth_policy_admission_stage_seconds{stage=%q} has %d samples, want %d", stage, got, want)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "berth_policy_evaluation_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if c := m.GetHistogram().GetSampleCount(); c != 1 {
				t.Errorf("duration series %v has %d samples, want 1", m.GetLabel(), c)
			}
		}
	}
}
