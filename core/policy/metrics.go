package policy

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// metrics are the engine's families (docs/operating.md "Metrics"). The module label is the
// bound module's name (the digest's first 12 hex digits for a module without one), so the
// label sets are bounded by the bindings an operator makes; hooks and decisions are fixed names.
type metrics struct {
	evaluations *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	stages      *prometheus.HistogramVec
}

// Stages of one admission, the stage label of
// berth_policy_admission_stage_seconds.
const (
	stageBindings = "bindings" // reading the live bindings (one read per burst)
	stageEvaluate = "evaluate" // every binding's module run, concurrently
	stageLog      = "log"      // appending the decisions to the change log
	stageIndex    = "index"    // writing the decisions to the index
)

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		evaluations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_policy_evaluations_total",
			Help: "Answers of bound policy modules, by module, hook, decision (allow, deny or error) and whether the engine answered from memory."},
			[]string{"module", "hook", "decision", "cached"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "berth_policy_evaluation_duration_seconds",
			Help:    "Duration of policy module runs (answers from memory excluded), by module and hook.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"module", "hook"}),
	}
	m.stages = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "berth_policy_admission_stage_seconds",
		Help:    "Time one admission spent in each stage: bindings (reading them), evaluate (the modules), log (appending the decisions to the change log), index (indexing them).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"stage"})
	reg.MustRegister(m.evaluations, m.seconds, m.stages)
	return m
}

// spent records the time since start in stage; nil-safe.
func (m *metrics) spent(stage string, start time.Time) {
	if m == nil {
		return
	}
	m.stages.WithLabelValues(stage).Observe(time.Since(start).Seconds())
}

// moduleLabel is the module label of b.
func moduleLabel(b Binding) string {
	if b.Module != "" {
		return b.Module
	}
	d := strings.TrimPrefix(b.ModuleDigest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// answered counts one binding's answer; nil-safe.
func (m *metrics) answered(b Binding, hook abiwasm.Hook, decision string, cached bool) {
	if m == nil {
		return
	}
	c := "false"
	if cached {
		c = "true"
	}
	m.evaluations.WithLabelValues(moduleLabel(b), string(hook), decision, c).Inc()
}

// ran records the duration of one module run; nil-safe.
func (m *metrics) ran(b Binding, hook abiwasm.Hook, d time.Duration) {
	if m == nil {
		return
	}
	m.seconds.WithLabelValues(moduleLabel(b), string(hook)).Observe(d.Seconds())
}
