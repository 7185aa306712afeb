package rollout

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
)

// Metrics are the families the producer keeps (docs/operating.md "Metrics"): every label set is
// bounded (verdict states and reason kinds are fixed names, node ids the fleet's).
type Metrics struct {
	// verdicts counts services by verdict state and reason kind, as of the last sweep.
	verdicts *prometheus.GaugeVec
	// verdictChanges counts verdict changes by the state and reason kind changed to.
	verdictChanges *prometheus.CounterVec
	// workloads counts the workloads of the swept services by node, observed status and health.
	workloads *prometheus.GaugeVec
	// sweepSeconds is the duration of whole sweeps.
	sweepSeconds prometheus.Histogram
	// rolloutsFailed counts rollouts failed by their progress deadline, by whether they rolled back.
	rolloutsFailed *prometheus.CounterVec
	// steps counts committed slot steps by decision case and whether the slot is a surge name.
	steps *prometheus.CounterVec
}

// NewMetrics registers the producer's families on reg and returns them. It panics, as
// MustRegister does, when reg holds them already (a wiring mistake at startup).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		verdicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "berth_service_verdicts",
			Help: "Services by the state and reason kind of their verdict, as of the last sweep."}, []string{"state", "reason"}),
		verdictChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_service_verdict_changes_total",
			Help: "Verdict changes, by the state and reason kind changed to."}, []string{"state", "reason"}),
		workloads: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "berth_workloads",
			Help: "Workloads of the swept services by node, observed status and health, as of the last sweep."}, []string{"node", "phase", "health"}),
		sweepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_rollout_sweep_duration_seconds",
			Help: "Duration of a whole rollout sweep over every service.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		rolloutsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_rollouts_failed_total",
			Help: "Rollouts failed by their progress deadline, by whether they were rolled back."}, []string{"rolled_back"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_rollout_slot_steps_total",
			Help: "Slot steps committed, by decision case and whether the slot is a replica's surge name (its successor started beside it)."}, []string{"case", "surge"}),
	}
	reg.MustRegister(m.verdicts, m.verdictChanges, m.workloads, m.sweepSeconds, m.rolloutsFailed, m.steps)
	return m
}

// reasonKind is the bounded part of a reason: the name before its ": detail".
func reasonKind(r slots.Reason) string {
	k, _, _ := strings.Cut(string(r), ":")
	return k
}

// sweepTally gathers one sweep's counts; nil-safe throughout.
type sweepTally struct {
	verdicts  map[[2]string]int
	workloads map[[3]string]int
}

func (t *sweepTally) verdict(v slots.Verdict) {
	if t == nil {
		return
	}
	t.verdicts[[2]string{string(v.State), reasonKind(v.Reason)}]++
}

func (t *sweepTally) workload(w *services.Workload) {
	if t == nil || w == nil {
		return
	}
	t.workloads[[3]string{w.NodeID, w.ObservedStatus, w.Health}]++
}

// begin starts a sweep's tally; nil without metrics.
func (m *Metrics) begin() *sweepTally {
	if m == nil {
		return nil
	}
	return &sweepTally{verdicts: map[[2]string]int{}, workloads: map[[3]string]int{}}
}

// end publishes t, a whole sweep's tally, and the sweep's duration.
func (m *Metrics) end(t *sweepTally, took time.Duration) {
	if m == nil || t == nil {
		return
	}
	m.sweepSeconds.Observe(took.Seconds())
	m.verdicts.Reset()
	for k, n := range t.verdicts {
		m.verdicts.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
	m.workloads.Reset()
	for k, n := range t.workloads {
		m.workloads.WithLabelValues(k[0], k[1], k[2]).Set(float64(n))
	}
}

func (m *Metrics) changed(v slots.Verdict) {
	if m != nil {
		m.verdictChanges.WithLabelValues(string(v.State), reasonKind(v.Reason)).Inc()
	}
}

func (m *Metrics) failed(rolledBack bool) {
	if m != nil {
		b := "false"
		if rolledBack {
			b = "true"
		}
		m.rolloutsFailed.WithLabelValues(b).Inc()
	}
}

// step counts a committed slot step of replica (a slot name) decided as c.
func (m *Metrics) step(c slots.Case, replica string) {
	if m != nil {
		surge := "false"
		if slots.BaseReplica(replica) != replica {
			surge = "true"
		}
		m.steps.WithLabelValues(string(c), surge).Inc()
	}
}
