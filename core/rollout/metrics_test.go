package rollout_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/berthhq/berth/core/rollout"
)

// TestMetricsMoveWithARealSweep runs sweeps over a real store to convergence and checks every
// family of the producer by name, with samples that moved.
func TestMetricsMoveWithARealSweep(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarnessWith(t, 2, rollout.NewMetrics(reg))
	svc := h.put("sha256:a", 2)
	h.until(10, "converged", h.converged(svc.ID), nil)
	h.step() // one more sweep publishes the converged verdict's tally
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	sum := func(name string, match map[string]string) float64 {
		f := byName[name]
		if f == nil {
			t.Fatalf("no family %s (have %v)", name, byName)
		}
		total := 0.0
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := match[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return total
	}
	if n := sum("berth_service_verdicts", map[string]string{"state": "converged"}); n != 1 {
		t.Errorf("berth_service_verdicts{state=converged} = %v, want 1", n)
	}
	if n := sum("berth_service_verdict_changes_total", map[string]string{"state": "converged"}); n < 1 {
		t.Errorf("berth_service_verdict_changes_total{state=converged} = %v", n)
	}
	if n := sum("berth_workloads", map[string]string{"phase": "running", "health": "passing"}); n != 2 {
		t.Errorf("berth_workloads{running,passing} = %v, want 2", n)
	}
	if n := sum("berth_rollout_sweep_duration_seconds", nil); n < 2 {
		t.Errorf("berth_rollout_sweep_duration_seconds count = %v", n)
	}
	if n := sum("berth_rollout_slot_steps_total", map[string]string{"case": "admit-run-first", "surge": "false"}); n != 2 {
		t.Errorf("berth_rollout_slot_steps_total{admit-run-first} = %v, want 2", n)
	}
	// A release change under the default bounds starts each successor beside its replica.
	h.put("sha256:b", 2)
	h.until(20, "converged on release b", func() bool { return h.converged(svc.ID)() && h.serving(svc)["sha256:b"] == 2 }, nil)
	if fams, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	if n := sum("berth_rollout_slot_steps_total", map[string]string{"case": "admit-run-first", "surge": "true"}); n != 2 {
		t.Errorf("berth_rollout_slot_steps_total{admit-run-first,surge} = %v, want 2", n)
	}
	if _, ok := byName["berth_rollouts_failed_total"]; ok {
		t.Errorf("berth_rollouts_failed_total moved without a failed rollout")
	}
}
