package plans

import "github.com/prometheus/client_golang/prometheus"

// metrics are the applier's families (docs/operating.md "Metrics").
type metrics struct {
	entries            prometheus.Counter
	plans              prometheus.Counter
	conflicts          prometheus.Counter
	materialized       prometheus.Counter
	batch              prometheus.Histogram
	appendSeconds      prometheus.Histogram
	materializeSeconds prometheus.Histogram
	lag                prometheus.Gauge
}

// newMetrics makes the families and registers them on reg when it is not nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		entries: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_plan_entries_total",
			Help: "Plan log entries appended (each one insert holding the decisions of a batch of plans)."}),
		plans: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_plans_accepted_total",
			Help: "Plans accepted by the applier and made durable."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_plan_conflicts_total",
			Help: "Plans dropped at the applier's re-check because they no longer fit; their submitters re-plan."}),
		materialized: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_plan_materialized_writes_total",
			Help: "Document writes the materializer sent for durable plan entries."}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_plan_batch_plans",
			Help: "Plans per plan log entry.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_plan_append_seconds",
			Help: "Time to make one plan log entry durable: what every plan of the batch waits.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		materializeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_plan_materialize_seconds",
			Help: "Time to write the documents of the plan entries waiting for the materializer.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_plan_unmaterialized_entries",
			Help: "Durable plan entries whose documents the materializer has not written yet."}),
	}
	if reg != nil {
		reg.MustRegister(m.entries, m.plans, m.conflicts, m.materialized, m.batch, m.appendSeconds, m.materializeSeconds, m.lag)
	}
	return m
}
