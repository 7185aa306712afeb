// Package session is the core's side of the node session: the WebSocket a node
// dials, the v1 envelope, and the handshake and steady state of
// docs/node-protocol.md sections 3 to 5.
package session

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/version"
)

// drainLimit bounds how much of an oversized frame is read and discarded
// before the connection is closed instead.
const drainLimit = 16 << 20

// Config wires a Server. Nodes, Catalog and SigningKey are required.
type Config struct {
	Nodes      *nodes.Registry
	Catalog    *services.Catalog
	SigningKey ed25519.PrivateKey
	// RetiredKeys are signing keys replaced by a rotation, by node.KeyID of
	// their public half: a node whose hello names one is handed the current
	// key under its signature (docs/node-protocol.md section 5.21). Nil
	// means none.
	RetiredKeys map[string]ed25519.PrivateKey
	ClusterID   string
	// Events receives node.connected and node.disconnected and every event a
	// node sends (section 5.4); nil means events are logged only.
	Events *events.Log
	Logger *slog.Logger
	// OnChange is called (without blocking for long) when something the
	// reconciler depends on changed: a node connected or disconnected, or a
	// status report changed a workload. reason is for logs. Nil means no-op.
	OnChange func(reason string)
	// OnNodeChange, when not nil, is called beside OnChange with the node the change is about,
	// so the reconciler wakes that node's work at once (docs/reconciliation.md section 6). It
	// must not block for long.
	OnNodeChange func(reason, nodeID string)
	// Changelog, when not nil, is delivered to every node after its desired
	// state (log_entries, section 7.4); nil means nodes follow no log.
	Changelog ChangeLog
	// LogFollowDelay is how long a follower that is at the head of the change log waits after
	// an append before it reads what is new, so that the entries of a burst reach each node as
	// one log_entries batch with one log_ack, not one batch and ack per append
	// (docs/node-protocol.md section 7.4). Zero means [DefaultLogFollowDelay], negative none.
	LogFollowDelay time.Duration
	// RelayRequired, when not nil, reports whether the cluster named requires a relay: a node
	// of such a cluster that dials the core directly is refused 403 relay_required before its
	// session opens (docs/relay.md section 8). An error answers 503, as a stalled store does.
	// Nil admits every direct node. Not asked for nodes of the default cluster.
	RelayRequired func(ctx context.Context, cluster string) (bool, error)
	// HeartbeatInterval and SessionTimeout are sent in welcome; zero means the
	// protocol defaults (5 s and 15 s).
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	// Leases, when not nil, is the lease authority: stale leases of hello are revoked right
	// after welcome, lease_renew is answered, and fence events are recorded (leases.go,
	// docs/node-protocol.md section 8). Nil refuses lease_renew and revokes nothing.
	Leases *fencing.Authority
	// CoreVersion is the version agents are judged against by the skew
	// rule (docs/upgrades.md section 2); empty means internal/version.Version.
	CoreVersion string
	// Metrics, when not nil, is where the server registers its families (messages by type,
	// heartbeats, open sessions, ended sessions by reason); nil counts nothing.
	Metrics prometheus.Registerer
	// DNS, when not nil, writes the TXT records of the nodes' dns_challenge (dns.go,
	// docs/node-protocol.md section 6.8); nil refuses every challenge dns_zone_not_served.
	DNS DNSChallenger
	// Logs, when not nil, stores the log segments nodes ship (logship.go, docs/node-protocol.md
	// section 5.24); nil refuses log_segment unimplemented.
	Logs LogIndex
}

// Server accepts node sessions; one per node, the newest wins.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	sessions map[string]*conn // node id -> current session; mu must be held
	closed   bool
	wg       sync.WaitGroup

	// keys are the current signing key and the retired ones ([Server.RotateSigningKey]).
	keys    keyRing
	metrics *metrics
	// status writes what sessions change in their nodes' documents (status.go).
	status *statusWriter
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(string) {}
	}
	if cfg.OnNodeChange == nil {
		cfg.OnNodeChange = func(string, string) {}
	}
	if cfg.LogFollowDelay == 0 {
		cfg.LogFollowDelay = DefaultLogFollowDelay
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = node.DefaultHeartbeatInterval
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = node.DefaultSessionTimeout
	}
	if cfg.CoreVersion == "" {
		cfg.CoreVersion = version.Version
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "session"), sessions: map[string]*conn{}}
	s.metrics = newMetrics(cfg.Metrics, s)
	s.keys.current = cfg.SigningKey
	s.keys.retired = map[string]ed25519.PrivateKey{}
	for id, k := range cfg.RetiredKeys {
		s.keys.retired[id] = k
	}
	s.status = newStatusWriter(cfg.Nodes, s.log, cfg.Metrics, s.statusWritten)
	return s
}

// statusWritten wakes the reconciler once a session's start, end or applied revision is in the
// node's document, so that what it reads already shows the change.
func (s *Server) statusWritten(nodeID string, connected, disconnected, applied bool) {
	why := "status_report"
	switch {
	case connected:
		why = "node.connected"
	case disconnected:
		why = "node.disconnected"
	case !applied:
		return
	}
	s.cfg.OnChange(why)
	s.cfg.OnNodeChange(why, nodeID)
}

// conn is one live session.
type conn struct {
	id     string
	nodeID string
	ws     *websocket.Conn
	ctx    context.Context // the session's lifetime; done when it ends
	cancel context.CancelFunc
	// helloHeld maps the lease ids hello listed as held or uncertain, rightly, to their tokens
	// (leases.go).
	helloHeld sync.Map
	// lastFrame is when the core last read a frame of this session, as UnixNano (0: none).
	lastFrame atomic.Int64
	// sentRev is the newest desired revision sent on this session.
	mu      sync.Mutex
	sentRev int64
	// handshook reports whether the session's own desired_state (after
	// welcome) was sent; until then a Push sends nothing, so that welcome
	// stays the core's first message (section 4.2). mu must be held.
	handshook bool
	// signKey is the key this session's node pins, set at the handshake and
	// replaced by a rotation. mu must be held.
	signKey ed25519.PrivateKey
	// welcomed reports whether the handshake reached welcome, so that only
	// a session that connected the node can disconnect it.
	welcomed atomic.Bool
	// removed is set when the node was removed while this session lived; its
	// end then records no node.disconnected.
	removed atomic.Bool
	// started reports whether the session's start was handed to the status writer, so that
	// its end is too. Only the session's handler touches it.
	started bool
	// upload is the log segment being received (logship.go); only the handler touches it.
	upload *segmentUpload
	// follow is the change-log follower, set after desired_state.
	follow atomic.Pointer[follow]
	// waits pairs command_result and stream messages with their requests.
	waits waiters
	// dnsSlots bounds this session's dns_challenge writes in flight (dns.go).
	dnsSlots chan struct{}
	// seenAt and seenApplied are what this session last wrote to the node's
	// document; only the session's read loop touches them.
	seenAt      time.Time
	seenApplied int64
	// reportedIDs are the workload ids of the last status_report, and
	// markedUnknown those this session already marked unknown (until
	// reported again). Only the read loop touches them.
	reportedIDs   []string
	markedUnknown map[string]bool
	// sentIDs are the workload ids of the last desired_state sent; mu guards it.
	sentIDs []string
}

// seenWriteInterval bounds how often a session writes last_seen_at while
// nothing else changes: liveness is decided from the session in memory, so
// the stored time is for operators and may lag by this much.
const seenWriteInterval = 30 * time.Second

// seen records a frame from the node in its document (through the status writer) when its
// applied revision changed or the recorded last_seen_at is older than seenWriteInterval. It
// runs on the session's read loop only and never waits for the store.
func (s *Server) seen(c *conn, applied *int64) {
	now := time.Now()
	if (applied == nil || *applied == c.seenApplied) && now.Sub(c.seenAt) < seenWriteInterval {
		return
	}
	s.status.seen(c.nodeID, applied)
	c.seenAt = now
	if applied != nil {
		c.seenApplied = *applied
	}
}

// ServeHTTP handles GET /api/v1/nodes/session: it authenticates the node
// credential from the Authorization header and runs the session until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cred, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		writeUnauthenticated(w)
		return
	}
	// Credential, not Authenticate: a removed node is let in only to be told
	// so (fatal node_removed, section 10), so it stops dialling. Bounded, so a
	// stalled store is answered before the node's dial gives up.
	lctx, lcancel := context.WithTimeout(r.Context(), credentialLookupTimeout)
	n, err := s.cfg.Nodes.Credential(lctx, cred)
	lcancel()
	if errors.Is(err, nodes.ErrUnauthenticated) {
		writeUnauthenticated(w)
		return
	}
	if err != nil {
		// Not the node's fault: a 401 would tell a whole fleet its credentials
		// are bad whenever the store stalls (section 3.1).
		s.log.Warn("node credential lookup failed", "err", err)
		writeUnavailable(w)
		return
	}
	if carrier, ok := clusters.CarrierFrom(r.Context()); ok && carrier.Cluster != n.ClusterName() {
		// A node of one cluster carried by another cluster's relay (docs/relay.md section 11).
		s.log.Warn("node session refused: carried by another cluster's relay", "node_id", n.ID, "cluster", n.ClusterName(), "relay_cluster", carrier.Cluster, "relay", carrier.RelayID)
		writeProblem(w, http.StatusForbidden, abierrors.RelayClusterMismatch, "this node belongs to another cluster than the relay that carried it")
		return
	}
	// A removed node is let through, to be told it was removed (it stops dialling).
	if _, carried := clusters.CarrierFrom(r.Context()); !carried && s.cfg.RelayRequired != nil && n.ClusterName() != clusters.Default &&
		n.Status != nodes.StatusRemoved {
		rctx, rcancel := context.WithTimeout(r.Context(), credentialLookupTimeout)
		required, err := s.cfg.RelayRequired(rctx, n.ClusterName())
		rcancel()
		if err != nil {
			s.log.Warn("node cluster lookup failed", "node_id", n.ID, "cluster", n.ClusterName(), "err", err)
			writeUnavailable(w)
			return
		}
		if required {
			s.log.Warn("node session refused: its cluster is reached only through its relay", "node_id", n.ID, "cluster", n.ClusterName())
			writeProblem(w, http.StatusForbidden, abierrors.RelayRequired,
				"this node belongs to cluster "+n.ClusterName()+", which requires a relay: point the agent's server at the cluster's relay")
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		s.log.Info("session upgrade failed", "node_id", n.ID, "err", err)
		return
	}
	ws.SetReadLimit(drainLimit)
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{id: identity.NewID("ses_"), nodeID: n.ID, ws: ws, ctx: ctx, cancel: cancel, markedUnknown: map[string]bool{}, dnsSlots: make(chan struct{}, maxDNSChallenges),
		waits: waiters{results: map[string]chan node.CommandResult{}, streams: map[string]*Stream{}}}
	if n.Status == nodes.StatusRemoved {
		defer cancel()
		s.refuseRemoved(ctx, c)
		return
	}
	if !s.register(c) {
		cancel()
		ws.Close(websocket.StatusGoingAway, "core shutting down")
		return
	}
	defer s.wg.Done()
	reason := s.run(ctx, c)
	cancel()
	s.endAllStreams(c)
	current := s.unregister(c)
	// The event must outlive the request: use a fresh bounded ctx.
	uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ucancel()
	s.log.Info("node disconnected", "node_id", c.nodeID, "session", c.id, "reason", reason)
	// A session replaced by a newer one is not a disconnection of the node.
	switch {
	case !current:
		s.metrics.sessionEnded("replaced")
	case c.removed.Load():
		s.metrics.sessionEnded("removed")
	}
	if current && c.welcomed.Load() && !c.removed.Load() {
		why := "session_closed"
		if reason == "heartbeat_timeout" {
			why = "heartbeat_timeout"
		}
		s.metrics.sessionEnded(why)
		s.emit(uctx, events.Core(events.TypeNodeDisconnected, c.nodeID, map[string]any{"reason": why, "detail": reason}, time.Now()))
	}
	if c.started {
		// After the event, so that whoever the writer wakes finds it.
		s.status.ended(c.nodeID, c.id)
	} else {
		// Nothing was recorded for this session; the status writer wakes the reconciler
		// once the end of one that was is in the node's document.
		s.cfg.OnChange("node.disconnected")
		s.cfg.OnNodeChange("node.disconnected", c.nodeID)
	}
}

// refuseRemoved answers a removed node's hello with fatal node_removed and
// closes the session; nothing about the node is changed.
func (s *Server) refuseRemoved(ctx context.Context, c *conn) {
	defer c.ws.CloseNow()
	rctx, cancel := context.WithTimeout(ctx, s.cfg.SessionTimeout)
	defer cancel()
	re := ""
	if env, err := s.read(rctx, c); err == nil {
		re = env.ID
	}
	s.sendError(ctx, c, re, abierrors.NodeRemoved, "this node was removed from the cluster; it must not dial again", true)
	_ = c.ws.Close(websocket.StatusNormalClosure, "node removed")
	s.log.Info("refused a removed node's session", "node_id", c.nodeID)
}

// Remove ends nodeID's live session, if any, with a fatal node_removed
// (docs/node-protocol.md section 10) and waits until the error was written or
// ctx ended. The caller has already marked the node removed, so a redial is
// answered the same way. Safe to call from any goroutine.
func (s *Server) Remove(ctx context.Context, nodeID string) {
	s.mu.Lock()
	c := s.sessions[nodeID]
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.removed.Store(true)
	s.sendError(ctx, c, "", abierrors.NodeRemoved, "this node was removed from the cluster; it must not dial again", true)
	_ = c.ws.Close(websocket.StatusNormalClosure, "node removed")
}

// emit stores an event the core raises; failures are logged, never fatal.
func (s *Server) emit(ctx context.Context, ev node.Event) {
	if s.cfg.Events == nil {
		return
	}
	if _, _, err := s.cfg.Events.Append(ctx, ev); err != nil {
		s.log.Warn("store event", "type", ev.Type, "err", err)
	}
}

// credentialLookupTimeout bounds the store reads that find a dialling node's
// credential: under the default session timeout (the agent's dial bound), so a
// stalled store is answered 503 rather than left to the agent's timeout.
const credentialLookupTimeout = 10 * time.Second

// unavailableRetryAfter is the Retry-After of a session refused because the
// store could not be read, in seconds.
const unavailableRetryAfter = "5"

// writeUnavailable answers a dial whose credential could not be checked: the
// store did not answer. The node keeps its credential and dials again.
func writeUnavailable(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Retry-After", unavailableRetryAfter)
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = fmt.Fprintf(w, `{"title":"Service Unavailable","status":503,"code":%q,"detail":"the node credential could not be checked; dial again later"}`+"\n",
		abierrors.Unavailable)
}

// writeProblem answers a refused upgrade with problem+json.
func writeProblem(w http.ResponseWriter, status int, code abierrors.Code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(status), "status": status, "code": code, "detail": detail})
}

func writeUnauthenticated(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = io.WriteString(w, `{"title":"authentication failed","status":401,"code":"unauthenticated"}`+"\n")
}

func (s *Server) register(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if old, ok := s.sessions[c.nodeID]; ok {
		// A new session closes the older one, so a stale connection never
		// delivers messages beside a fresh one. Not an error message: the
		// old agent, if alive, must keep redialling. Closing (not cancelling)
		// lets the close frame reach the peer before the socket goes.
		go old.ws.Close(websocket.StatusPolicyViolation, "replaced by a newer session")
	}
	s.sessions[c.nodeID] = c
	s.wg.Add(1)
	return true
}

// unregister removes c and reports whether it was the node's current session.
func (s *Server) unregister(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[c.nodeID] == c {
		delete(s.sessions, c.nodeID)
		return true
	}
	return false
}

// Connected reports whether nodeID has a live session on this core.
func (s *Server) Connected(nodeID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[nodeID]
	return ok
}

// LastFrame returns when this core last read a frame of nodeID's live session; ok=false when
// the node has no live session here or sent nothing yet. The stored last_seen_at lags it by up to
// seenWriteInterval, so `berth get nodes` shows this instead when it is newer.
func (s *Server) LastFrame(nodeID string) (time.Time, bool) {
	s.mu.Lock()
	c := s.sessions[nodeID]
	s.mu.Unlock()
	if c == nil {
		return time.Time{}, false
	}
	ns := c.lastFrame.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns).UTC(), true
}

// Push sends the node's stored desired state on its live session, if it has
// one and the revision is newer than what the session was sent. Safe to call
// from any goroutine; errors end the session and are logged.
func (s *Server) Push(ctx context.Context, nodeID string) {
	s.mu.Lock()
	c := s.sessions[nodeID]
	s.mu.Unlock()
	if c == nil {
		return
	}
	if err := s.sendDesired(ctx, c, false); err != nil {
		s.log.Info("push desired state", "node_id", nodeID, "err", err)
		c.cancel()
	}
}

// PushSpec sends rev with spec, the desired state just stored for nodeID, on its live session,
// when it has one that completed its hello and was sent an older revision; it signs and encodes
// once, under this session's own lock only, and reads nothing from the store. Safe to call from
// any goroutine and for many nodes at once; a failed write ends the session and is logged.
// It implements reconciler.SpecPusher.
func (s *Server) PushSpec(ctx context.Context, nodeID string, rev int64, spec node.Spec) {
	s.mu.Lock()
	c := s.sessions[nodeID]
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.handshook || rev <= c.sentRev {
		return
	}
	if err := s.sendSpecLocked(ctx, c, rev, spec); err != nil {
		s.log.Info("push desired state", "node_id", nodeID, "err", err)
		c.cancel()
	}
}

// Close ends every session and waits for their handlers to return.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.sessions {
		go c.ws.Close(websocket.StatusGoingAway, "core shutting down")
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.status.close()
}

// run performs the handshake and the steady-state read loop; it returns why the session ended.
func (s *Server) run(ctx context.Context, c *conn) string {
	defer c.ws.CloseNow()
	// 1. hello is the node's first message.
	env, err := s.read(ctx, c)
	switch {
	case errors.Is(err, errTooLarge):
		// Section 4.2: a first message that is not hello, whatever it is, ends the session
		// with a fatal bad_message, sent before the close. Mid-session the same frames are
		// answered non-fatally (section 3.2).
		return s.refuseFirst(ctx, c, "", fmt.Sprintf("the first message of a session must be hello; got a frame larger than %d bytes", node.MaxMessageBytes))
	case errors.Is(err, errMalformed):
		return s.refuseFirst(ctx, c, "", "the first message of a session must be hello; got a frame that is not a v1 JSON text envelope")
	case err != nil:
		return readReason(err)
	}
	if env.Type != node.TypeHello {
		return s.refuseFirst(ctx, c, env.ID, "the first message of a session must be hello")
	}
	var hello node.Hello
	if err := json.Unmarshal(env.Body, &hello); err != nil || (hello.NodeID != "" && hello.NodeID != c.nodeID) {
		return s.refuseFirst(ctx, c, env.ID, "hello body is malformed or names another node")
	}
	if done := s.refuseSkew(ctx, c, env.ID, &hello); done != "" {
		return done
	}
	// Recorded by the status writer, not here: a session never waits for the store to mark
	// its node connected (the reconciler is woken once the mark is written).
	s.status.started(c.nodeID, started{session: c.id, agentVersion: hello.AgentVersion, drivers: hello.Drivers, networks: sortedKeys(hello.NetworkVersions)})
	c.started = true
	// What the node can give to workloads is written only when it changed since the last report.
	s.reportAllocatable(ctx, c, hello.Allocatable, hello.ResourceLimits)
	applied := hello.AppliedRev
	c.seenApplied = -1 // always written at the handshake
	s.seen(c, &applied)
	s.log.Info("node connected", "node_id", c.nodeID, "session", c.id, "agent_version", hello.AgentVersion, "stored_rev", hello.StoredRev, "applied_rev", hello.AppliedRev)
	// 2. welcome is the core's first message.
	if err := s.write(ctx, c, node.TypeWelcome, env.ID, node.Welcome{
		ClusterID: s.cfg.ClusterID, Term: 1, ServerTime: time.Now().UTC(),
		HeartbeatIntervalMS: s.cfg.HeartbeatInterval.Milliseconds(),
		SessionTimeoutMS:    s.cfg.SessionTimeout.Milliseconds(),
	}); err != nil {
		return "write_failed"
	}
	// 3. stale leases revoked and a pending fence acknowledgement delivered, each awaited
	// (leases.go), signed with the key the node pins; then a key rotation the node missed.
	if done := s.leaseHandshake(ctx, c, &hello, s.handshakeKey(&hello)); done != "" {
		return done
	}
	if err := s.rotateAtHandshake(ctx, c, &hello); err != nil {
		s.log.Info("send signing_key_rotate", "node_id", c.nodeID, "err", err)
		return "write_failed"
	}
	// 4. the desired state, always once per session.
	if err := s.sendDesired(ctx, c, true); err != nil {
		s.log.Info("send desired state", "node_id", c.nodeID, "err", err)
		return "write_failed"
	}
	// 5. the change log, from the node's position (or from 1 when it diverged).
	if err := s.startFollow(ctx, c, &hello, env.ID); err != nil {
		s.log.Error("start change-log follow", "node_id", c.nodeID, "err", err)
		return "store_error"
	}
	c.welcomed.Store(true)
	s.grantHeld(ctx, c)
	data := map[string]any{"agent_version": hello.AgentVersion, "session_id": c.id}
	if hello.DroppedEvents > 0 {
		// Silence while disconnected is not "nothing happened" (section 6.5).
		data["dropped_events"] = hello.DroppedEvents
		s.log.Warn("node dropped buffered events while disconnected", "node_id", c.nodeID, "dropped_events", hello.DroppedEvents)
	}
	s.emit(ctx, events.Core(events.TypeNodeConnected, c.nodeID, data, time.Now()))
	for {
		env, err := s.read(ctx, c)
		if errors.Is(err, errTooLarge) {
			s.sendError(ctx, c, "", abierrors.BadMessage, fmt.Sprintf("message larger than %d bytes ignored", node.MaxMessageBytes), false)
			continue
		}
		if errors.Is(err, errMalformed) {
			s.sendError(ctx, c, "", abierrors.BadMessage, "frame is not a v1 JSON envelope", false)
			continue
		}
		if err != nil {
			return readReason(err)
		}
		if done := s.handle(ctx, c, env); done != "" {
			return done
		}
	}
}

// refuseFirst ends a session whose first frame is not a valid hello: a fatal bad_message (re
// naming the frame's id when it had one), then a close with status 1008, so the error is
// delivered before the socket goes (docs/node-protocol.md section 4.2). It returns the end reason.
func (s *Server) refuseFirst(ctx context.Context, c *conn, re, msg string) string {
	s.sendError(ctx, c, re, abierrors.BadMessage, msg, true)
	s.log.Info("refused a session's first message", "node_id", c.nodeID, "message", msg)
	_ = c.ws.Close(websocket.StatusPolicyViolation, "the first message must be hello")
	return "protocol_violation"
}

func (s *Server) handle(ctx context.Context, c *conn, env *node.Envelope) string {
	s.seen(c, nil)
	s.metrics.message(env.Type)
	switch env.Type {
	case node.TypeHeartbeat:
	case node.TypeEvent:
		var ev node.Event
		if err := json.Unmarshal(env.Body, &ev); err != nil || !strings.HasPrefix(ev.ID, "evt_") || ev.Type == "" {
			s.sendError(ctx, c, env.ID, abierrors.BadMessage, "event body is malformed or lacks an evt_ id and a type", false)
			return ""
		}
		// An event names what it is about; a node speaks only for itself, and only about its
		// own workloads (section 5.4).
		if why := s.foreignSubject(ctx, c, ev.Subject); why != "" {
			s.sendError(ctx, c, env.ID, abierrors.BadMessage, why, false)
			return ""
		}
		ev.Source = node.EventSource{Kind: "node", NodeID: c.nodeID}
		if ev.Actor.Type == "" {
			ev.Actor = node.EventRef{Type: "node", ID: c.nodeID}
		}
		s.emit(ctx, ev)
		s.onLeaseEvent(ctx, c, &ev)
	case node.TypeLeaseRenew:
		s.onLeaseRenew(ctx, c, env)
	case node.TypeDNSChallenge:
		s.onDNSChallenge(ctx, c, env)
	case node.TypeStatusReport:
		var rep node.StatusReport
		if err := json.Unmarshal(env.Body, &rep); err != nil {
			s.sendError(ctx, c, env.ID, abierrors.BadMessage, "status_report body is malformed", false)
			return ""
		}
		s.observe(ctx, c, &rep)
		s.reportAllocatable(ctx, c, rep.Allocatable, rep.ResourceLimits)
	case node.TypeCommandResult:
		var res node.CommandResult
		if err := json.Unmarshal(env.Body, &res); err != nil {
			s.sendError(ctx, c, env.ID, abierrors.BadMessage, "command_result body is malformed", false)
			return ""
		}
		if !s.onCommandResult(c, env, res) && res.Status != "ok" {
			s.log.Warn("node answered with an error", "node_id", c.nodeID, "re", env.Re, "detail", res.Detail)
		}
	case node.TypeStreamData:
		s.onStreamData(ctx, c, env)
	case node.TypeStreamEnd:
		s.onStreamEnd(ctx, c, env)
	case node.TypeLogAck:
		s.onLogAck(ctx, c, env)
	case node.TypeLogSegment:
		s.onLogSegment(ctx, c, env)
	case node.TypePing:
		_ = s.write(ctx, c, node.TypePong, env.ID, struct{}{})
	case node.TypePong:
	case node.TypeError:
		var e node.ErrorBody
		_ = json.Unmarshal(env.Body, &e)
		s.log.Warn("node reported an error", "node_id", c.nodeID, "re", env.Re, "code", e.Code, "message", e.Message, "fatal", e.Fatal)
		if e.Fatal {
			return "node_fatal_error"
		}
	case node.TypeHello:
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, "hello is only valid as the first message", false)
	default:
		s.sendError(ctx, c, env.ID, abierrors.BadMessage, fmt.Sprintf("unknown message type %q", env.Type), false)
	}
	return ""
}

// foreignSubject decides whether the session's node may send an event about subject
// (docs/node-protocol.md section 5.4): the subject needs a type and an id, a node subject is the
// session's own node, and a workload subject is checked by [Server.foreignWorkload]. It returns
// "" when the event may be stored, and otherwise why it is refused.
func (s *Server) foreignSubject(ctx context.Context, c *conn, subject node.EventRef) string {
	switch {
	case subject.Type == "workload":
		return s.foreignWorkload(ctx, c, subject.ID)
	case subject.Type == "" || subject.ID == "":
		return "event subject needs a type and an id"
	case subject.Type == "node" && subject.ID != c.nodeID:
		return fmt.Sprintf("event subject %s is another node; a node speaks only for itself", subject.ID)
	}
	return ""
}

// foreignWorkload decides whether the session's node may send an event about workload id
// (docs/node-protocol.md section 5.4): it may when id is in the desired_state this session last
// sent (checked in memory) or when the workload's record is still placed on the node (one read
// by _id), which covers a workload the node is still stopping or removing after the core took it
// out of the desired state and an event buffered while the node was away. It returns "" when the
// event may be stored, and otherwise why it is refused; a failed read refuses too, so that
// nothing unchecked is stored.
func (s *Server) foreignWorkload(ctx context.Context, c *conn, id string) string {
	if id == "" {
		return "event subject is a workload without an id"
	}
	c.mu.Lock()
	sent := slices.Contains(c.sentIDs, id)
	c.mu.Unlock()
	if sent {
		return ""
	}
	w, err := s.cfg.Catalog.GetWorkload(ctx, id)
	switch {
	case err == nil && w.NodeID == c.nodeID:
		return ""
	case err == nil || errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("event subject %s is not a workload of this node's desired state", id)
	default:
		s.log.Error("check an event's workload", "node_id", c.nodeID, "workload_id", id, "err", err)
		return fmt.Sprintf("event subject %s could not be checked against this node's desired state; resend it later", id)
	}
}

// failureOf converts a reported failure (nil: none) into the core's record of it. A kind
// outside the five of docs/node-protocol.md section 5.3.1 is kept as reported: it is shown,
// never decided on.
func failureOf(f *node.Failure) *services.Failure {
	if f == nil || f.Kind == "" {
		return nil
	}
	return &services.Failure{Kind: clip(string(f.Kind), 32), ExitCode: f.ExitCode, Signal: f.Signal, ProbeURL: clip(f.ProbeURL, 512),
		ProbeStatus: f.ProbeStatus, Message: clip(f.Message, 1024), At: f.At, Count: f.Count}
}

// clip bounds a string a node reports to n bytes, cut at a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// reportAllocatable records what the node's hello or status report said it can give to
// workloads and how it enforces limits (nil: an older agent that says nothing, left as stored).
// A write happens only when either changed; a failure is logged and the session goes on.
func (s *Server) reportAllocatable(ctx context.Context, c *conn, a *node.Allocatable, limits string) {
	if a == nil {
		return
	}
	if err := s.cfg.Nodes.ReportAllocatable(ctx, c.nodeID, nodes.ResourcesFromWire(*a), limits); err != nil {
		s.log.Warn("record the node's allocatable resources", "node_id", c.nodeID, "err", err)
	}
}

// jobOutcomeOf is the core's record of a node's job run report (nil: none).
func jobOutcomeOf(j *node.JobOutcome) *services.JobOutcome {
	if j == nil {
		return nil
	}
	return &services.JobOutcome{Result: j.Result, Attempts: j.Attempts, ExitCode: j.ExitCode, Signal: j.Signal,
		StartedAt: j.StartedAt, EndedAt: j.EndedAt, OutputTail: j.OutputTail}
}

func (s *Server) observe(ctx context.Context, c *conn, rep *node.StatusReport) {
	obs := make([]services.Observation, 0, len(rep.Workloads))
	for _, w := range rep.Workloads {
		obs = append(obs, services.Observation{
			WorkloadID: w.WorkloadID, ObservedStatus: w.ObservedStatus, Health: w.Health,
			Address: w.Address, RestartCount: w.RestartCount, Message: w.Message, LastFailure: failureOf(w.LastFailure),
			Job: jobOutcomeOf(w.Job),
		})
	}
	changed, err := s.cfg.Catalog.Observe(ctx, c.nodeID, obs)
	if err != nil {
		s.log.Error("record status report", "node_id", c.nodeID, "err", err)
	}
	reported := make([]string, 0, len(rep.Workloads))
	for _, w := range rep.Workloads {
		reported = append(reported, w.WorkloadID)
	}
	// The candidates are what this session sent the node or heard it report:
	// a workload the node never received nor reported is still "creating",
	// which stays as it is. Reads and writes are by _id only.
	c.mu.Lock()
	sent := c.sentIDs
	c.mu.Unlock()
	now := make(map[string]bool, len(reported))
	for _, id := range reported {
		now[id] = true
	}
	var missing []string
	for _, set := range [][]string{sent, c.reportedIDs} {
		for _, id := range set {
			if !now[id] && !c.markedUnknown[id] && !slices.Contains(missing, id) {
				missing = append(missing, id)
			}
		}
	}
	if len(missing) > 0 {
		if gone, err := s.cfg.Catalog.MarkUnreportedIDs(ctx, c.nodeID, missing); err != nil {
			s.log.Error("mark unreported workloads", "node_id", c.nodeID, "err", err)
		} else {
			changed = changed || gone
			for _, id := range missing {
				c.markedUnknown[id] = true
			}
		}
	}
	for _, id := range reported {
		delete(c.markedUnknown, id)
	}
	c.reportedIDs = reported
	applied := rep.AppliedRev
	// A newer applied revision may acknowledge slot steps (docs/reconciliation.md section 3):
	// the status writer wakes the reconciler once it is in the node's document.
	s.seen(c, &applied)
	if changed {
		s.cfg.OnChange("status_report")
		s.cfg.OnNodeChange("status_report", c.nodeID)
	}
}

// sendDesired signs and sends the node's stored desired state; always when
// force, otherwise only when newer than what this session was sent.
func (s *Server) sendDesired(ctx context.Context, c *conn, force bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !force && !c.handshook {
		return nil
	}
	n, err := s.cfg.Nodes.Get(ctx, c.nodeID)
	if err != nil {
		return err
	}
	if !force && n.DesiredRev <= c.sentRev {
		return nil
	}
	var spec node.Spec
	if n.DesiredSpec != "" {
		if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
			return fmt.Errorf("decode stored desired state of %s: %w", n.ID, err)
		}
	}
	return s.sendSpecLocked(ctx, c, n.DesiredRev, spec)
}

// sendSpecLocked signs and sends rev with spec to c and records what was sent. c.mu must be
// held.
func (s *Server) sendSpecLocked(ctx context.Context, c *conn, rev int64, spec node.Spec) error {
	ds := node.DesiredState{Rev: rev, IssuedAt: time.Now().UTC(), Term: 1, Spec: spec}
	if ds.Spec.Workloads == nil {
		ds.Spec.Workloads = []node.WorkloadSpec{}
	}
	if ds.Spec.Routes == nil {
		ds.Spec.Routes = []node.RouteSpec{}
	}
	if c.signKey == nil {
		c.signKey = s.keys.get()
	}
	if err := node.Sign(&ds, c.signKey); err != nil {
		return err
	}
	if err := s.write(ctx, c, node.TypeDesiredState, "", ds); err != nil {
		return err
	}
	c.sentRev = rev
	c.handshook = true
	c.sentIDs = make([]string, 0, len(ds.Spec.Workloads))
	for _, w := range ds.Spec.Workloads {
		c.sentIDs = append(c.sentIDs, w.WorkloadID)
	}
	s.log.Debug("desired state sent", "node_id", c.nodeID, "rev", rev, "workloads", len(ds.Spec.Workloads))
	return nil
}

var (
	errTooLarge  = errors.New("message too large")
	errMalformed = errors.New("malformed envelope")
	errVersion   = errors.New("unsupported version")
)

// read returns the next envelope. A frame over the size limit is drained and
// reported as errTooLarge; a frame that is not JSON as errMalformed. A frame
// must arrive within the session timeout.
func (s *Server) read(ctx context.Context, c *conn) (*node.Envelope, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.SessionTimeout)
	defer cancel()
	typ, r, err := c.ws.Reader(rctx)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			return nil, errTimeout
		}
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(r, node.MaxMessageBytes+1))
	if err != nil {
		return nil, err
	}
	c.lastFrame.Store(time.Now().UnixNano())
	if len(raw) > node.MaxMessageBytes {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return nil, err
		}
		return nil, errTooLarge
	}
	if typ != websocket.MessageText {
		return nil, errMalformed
	}
	var env node.Envelope
	if err := json.Unmarshal(raw, &env); err != nil || env.Type == "" {
		return nil, errMalformed
	}
	if env.V != node.Version {
		s.sendError(ctx, c, env.ID, abierrors.UnsupportedVersion, fmt.Sprintf("envelope version %d is not supported; this core speaks %d", env.V, node.Version), true)
		return nil, errVersion
	}
	return &env, nil
}

var errTimeout = errors.New("heartbeat timeout")

func readReason(err error) string {
	switch {
	case errors.Is(err, errTimeout):
		return "heartbeat_timeout"
	case errors.Is(err, errVersion):
		return "unsupported_version"
	default:
		return "session_closed"
	}
}

func (s *Server) write(ctx context.Context, c *conn, typ node.Type, re string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", typ, err)
	}
	frame, err := json.Marshal(node.Envelope{V: node.Version, Type: typ, ID: identity.NewID("msg_"), Re: re, Body: raw})
	if err != nil {
		return fmt.Errorf("marshal envelope: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The write runs under the session's own context: the WebSocket library closes the whole
	// connection when a write's context ends mid-write, and a caller that gave up (an API client
	// that left) must not end the node's session.
	wctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if err := c.ws.Write(wctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("write %s to %s: %w", typ, c.nodeID, err)
	}
	return nil
}

func (s *Server) sendError(ctx context.Context, c *conn, re string, code abierrors.Code, msg string, fatal bool) {
	if err := s.write(ctx, c, node.TypeError, re, node.ErrorBody{Code: string(code), Message: msg, Fatal: fatal}); err != nil {
		s.log.Debug("send error", "node_id", c.nodeID, "err", err)
	}
}
