package store

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
)

// storeCommands are the command names counted under their own name; every other command is
// counted as "other", so the command label stays bounded whatever the driver sends.
var storeCommands = map[string]bool{
	"find": true, "getMore": true, "insert": true, "update": true, "delete": true,
	"findAndModify": true, "aggregate": true, "count": true, "distinct": true,
	"createIndexes": true, "listCollections": true, "listIndexes": true, "drop": true,
	"hello": true, "ping": true, "killCursors": true, "endSessions": true,
}

// commandMetrics counts the driver's commands by command name, collection and outcome, with
// their latency (docs/operating.md "Metrics"). The collection label is bounded by the code:
// Berth names its collections in constants, and a command that names none has "".
type commandMetrics struct {
	ops     *prometheus.CounterVec
	seconds *prometheus.HistogramVec

	mu      sync.Mutex
	started map[string][2]string // pendingKey -> command, collection
}

func newCommandMetrics(reg prometheus.Registerer) *commandMetrics {
	m := &commandMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_store_operations_total",
			Help: "Store commands sent by berthd, by command name, collection and outcome (ok or error)."},
			[]string{"command", "collection", "outcome"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "berth_store_operation_duration_seconds",
			Help:    "Latency of store commands as the driver measured it, by command name and collection.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"command", "collection"}),
		started: map[string][2]string{},
	}
	reg.MustRegister(m.ops, m.seconds)
	return m
}

// sibling returns a commandMetrics over the same families with its own table of started
// commands, for a second client (whose connection ids may repeat the first's).
func (m *commandMetrics) sibling() *commandMetrics {
	return &commandMetrics{ops: m.ops, seconds: m.seconds, started: map[string][2]string{}}
}

// commandCollection is the collection a command names: its first field's string value, or the
// "collection" field of a getMore; "" for commands that name none.
func commandCollection(name string, cmd bson.Raw) string {
	if c, ok := cmd.Lookup(name).StringValueOK(); ok {
		return c
	}
	c, _ := cmd.Lookup("collection").StringValueOK()
	return c
}

func (m *commandMetrics) start(e *event.CommandStartedEvent) {
	name := e.CommandName
	if !storeCommands[name] {
		name = "other"
	}
	m.mu.Lock()
	m.started[pendingKey(e.ConnectionID, e.RequestID)] = [2]string{name, commandCollection(e.CommandName, e.Command)}
	m.mu.Unlock()
}

func (m *commandMetrics) finish(conn string, req int64, d time.Duration, outcome string) {
	key := pendingKey(conn, req)
	m.mu.Lock()
	l, ok := m.started[key]
	delete(m.started, key)
	m.mu.Unlock()
	if !ok {
		return
	}
	m.ops.WithLabelValues(l[0], l[1], outcome).Inc()
	m.seconds.WithLabelValues(l[0], l[1]).Observe(d.Seconds())
}

// replyOutcome is "error" for a reply that succeeded as a command but carries write errors (a
// duplicate key, a refused write concern), "ok" otherwise.
func replyOutcome(reply bson.Raw) string {
	if _, err := reply.LookupErr("writeErrors"); err == nil {
		return "error"
	}
	if _, err := reply.LookupErr("writeConcernError"); err == nil {
		return "error"
	}
	return "ok"
}

// joinMonitors returns a monitor that calls view's callbacks (when view is not nil) and then,
// when m is not nil, counts the command; nil when both are nil.
func joinMonitors(view *event.CommandMonitor, m *commandMetrics) *event.CommandMonitor {
	if m == nil {
		return view
	}
	if view == nil {
		view = &event.CommandMonitor{
			Started:   func(context.Context, *event.CommandStartedEvent) {},
			Succeeded: func(context.Context, *event.CommandSucceededEvent) {},
			Failed:    func(context.Context, *event.CommandFailedEvent) {},
		}
	}
	return &event.CommandMonitor{
		Started: func(ctx context.Context, e *event.CommandStartedEvent) {
			view.Started(ctx, e)
			m.start(e)
		},
		Succeeded: func(ctx context.Context, e *event.CommandSucceededEvent) {
			view.Succeeded(ctx, e)
			m.finish(e.ConnectionID, e.RequestID, e.Duration, replyOutcome(e.Reply))
		},
		Failed: func(ctx context.Context, e *event.CommandFailedEvent) {
			view.Failed(ctx, e)
			m.finish(e.ConnectionID, e.RequestID, e.Duration, "error")
		},
	}
}
