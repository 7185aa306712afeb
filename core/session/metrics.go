package session

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/node"
)

// metrics are the session server's families (docs/operating.md section 6.1); nil when the
// server was given no registry, and every method is then a no-op.
type metrics struct {
	messages   *prometheus.CounterVec
	heartbeats prometheus.Counter
	ended      *prometheus.CounterVec
}

// knownTypes bounds the type label: a node sending anything else counts as "other".
var knownTypes = map[node.Type]bool{
	node.TypeHello: true, node.TypeHeartbeat: true, node.TypeStatusReport: true, node.TypeCommandResult: true,
	node.TypeEvent: true, node.TypeError: true, node.TypePing: true, node.TypePong: true, node.TypeLeaseRenew: true,
	node.TypeStreamData: true, node.TypeStreamEnd: true, node.TypeLogAck: true, node.TypeDNSChallenge: true,
	node.TypeLogSegment: true,
}

// newMetrics registers the families on reg (nil: none) with a gauge of s's open sessions.
func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_node_session_messages_total",
			Help: "Messages received from nodes over their sessions, by type (other for unknown types)."}, []string{"type"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_node_heartbeats_total",
			Help: "Heartbeats received from nodes."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_node_sessions_ended_total",
			Help: "Node sessions that ended, by why: heartbeat_timeout, session_closed, replaced, removed."}, []string{"reason"}),
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_node_sessions", ConstLabels: prometheus.Labels{"status": "connected"},
		Help: "Node sessions open on this berthd, by status."}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.sessions))
	})
	reg.MustRegister(m.messages, m.heartbeats, m.ended, open)
	return m
}

func (m *metrics) message(t node.Type) {
	if m == nil {
		return
	}
	if !knownTypes[t] {
		t = "other"
	}
	m.messages.WithLabelValues(string(t)).Inc()
	if t == node.TypeHeartbeat {
		m.heartbeats.Inc()
	}
}

func (m *metrics) sessionEnded(reason string) {
	if m != nil {
		m.ended.WithLabelValues(reason).Inc()
	}
}
