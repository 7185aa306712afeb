package session

// The session status writer: what a session changes in its node's document (connected under a
// session, disconnected, last_seen_at, applied_rev) is handed to one writer per Server instead
// of being written on the session's own path, so that no session waits for the store, and a
// node's changes made while the writer is busy are folded into one write (docs/store.md,
// "Session status"). The writer is idle when nothing is pending and writes at once when
// something is, so on a quiet core a status lands within one store round trip.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/core/nodes"
)

// statusBatch bounds how many nodes one pass of the writer takes; what is left waits for the
// next pass, which starts at once.
const statusBatch = 256

// statusWriteTimeout bounds one node's writes within a pass.
const statusWriteTimeout = 5 * time.Second

// statusRetry is how long the writer waits after a pass in which the store failed, before it
// tries the failed nodes again.
const statusRetry = time.Second

// statusCloseTimeout bounds the last pass at [Server.Close].
const statusCloseTimeout = 5 * time.Second

// maxEndedKept bounds the ended sessions remembered for one node between passes (a node that
// redials faster than the writer drains); the oldest are dropped, since a newer session's start
// overwrites them in the store anyway.
const maxEndedKept = 8

// started is a session's start as its hello described it.
type started struct {
	session, agentVersion string
	drivers, networks     []string
}

// nodeStatus is what is pending for one node: folded, newest wins.
type nodeStatus struct {
	// ended are sessions of this Server that ended, oldest first: each is written as
	// "disconnected, if still that session".
	ended []string
	// start is the newest session that started and has not ended yet.
	start *started
	// seen asks for last_seen_at to be written, with applied_rev when applied is not nil.
	seen    bool
	applied *int64
}

// merge folds older (what a failed pass took) under s (what arrived since).
func (s *nodeStatus) merge(older *nodeStatus) {
	ended := append(slices.Clone(older.ended), s.ended...)
	if older.start != nil && s.start == nil && !slices.Contains(s.ended, older.start.session) {
		s.start = older.start
	}
	if len(ended) > maxEndedKept {
		ended = ended[len(ended)-maxEndedKept:]
	}
	s.ended = ended
	s.seen = s.seen || older.seen
	if s.applied == nil {
		s.applied = older.applied
	}
}

// statusWriter is the one writer of its Server's session status; see the top of this file.
type statusWriter struct {
	nodes *nodes.Registry
	log   *slog.Logger
	// written is called after a node's status was written: connected reports a session start
	// written, disconnected a session end (with no newer start), applied an applied revision.
	written func(nodeID string, connected, disconnected, applied bool)

	mu      sync.Mutex
	pending map[string]*nodeStatus // mu must be held
	writing int                    // nodes a pass took and is writing; mu must be held

	kick     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	pendingGauge prometheus.GaugeFunc
	failures     prometheus.Counter
}

func newStatusWriter(reg *nodes.Registry, log *slog.Logger, metrics prometheus.Registerer, written func(string, bool, bool, bool)) *statusWriter {
	w := &statusWriter{nodes: reg, log: log, written: written, pending: map[string]*nodeStatus{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if metrics != nil {
		w.pendingGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_node_session_status_pending",
			Help: "Nodes whose session status (connected, disconnected, last seen, applied revision) waits to be written."},
			func() float64 {
				w.mu.Lock()
				defer w.mu.Unlock()
				return float64(len(w.pending))
			})
		w.failures = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_node_session_status_write_failures_total",
			Help: "Node session status writes the store refused or did not answer; each is retried."})
		metrics.MustRegister(w.pendingGauge, w.failures)
	}
	go w.loop()
	return w
}

// with runs change on nodeID's pending status and wakes the writer.
func (w *statusWriter) with(nodeID string, change func(*nodeStatus)) {
	w.mu.Lock()
	st := w.pending[nodeID]
	if st == nil {
		st = &nodeStatus{}
		w.pending[nodeID] = st
	}
	change(st)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// started records that session started on nodeID.
func (w *statusWriter) started(nodeID string, st started) {
	w.with(nodeID, func(s *nodeStatus) { s.start = &st })
}

// ended records that session ended on nodeID.
func (w *statusWriter) ended(nodeID, session string) {
	w.with(nodeID, func(s *nodeStatus) {
		if s.start != nil && s.start.session == session {
			s.start = nil // never written: nothing to undo but an older session's mark
		}
		s.ended = append(s.ended, session)
		if len(s.ended) > maxEndedKept {
			s.ended = s.ended[len(s.ended)-maxEndedKept:]
		}
	})
}

// seen records a frame from nodeID, and its applied revision when applied is not nil.
func (w *statusWriter) seen(nodeID string, applied *int64) {
	w.with(nodeID, func(s *nodeStatus) {
		s.seen = true
		if applied != nil {
			a := *applied
			s.applied = &a
		}
	})
}

// idle reports whether nothing is pending or being written.
func (w *statusWriter) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending) == 0 && w.writing == 0
}

// close stops the writer after a last pass bounded by [statusCloseTimeout].
func (w *statusWriter) close() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

func (w *statusWriter) loop() {
	defer close(w.done)
	for {
		select {
		case <-w.kick:
		case <-w.stop:
			ctx, cancel := context.WithTimeout(context.Background(), statusCloseTimeout)
			for {
				more, failed := w.pass(ctx)
				if !more || failed || ctx.Err() != nil {
					break
				}
			}
			cancel()
			return
		}
		more, failed := w.pass(context.Background())
		if failed {
			select {
			case <-time.After(statusRetry):
			case <-w.stop:
			}
			more = true
		}
		if more {
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
	}
}

// pass writes up to statusBatch nodes' pending status. It reports whether any is left, and
// whether the store failed: the pass then stops at the first failure and puts that node and
// those it had not reached back, so a stalled store costs one bounded write per pass.
func (w *statusWriter) pass(ctx context.Context) (more, failed bool) {
	w.mu.Lock()
	ids := make([]string, 0, min(len(w.pending), statusBatch))
	batch := make(map[string]*nodeStatus, cap(ids))
	for id, st := range w.pending {
		if len(ids) == statusBatch {
			break
		}
		ids = append(ids, id)
		batch[id] = st
		delete(w.pending, id)
	}
	w.writing = len(ids)
	w.mu.Unlock()
	for i, id := range ids {
		err := w.write(ctx, id, batch[id])
		if err == nil {
			continue
		}
		failed = true
		if w.failures != nil {
			w.failures.Inc()
		}
		w.log.Warn("record node session status: the store refused or did not answer; retrying", "node_id", id, "nodes_waiting", len(ids)-i, "err", err)
		w.mu.Lock()
		for _, back := range ids[i:] {
			if cur := w.pending[back]; cur != nil {
				cur.merge(batch[back])
			} else {
				w.pending[back] = batch[back]
			}
		}
		w.mu.Unlock()
		break
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writing = 0
	return len(w.pending) > 0, failed
}

// write writes one node's folded status: the ended sessions first, then the start (which
// overwrites them), then last_seen_at and applied_rev. What succeeded is removed from st, so
// a retry repeats only the rest; each step is idempotent.
func (w *statusWriter) write(ctx context.Context, nodeID string, st *nodeStatus) error {
	ctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	var connected, disconnected, applied bool
	defer func() {
		if connected || disconnected || applied {
			w.written(nodeID, connected, disconnected, applied)
		}
	}()
	for len(st.ended) > 0 {
		if err := w.nodes.SessionEnded(ctx, nodeID, st.ended[0]); err != nil {
			return err
		}
		st.ended = st.ended[1:]
		disconnected = true
	}
	if s := st.start; s != nil {
		if err := w.nodes.SessionStarted(ctx, nodeID, s.session, s.agentVersion, s.drivers, s.networks...); err != nil {
			return err
		}
		st.start = nil
		connected, disconnected = true, false
	}
	if connected && st.applied == nil {
		st.seen = false // the start wrote last_seen_at
	}
	if st.seen {
		if err := w.nodes.Seen(ctx, nodeID, st.applied); err != nil {
			return err
		}
		applied = st.applied != nil
		st.seen, st.applied = false, nil
	}
	return nil
}
