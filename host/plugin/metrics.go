package plugin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/pluginapi"
)

// StatusCollector exports the handles' status snapshots as metrics (docs/operating.md
// "Metrics"), read at every scrape, so a handle keeps no second set of counters:
//
//   - berth_plugin_health{plugin,kind,health}: 1 for the health the plugin reports now
//     (healthy, unhealthy, undetected, or "unknown" before its first report), 0 for the others;
//   - berth_plugin_state{plugin,kind,state}: 1 for the handle's [State], 0 for the others;
//   - berth_plugin_restarts_total{plugin,kind}: relaunches after the first launch
//     ([Status.Launches] minus one), crashes and unhealthy-window restarts alike;
//   - berth_plugin_crashes{plugin,kind}: crashes within the crash window ([Status.Crashes]).
//
// Labels are bounded by the handles the host runs. List is called once per scrape and must be
// safe for concurrent use; nil lists none.
type StatusCollector struct {
	List func() []Status
}

var _ prometheus.Collector = (*StatusCollector)(nil)

var (
	pluginHealthDesc   = prometheus.NewDesc("berth_plugin_health", "Health a plugin reports on its Health stream: 1 for the current one.", []string{"plugin", "kind", "health"}, nil)
	pluginStateDesc    = prometheus.NewDesc("berth_plugin_state", "State of a plugin handle: 1 for the current one.", []string{"plugin", "kind", "state"}, nil)
	pluginRestartsDesc = prometheus.NewDesc("berth_plugin_restarts_total", "Relaunches of a plugin process after its first launch.", []string{"plugin", "kind"}, nil)
	pluginCrashesDesc  = prometheus.NewDesc("berth_plugin_crashes", "Crashes of a plugin within its crash window.", []string{"plugin", "kind"}, nil)
)

// healthLabels are the values of the health label; "unknown" stands for no report yet.
var healthLabels = []string{string(pluginapi.Healthy), string(pluginapi.Unhealthy), string(pluginapi.Undetected), "unknown"}

// stateLabels are the values of the state label.
var stateLabels = []State{StateRunning, StateRestarting, StateQuarantined, StateClosed}

// Describe sends the four descriptors.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pluginHealthDesc
	ch <- pluginStateDesc
	ch <- pluginRestartsDesc
	ch <- pluginCrashesDesc
}

// Collect sends one sample per handle, health and state value.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	if c.List == nil {
		return
	}
	for _, st := range c.List() {
		kind := string(st.Kind)
		health := string(st.Health)
		if health == "" {
			health = "unknown"
		}
		for _, h := range healthLabels {
			ch <- prometheus.MustNewConstMetric(pluginHealthDesc, prometheus.GaugeValue, b2f(h == health), st.Name, kind, h)
		}
		for _, s := range stateLabels {
			ch <- prometheus.MustNewConstMetric(pluginStateDesc, prometheus.GaugeValue, b2f(s == st.State), st.Name, kind, string(s))
		}
		ch <- prometheus.MustNewConstMetric(pluginRestartsDesc, prometheus.CounterValue, float64(max(st.Launches-1, 0)), st.Name, kind)
		ch <- prometheus.MustNewConstMetric(pluginCrashesDesc, prometheus.GaugeValue, float64(st.Crashes), st.Name, kind)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
