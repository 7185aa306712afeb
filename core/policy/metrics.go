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
}

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
	reg.MustRegister(m.evaluations, m.seconds)
	return m
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
