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
	reg.MustRegister(m.sessions, m.dialFailures, m.refused, m.reregistered, up, nodes)
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
	refused prometheus.Counter
}

func newCoreMetrics(reg prometheus.Registerer, c *Core) *coreMetrics {
	if reg == nil {
		return nil
	}
	m := &coreMetrics{refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_relay_streams_refused_total",
		Help: "Relay streams refused for a malformed or oversized header (relay_header_invalid)."})}
	sessions := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_relay_sessions",
		Help: "Relay sessions this core serves."}, func() float64 { return float64(c.Sessions()) })
	reg.MustRegister(m.refused, sessions)
	return m
}

func (m *coreMetrics) streamRefused() {
	if m != nil {
		m.refused.Inc()
	}
}
