package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berthhq/berth/internal/wasmtest"
)

// movedFamilies are the families berthd's /metrics must carry, each with at least one sample
// above zero, once a service was deployed through the gateway with a policy bound
// (docs/operating.md "Metrics"). Families that count only what may not happen in a healthy run
// (upstream errors and retries, plugin restarts, failed rollouts) are in presentFamilies or left
// out: a family vector without samples is not exported at all.
var movedFamilies = []string{
	"berth_api_requests_total",
	"berth_gateway_requests_total",
	"berth_gateway_request_duration_seconds",
	"berth_node_sessions",
	"berth_node_heartbeats_total",
	"berth_node_session_messages_total",
	"berth_workloads",
	"berth_service_verdicts",
	"berth_reconcile_passes_total",
	"berth_reconcile_pass_duration_seconds",
	"berth_reconcile_requests_cleared_total",
	"berth_rollout_sweep_duration_seconds",
	"berth_plugin_health",
	"berth_plugin_state",
	"berth_policy_evaluations_total",
	"berth_policy_evaluation_duration_seconds",
	"berth_store_operations_total",
	"berth_store_operation_duration_seconds",
}

// presentFamilies must be exported, with any value.
var presentFamilies = []string{"berth_plugin_restarts_total", "berth_plugin_crashes", "berth_reconcile_requests_held"}

// scrapeMetrics reads and parses berthd's /metrics.
func (cl *cluster) scrapeMetrics(t *testing.T) (map[string]*dto.MetricFamily, error) {
	t.Helper()
	resp, err := cl.hc.Get(cl.url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sampleMoved reports whether m has a value above zero: a counter's or gauge's value, or a
// histogram's sample count.
func sampleMoved(m *dto.Metric) bool {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue() > 0
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue() > 0
	case m.GetHistogram() != nil:
		return m.GetHistogram().GetSampleCount() > 0
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue() > 0
	}
	return false
}

// missingFamilies lists what fams lacks: families of movedFamilies without a sample above
// zero, and families of presentFamilies not exported.
func missingFamilies(fams map[string]*dto.MetricFamily) []string {
	var missing []string
	for _, name := range movedFamilies {
		f, ok := fams[name]
		moved := false
		for _, m := range f.GetMetric() {
			moved = moved || sampleMoved(m)
		}
		if !ok || !moved {
			missing = append(missing, name)
		}
	}
	for _, name := range presentFamilies {
		if f, ok := fams[name]; !ok || len(f.GetMetric()) == 0 {
			missing = append(missing, name+" (absent)")
		}
	}
	sort.Strings(missing)
	return missing
}

// waitMetricFamilies waits until berthd's /metrics shows every family the operating guide
// lists as moved (some, such as heartbeats and the sweep, move on their own schedule).
func (cl *cluster) waitMetricFamilies(t *testing.T) {
	t.Helper()
	waitFor(t, converge, "every metric family on berthd's /metrics with a sample above zero", func() (bool, string) {
		fams, err := cl.scrapeMetrics(t)
		if err != nil {
			return false, err.Error()
		}
		missing := missingFamilies(fams)
		return len(missing) == 0, "missing or unmoved: " + strings.Join(missing, ", ")
	})
}

// bindAllowPolicy binds a policy that allows everything to service.apply, so that every apply
// is evaluated and counted.
func (cl *cluster) bindAllowPolicy(t *testing.T) {
	t.Helper()
	path := filepath.Join(cl.dir, "allow-all.wasm")
	if err := os.WriteFile(path, wasmtest.Policy(wasmtest.PolicyOptions{Name: "allow-all"}), 0o600); err != nil {
		t.Fatal(err)
	}
	out := cl.cli(t, "module", "push", path, "-o", "json")
	var m struct {
		Digest string `json:"digest"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil || m.Digest == "" {
		t.Fatalf("module push: %q, %v", out, err)
	}
	cl.cli(t, "module", "bind", m.Digest, "--hook", "service.apply")
}
