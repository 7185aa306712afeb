package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

// relayMetrics are the relay side's families (docs/relay.md section 7); nil when the relay was given
// no registry, and every method is then a no-op.
type relayMetrics struct {
	sessions     prometheus.Counter
	dialFailures prometheus.Counter
	refused      *prometheus.CounterVec
	reregistered prometheus.Counter
	parkedGauge  prometheus.Gauge
}

func newRelayMetrics(reg prometheus.Registerer, r *Relay) *relayMetrics {
	if reg == nil {
		return nil
	}
	m := &relayMetrics{
		sessions: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_core_sessions_total",
			Help: "Sessions to the core this relay established (each one after the first is a reconnect)."}),
		dialFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_core_dial_failures_total",
			Help: "Dials of the core that failed or were refused."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_relay_node_connections_refused_total",
			Help: "Node connections closed before they were carried, by reason: tls_handshake, no_core_session, open_stream."}, []string{"reason"}),
		reregistered: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_node_reregistrations_total",
			Help: "Node connections closed after a reconnect so the node registers on the new session."}),
		parkedGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_relay_parked",
			Help: "1 once the relay parked: its credential's generation was rotated away and it registers no more."}),
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_relay_core_session_up",
		Help: "1 while the relay holds an established session to the core."}, func() float64 {
		if ok, _ := r.Ready(); ok {
			return 1
		}
		return 0
	})
	nodes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_relay_node_connections",
		Help: "Node connections the relay carries."}, func() float64 { return float64(r.Nodes()) })
	reg.MustRegister(m.sessions, m.dialFailures, m.refused, m.reregistered, m.parkedGauge, up, nodes)
	return m
}

func (m *relayMetrics) sessionUp() {
	if m != nil {
		m.sessions.Inc()
	}
}

func (m *relayMetrics) dialFailed() {
	if m != nil {
		m.dialFailures.Inc()
	}
}

func (m *relayMetrics) nodeRefused(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

func (m *relayMetrics) nodeReregistered() {
	if m != nil {
		m.reregistered.Inc()
	}
}

// coreMetrics are the core side's families; nil without a registry.
type coreMetrics struct {
	refused       prometheus.Counter
	relaysRefused prometheus.Counter
}

func newCoreMetrics(reg prometheus.Registerer, c *Core) *coreMetrics {
	if reg == nil {
		return nil
	}
	m := &coreMetrics{refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_streams_refused_total",
		Help: "Relay streams refused: a malformed or oversized header (relay_header_invalid), or a stream the relay's admission refused (another cluster's node, a superseded registration)."}),
		relaysRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_sessions_refused_total",
			Help: "Relay upgrades refused after the protocol version: a bad or stale credential, a refused registration."})}
	sessions := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_relay_sessions",
		Help: "Relay sessions this core serves."}, func() float64 { return float64(c.Sessions()) })
	reg.MustRegister(m.refused, m.relaysRefused, sessions)
	return m
}

func (m *coreMetrics) streamRefused() {
	if m != nil {
		m.refused.Inc()
	}
}

func (m *coreMetrics) relayRefused() {
	if m != nil {
		m.relaysRefused.Inc()
	}
}

func (m *relayMetrics) parked() {
	if m != nil {
		m.parkedGauge.Set(1)
	}
}
