// Package session is the node agent's side of the node session: it dials berthd
// over WebSocket, speaks the v1 message set, and persists verified desired state (docs/node-protocol.md sections 3-5).
package session

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/oklog/ulid/v2"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/sdk/client"
)

// Path is the session endpoint on the API listener (section 3.1).
const Path = "/api/v1/nodes/session"

// Redial defaults (section 4.4).
const (
	DefaultBackoffMin   = time.Second
	DefaultBackoffMax   = 60 * time.Second
	DefaultBackoffReset = 60 * time.Second
	// DefaultPinMismatchLimit is how many consecutive dials may meet a
	// certificate other than the pinned one before [Client.Run] gives up
	// (docs/node-protocol.md section 2.2).
	DefaultPinMismatchLimit = 3
)

// drainLimit is how much of an oversize frame is read and discarded before the
// connection is given up; up to it an oversize frame is answered and ignored.
const drainLimit = 16 << 20

// SnapshotStore persists verified desired state. *localstore.Store satisfies it.
type SnapshotStore interface {
	// StoreSnapshot durably stores raw under rev when rev is newer than every
	// stored snapshot and reports whether it did.
	StoreSnapshot(ctx context.Context, rev int64, raw []byte, now time.Time) (bool, error)
	// StoredRev returns the newest stored rev, 0 when none.
	StoredRev(ctx context.Context) (int64, error)
}

// EventBuffer is the node's durable event buffer (docs/node-protocol.md
// section 6.5). *localstore.Store satisfies it.
type EventBuffer interface {
	// PendingEvents returns up to limit buffered events, oldest first.
	PendingEvents(ctx context.Context, limit int) ([]localstore.BufferedEvent, error)
	// DeleteEvent removes an event once it was written to the session.
	DeleteEvent(ctx context.Context, pos int64) error
	// ReportedDroppedEvents subtracts the dropped count a welcomed hello carried.
	ReportedDroppedEvents(ctx context.Context, n int64) error
}

// LogStore is the node's copy of the change log (docs/node-protocol.md
// section 7.4). *localstore.Store satisfies it.
type LogStore interface {
	// LogHead returns the newest stored entry's seq and hash (0, "" when empty).
	LogHead(ctx context.Context) (int64, string, error)
	// AppendLog stores verified entries that follow the head.
	AppendLog(ctx context.Context, entries []node.LogEntry) error
	// QuarantineLog moves the copy aside (never deleting it) and starts an
	// empty one; it returns the name of the copy kept.
	QuarantineLog(ctx context.Context, now time.Time) (string, error)
}

// Config configures a Client. ServerURL, Credential, ClusterKey, Store, Hello
// and Status are required.
type Config struct {
	ServerURL  string            // berthd base URL, http(s)://host[:port]; ws(s):// is accepted too
	Credential string            // node credential, sent as a bearer; a secret, never logged
	ClusterKey ed25519.PublicKey // pinned key that signs desired state
	Store      SnapshotStore
	// Hello returns the body of the hello sent first on every session.
	Hello func(ctx context.Context) (node.Hello, error)
	// Status returns the current status report, sent on change and periodically.
	Status func(ctx context.Context) (node.StatusReport, error)
	// Events, when not nil, is flushed after every welcome and whenever
	// [Client.EventsPending] is called: each event is sent and then deleted.
	// An event written to a socket that then fails may be lost only if the
	// core never read it; one sent twice is stored once (the core dedups by id).
	Events EventBuffer
	// Log, when not nil, follows the core's change log: each log_entries
	// batch is verified in order against the stored head, stored and
	// acknowledged; log_diverged moves the copy aside. Nil ignores log_entries.
	Log LogStore
	// Commands serves command and stream_open; nil answers them with
	// unimplemented.
	Commands Commands
	// Keys persists a rotated signing key; nil refuses signing_key_rotate.
	Keys KeyStore
	// OnStored is called after a newer snapshot was persisted and acknowledged; nil means none.
	OnStored func(rev int64)
	// OnWelcome is called after each session's welcome, on the read loop (it
	// must not block); nil means none. An upgraded agent confirms its new
	// version here (docs/upgrades.md section 3.3).
	OnWelcome func()
	// HTTPClient dials the WebSocket; nil means http.DefaultClient. Its Timeout must be zero.
	HTTPClient *http.Client
	Logger     *slog.Logger     // nil means slog.Default()
	Now        func() time.Time // nil means time.Now
	// RandInt63n returns a uniform value in [0, n) for backoff jitter; nil means math/rand/v2.
	RandInt63n func(n int64) int64
	// HeartbeatInterval is used until a welcome carries one; zero means node.DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// SessionTimeout bounds the wait for welcome and every write, until a welcome carries one;
	// zero means node.DefaultSessionTimeout.
	SessionTimeout time.Duration
	// StatusInterval is the longest gap between status reports; zero means node.StatusReportInterval.
	StatusInterval time.Duration
	// BackoffMin and BackoffMax bound the redial backoff (full jitter, doubling);
	// zero means 1 s and 60 s. BackoffReset is how long a session must have
	// lasted to reset it; zero means 60 s.
	BackoffMin, BackoffMax, BackoffReset time.Duration
	// PinMismatchLimit is how many consecutive dials may fail the certificate
	// pin (client.ErrFingerprintMismatch) before Run returns; zero means
	// DefaultPinMismatchLimit. Any other outcome of a dial resets the count.
	PinMismatchLimit int
	// AgentVersion is sent in the hello when the Hello func leaves it empty.
	AgentVersion string
	// Leases handles lease_grant and lease_revoke and supplies lease_renew
	// (docs/node-protocol.md sections 5.5, 5.12, 5.13 and 8); nil refuses
	// lease messages with unimplemented and renews nothing.
	Leases Leases
}

// Leases is the node's lease manager as the session drives it.
// *lease.Manager satisfies it.
type Leases interface {
	// Grant applies a verified lease_grant whose envelope's re is re and
	// returns the refusal to send as a non-fatal error, or nil.
	Grant(ctx context.Context, re string, g *node.LeaseGrant) *node.ErrorBody
	// Revoke applies a verified lease_revoke, fences, and returns the
	// command_result to answer, or the refusal to send as a non-fatal
	// error. It blocks until the fence ended.
	Revoke(ctx context.Context, r *node.LeaseRevoke) (node.CommandResult, *node.ErrorBody)
	// RenewDue is signalled when renewals may be due.
	RenewDue() <-chan struct{}
	// DueRenewals returns the renewals to send now.
	DueRenewals() []node.LeaseRenew
	// RenewSent records a renewal about to be written under envelope id msgID.
	RenewSent(msgID string, r node.LeaseRenew)
}

// FatalError is returned by [Client.Run] after the core ended the session with
// a fatal error other than unsupported_version: the node stops redialling until
// an operator acts (section 4.4).
type FatalError struct {
	Code    string
	Message string
}

// Error implements error.
func (e *FatalError) Error() string {
	return fmt.Sprintf("berth: core ended the node session with fatal error %s: %s", e.Code, e.Message)
}

// Client keeps one node session up, redialling as section 4.4 says.
type Client struct {
	cfg    Config
	key    atomic.Pointer[ed25519.PublicKey] // the pinned signing key; replaced by signing_key_rotate
	log    *slog.Logger
	report chan struct{}
	events chan struct{}
	// current is the welcomed session, nil between sessions (request.go).
	current atomic.Pointer[conn]
}

// New validates cfg, fills its defaults and returns a Client.
func New(cfg Config) (*Client, error) {
	if cfg.ServerURL == "" || cfg.Credential == "" || len(cfg.ClusterKey) != ed25519.PublicKeySize ||
		cfg.Store == nil || cfg.Hello == nil || cfg.Status == nil {
		return nil, errors.New("session: ServerURL, Credential, ClusterKey, Store, Hello and Status are required")
	}
	if _, err := sessionURL(cfg.ServerURL); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RandInt63n == nil {
		cfg.RandInt63n = rand.Int64N
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = node.DefaultHeartbeatInterval
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = node.DefaultSessionTimeout
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = node.StatusReportInterval
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.BackoffReset <= 0 {
		cfg.BackoffReset = DefaultBackoffReset
	}
	if cfg.PinMismatchLimit <= 0 {
		cfg.PinMismatchLimit = DefaultPinMismatchLimit
	}
	cl := &Client{cfg: cfg, log: cfg.Logger, report: make(chan struct{}, 1), events: make(chan struct{}, 1)}
	key := cfg.ClusterKey
	cl.key.Store(&key)
	return cl, nil
}

// clusterKey returns the currently pinned signing key.
func (c *Client) clusterKey() ed25519.PublicKey { return *c.key.Load() }

// EventsPending asks for the event buffer to be flushed on the current
// session soon. It never blocks; without a session it does nothing.
func (c *Client) EventsPending() {
	select {
	case c.events <- struct{}{}:
	default:
	}
}

// ReportStatus asks for a status report on the current session soon. It never blocks.
func (c *Client) ReportStatus() {
	select {
	case c.report <- struct{}{}:
	default:
	}
}

func sessionURL(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", fmt.Errorf("session: parse server URL: %w", err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("session: server URL %q: scheme must be http, https, ws or wss", server)
	}
	if u.Host == "" {
		return "", fmt.Errorf("session: server URL %q has no host", server)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + Path
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return u.String(), nil
}

// Run keeps a session up until ctx ends (it returns ctx.Err()), the core
// sends a fatal error other than unsupported_version (it returns a
// *[FatalError]), or PinMismatchLimit consecutive dials met a certificate
// other than the pinned one (it returns an error wrapping
// client.ErrFingerprintMismatch: the pin never changes by itself, so waiting
// does not help; docs/node-protocol.md section 2.2). Between sessions it
// waits a full-jitter backoff from BackoffMin doubling to BackoffMax, reset
// after a session that lasted BackoffReset.
func (c *Client) Run(ctx context.Context) error {
	attempt, mismatches := 0, 0
	for {
		started := c.cfg.Now()
		err := c.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, client.ErrFingerprintMismatch) {
			mismatches++
			if mismatches >= c.cfg.PinMismatchLimit {
				return fmt.Errorf("session: %d dials in a row met a certificate other than the pinned one: %w", mismatches, err)
			}
		} else {
			mismatches = 0
		}
		var fatal *FatalError
		if errors.As(err, &fatal) {
			if fatal.Code != string(berrors.UnsupportedVersion) {
				c.log.Error("core ended the session with a fatal error; not redialling until an operator acts",
					"code", fatal.Code, "message", fatal.Message)
				return err
			}
			c.log.Error("core does not speak this agent's protocol version; redialling", "message", fatal.Message)
		} else if err != nil {
			c.log.Warn("node session ended", "error", err)
		}
		if c.cfg.Now().Sub(started) >= c.cfg.BackoffReset {
			attempt = 0
		}
		wait := c.backoff(attempt)
		attempt++
		c.log.Info("redialling node session", "in", wait.String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// backoff is the full-jitter wait before redial attempt n (0-based).
func (c *Client) backoff(n int) time.Duration {
	ceil := c.cfg.BackoffMin
	for i := 0; i < n && ceil < c.cfg.BackoffMax; i++ {
		ceil *= 2
	}
	ceil = min(ceil, c.cfg.BackoffMax)
	return time.Duration(c.cfg.RandInt63n(int64(ceil) + 1))
}

// conn is one live session.
type conn struct {
	c       *Client
	ws      *websocket.Conn
	timeout atomic.Int64 // write and welcome bound, nanoseconds
	timers  chan timers
	dropped int64 // dropped_events the hello carried
	streams streams
	reqs    requests      // node-initiated requests awaiting the core's answer
	done    chan struct{} // closed when the session ends
}

type timers struct {
	heartbeat time.Duration
}

func newID() string { return "msg_" + ulid.Make().String() }

func (s *conn) send(ctx context.Context, typ node.Type, re string, body any) error {
	return s.sendWithID(ctx, typ, newID(), re, body)
}

// sendWithID is send with a message id the caller chose.
func (s *conn) sendWithID(ctx context.Context, typ node.Type, id, re string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", typ, err)
	}
	frame, err := json.Marshal(node.Envelope{V: node.Version, Type: typ, ID: id, Re: re, Body: raw})
	if err != nil {
		return fmt.Errorf("marshal %s envelope: %w", typ, err)
	}
	if len(frame) > node.MaxMessageBytes {
		return fmt.Errorf("send %s: message of %d bytes exceeds the %d byte limit", typ, len(frame), node.MaxMessageBytes)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Duration(s.timeout.Load()))
	defer cancel()
	if err := s.ws.Write(wctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("send %s: %w", typ, err)
	}
	return nil
}

// sendRaw sends an already encoded body.
func (s *conn) sendRaw(ctx context.Context, typ node.Type, body []byte) error {
	frame, err := json.Marshal(node.Envelope{V: node.Version, Type: typ, ID: newID(), Body: body})
	if err != nil {
		return fmt.Errorf("marshal %s envelope: %w", typ, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Duration(s.timeout.Load()))
	defer cancel()
	if err := s.ws.Write(wctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("send %s: %w", typ, err)
	}
	return nil
}

func (s *conn) sendError(ctx context.Context, re string, code berrors.Code, msg string, fatal bool) error {
	return s.send(ctx, node.TypeError, re, node.ErrorBody{Code: string(code), Message: msg, Fatal: fatal})
}

// session runs one session from dial to close.
func (c *Client) session(ctx context.Context) error {
	u, err := sessionURL(c.cfg.ServerURL)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, c.cfg.SessionTimeout)
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{
		HTTPClient: c.cfg.HTTPClient,
		HTTPHeader: http.Header{"Authorization": []string{"Bearer " + c.cfg.Credential}},
	})
	cancel()
	if err != nil {
		if resp != nil {
			return fmt.Errorf("dial node session: HTTP %d: %w", resp.StatusCode, err)
		}
		return fmt.Errorf("dial node session: %w", err)
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(-1) // frames are bounded by readFrame, so an oversize one is answered, not fatal

	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	s := &conn{c: c, ws: ws, timers: make(chan timers, 1), streams: streams{open: map[string]context.CancelFunc{}}, done: make(chan struct{})}
	defer func() {
		c.current.CompareAndSwap(s, nil)
		close(s.done)
	}()
	s.timeout.Store(int64(c.cfg.SessionTimeout))

	hello, err := c.cfg.Hello(sctx)
	if err != nil {
		return fmt.Errorf("build hello: %w", err)
	}
	if hello.AgentVersion == "" {
		hello.AgentVersion = c.cfg.AgentVersion
	}
	hello.SigningKeyID = node.KeyID(c.clusterKey())
	s.dropped = hello.DroppedEvents
	if err := s.send(sctx, node.TypeHello, "", hello); err != nil {
		return err
	}
	c.log.Info("node session open", "node_id", hello.NodeID, "stored_rev", hello.StoredRev, "applied_rev", hello.AppliedRev)

	welcomed := make(chan struct{})
	noWelcome := time.AfterFunc(c.cfg.SessionTimeout, func() {
		select {
		case <-welcomed:
		default:
			c.log.Warn("no welcome within the session timeout; closing", "timeout", c.cfg.SessionTimeout.String())
			_ = ws.Close(websocket.StatusPolicyViolation, "no welcome")
		}
	})
	defer noWelcome.Stop()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.writeLoop(sctx, welcomed)
	}()
	err = s.readLoop(sctx, welcomed)
	scancel()
	wg.Wait()
	s.streams.wg.Wait()
	return err // the deferred CloseNow ends the connection without waiting for the peer
}

// writeLoop sends heartbeats and status reports until ctx ends. Write errors
// close the connection, which ends readLoop.
func (s *conn) writeLoop(ctx context.Context, welcomed <-chan struct{}) {
	c := s.c
	hb := time.NewTicker(c.cfg.HeartbeatInterval)
	defer hb.Stop()
	st := time.NewTicker(c.cfg.StatusInterval)
	defer st.Stop()
	welcome := welcomed
	fail := func(err error) {
		c.log.Warn("node session write failed", "error", err)
		_ = s.ws.CloseNow()
	}
	var renewDue <-chan struct{}
	if c.cfg.Leases != nil {
		renewDue = c.cfg.Leases.RenewDue()
	}
	sendRenewals := func() bool {
		if c.cfg.Leases == nil {
			return true
		}
		for _, r := range c.cfg.Leases.DueRenewals() {
			id := newID()
			c.cfg.Leases.RenewSent(id, r) // before the write: the answer cannot overtake it
			if err := s.sendWithID(ctx, node.TypeLeaseRenew, id, "", r); err != nil {
				fail(err)
				return false
			}
		}
		return true
	}
	sendStatus := func() bool {
		rep, err := c.cfg.Status(ctx)
		if err != nil {
			c.log.Warn("build status report", "error", err)
			return true
		}
		if err := s.send(ctx, node.TypeStatusReport, "", rep); err != nil {
			fail(err)
			return false
		}
		st.Reset(c.cfg.StatusInterval)
		return true
	}
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-s.timers:
			hb.Reset(t.heartbeat)
		case <-welcome:
			welcome = nil
			if c.cfg.Events != nil {
				if err := c.cfg.Events.ReportedDroppedEvents(ctx, s.dropped); err != nil {
					c.log.Warn("reset dropped event count", "error", err)
				}
			}
			if !sendRenewals() || !sendStatus() {
				return
			}
			if !s.flushEvents(ctx) {
				return
			}
		case <-renewDue:
			if welcome != nil {
				continue // sent after welcome
			}
			if !sendRenewals() {
				return
			}
		case <-c.events:
			if welcome != nil {
				continue // flushed after welcome
			}
			if !s.flushEvents(ctx) {
				return
			}
		case <-hb.C:
			if err := s.send(ctx, node.TypeHeartbeat, "", node.Heartbeat{Time: c.cfg.Now().UTC()}); err != nil {
				fail(err)
				return
			}
		case <-st.C:
			if !sendStatus() {
				return
			}
		case <-c.report:
			if welcome != nil {
				continue // the first report goes out after welcome
			}
			if !sendStatus() {
				return
			}
		}
	}
}

// flushEvents sends every buffered event, oldest first, deleting each once
// written (section 6.5). It reports false when the session failed.
func (s *conn) flushEvents(ctx context.Context) bool {
	c := s.c
	if c.cfg.Events == nil {
		return true
	}
	for {
		batch, err := c.cfg.Events.PendingEvents(ctx, 100)
		if err != nil {
			c.log.Warn("read buffered events", "error", err)
			return true
		}
		if len(batch) == 0 {
			return true
		}
		for _, e := range batch {
			if err := s.sendRaw(ctx, node.TypeEvent, e.Body); err != nil {
				c.log.Warn("node session write failed", "error", err)
				_ = s.ws.CloseNow()
				return false
			}
			if err := c.cfg.Events.DeleteEvent(ctx, e.Pos); err != nil {
				c.log.Warn("delete sent event", "error", err)
				return true
			}
		}
	}
}

// readFrame reads one message, at most node.MaxMessageBytes. An oversize
// frame is drained and reported with errOversize; the connection stays usable.
func (s *conn) readFrame(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, r, err := s.ws.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	data, err := io.ReadAll(io.LimitReader(r, node.MaxMessageBytes+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", err)
	}
	if len(data) > node.MaxMessageBytes {
		n, err := io.Copy(io.Discard, io.LimitReader(r, drainLimit))
		if err != nil {
			return 0, nil, fmt.Errorf("drain oversize frame: %w", err)
		}
		if n == drainLimit {
			_ = s.ws.Close(websocket.StatusMessageTooBig, "frame too large")
			return 0, nil, errors.New("frame larger than the drain limit; closed")
		}
		return typ, nil, errOversize
	}
	return typ, data, nil
}

var errOversize = errors.New("frame exceeds the message size limit")

func (s *conn) readLoop(ctx context.Context, welcomed chan struct{}) error {
	c := s.c
	gotWelcome := false
	for {
		typ, data, err := s.readFrame(ctx)
		if errors.Is(err, errOversize) {
			c.log.Warn("ignored an oversize frame from the core", "limit_bytes", node.MaxMessageBytes)
			if err := s.sendError(ctx, "", berrors.BadMessage, "frame exceeds 1 MiB", false); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read node session: %w", err)
		}
		if typ != websocket.MessageText {
			if err := s.sendError(ctx, "", berrors.BadMessage, "binary frames are not used in v1", false); err != nil {
				return err
			}
			continue
		}
		var env node.Envelope
		if err := json.Unmarshal(data, &env); err != nil {
			if err := s.sendError(ctx, "", berrors.BadMessage, "frame is not a JSON envelope", false); err != nil {
				return err
			}
			continue
		}
		if env.V != node.Version {
			msg := fmt.Sprintf("envelope version %d is not implemented; this agent speaks %d", env.V, node.Version)
			_ = s.sendError(ctx, env.ID, berrors.UnsupportedVersion, msg, true)
			return fmt.Errorf("core sent envelope version %d", env.V)
		}
		// welcome is the core's first message; before it only an error
		// (the core refusing the hello) is taken (section 4.2).
		if !gotWelcome && env.Type != node.TypeWelcome && env.Type != node.TypeError {
			_ = s.sendError(ctx, env.ID, berrors.BadMessage, fmt.Sprintf("the core's first message must be welcome, not %s", env.Type), true)
			return fmt.Errorf("core sent %s before welcome", env.Type)
		}
		switch env.Type {
		case node.TypeWelcome:
			var w node.Welcome
			if err := json.Unmarshal(env.Body, &w); err != nil {
				if err := s.sendError(ctx, env.ID, berrors.BadMessage, "welcome body does not parse", false); err != nil {
					return err
				}
				continue
			}
			if w.SessionTimeoutMS > 0 {
				s.timeout.Store(int64(time.Duration(w.SessionTimeoutMS) * time.Millisecond))
			}
			if w.HeartbeatIntervalMS > 0 {
				select {
				case s.timers <- timers{heartbeat: time.Duration(w.HeartbeatIntervalMS) * time.Millisecond}:
				default:
				}
			}
			if !gotWelcome {
				gotWelcome = true
				close(welcomed)
				c.current.Store(s)
				if c.cfg.OnWelcome != nil {
					c.cfg.OnWelcome()
				}
			}
			c.log.Info("node session welcomed", "cluster_id", w.ClusterID, "term", w.Term,
				"heartbeat_interval_ms", w.HeartbeatIntervalMS)
		case node.TypeDesiredState:
			if err := s.onDesiredState(ctx, env); err != nil {
				return err
			}
		case node.TypeLeaseGrant:
			if err := s.onLeaseGrant(ctx, env); err != nil {
				return err
			}
		case node.TypeLeaseRevoke:
			// Handled to the end, fence included, before the next message
			// is read (section 4.2 rule 3).
			if err := s.onLeaseRevoke(ctx, env); err != nil {
				return err
			}
		case node.TypeCommand:
			if err := s.onCommand(ctx, env); err != nil {
				return err
			}
		case node.TypeStreamOpen:
			if err := s.onStreamOpen(ctx, env); err != nil {
				return err
			}
		case node.TypeStreamClose:
			if err := s.onStreamClose(ctx, env); err != nil {
				return err
			}
		case node.TypeSigningKeyRotate:
			if err := s.onSigningKeyRotate(ctx, env); err != nil {
				return err
			}
		case node.TypeLogEntries:
			if err := s.onLogEntries(ctx, env); err != nil {
				return err
			}
		case node.TypePing:
			if err := s.send(ctx, node.TypePong, env.ID, struct{}{}); err != nil {
				return err
			}
		case node.TypeLogSegmentAck:
			s.reqs.answer(env.Re, env.Body)
		case node.TypePong, node.TypeCommandResult:
			// Answers to nothing this agent asks yet; ignored.
		case node.TypeError:
			var eb node.ErrorBody
			_ = json.Unmarshal(env.Body, &eb)
			if env.Re != "" && !eb.Fatal && s.reqs.refuse(env.Re, eb) {
				continue // a core without log shipping refused a log_segment
			}
			if eb.Fatal {
				return &FatalError{Code: eb.Code, Message: eb.Message}
			}
			if eb.Code == string(berrors.LogDiverged) && c.cfg.Log != nil {
				kept, err := c.cfg.Log.QuarantineLog(ctx, c.cfg.Now())
				if err != nil {
					return fmt.Errorf("move the diverged change log aside: %w", err)
				}
				c.log.Warn("change-log copy diverged from the core's; moved aside, refollowing from seq 1", "kept_as", kept)
				continue
			}
			c.log.Warn("core reported an error", "code", eb.Code, "message", eb.Message, "re", env.Re)
		default:
			if err := s.sendError(ctx, env.ID, berrors.BadMessage, fmt.Sprintf("unknown message type %q", env.Type), false); err != nil {
				return err
			}
		}
	}
}

// onDesiredState verifies, persists and acknowledges one desired_state
// (sections 5.11 and 6.1). It returns an error only when the session must end.
func (s *conn) onDesiredState(ctx context.Context, env node.Envelope) error {
	c := s.c
	ds, err := node.Verify(env.Body, c.clusterKey())
	if err != nil {
		c.log.Warn("refused desired_state with a bad signature; keeping the stored snapshot", "error", err)
		return s.sendError(ctx, env.ID, berrors.BadSignature, "desired_state signature does not verify against the cluster signing key", false)
	}
	stored, err := c.cfg.Store.StoreSnapshot(ctx, ds.Rev, env.Body, c.cfg.Now())
	if err != nil {
		c.log.Error("persist desired_state", "rev", ds.Rev, "error", err)
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{
			Status: "error",
			Detail: fmt.Sprintf("rev %d not stored", ds.Rev),
			Error:  &node.ErrorBody{Code: string(berrors.Internal), Message: "the node could not persist the desired state"},
		})
	}
	if !stored {
		cur, err := c.cfg.Store.StoredRev(ctx)
		if err != nil {
			return fmt.Errorf("read stored rev: %w", err)
		}
		if ds.Rev < cur {
			c.log.Warn("core sent an older desired_state than the stored one; keeping the newer", "rev", ds.Rev, "stored_rev", cur)
		}
		return s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{
			Status: "ok", Detail: fmt.Sprintf("rev %d not newer than stored rev %d; ignored", ds.Rev, cur),
		})
	}
	c.log.Info("stored desired state", "rev", ds.Rev, "workloads", len(ds.Spec.Workloads))
	err = s.send(ctx, node.TypeCommandResult, env.ID, node.CommandResult{
		Status: "ok", Detail: fmt.Sprintf("stored rev %d", ds.Rev),
	})
	if c.cfg.OnStored != nil {
		c.cfg.OnStored(ds.Rev) // stored is stored: reconcile even when the ack could not be sent
	}
	return err
}

// onLogEntries verifies a log_entries batch entry by entry against the stored
// head, stores the entries that verified and acknowledges the newest one
// (section 7.4). A batch that does not chain onto the head is answered with
// a non-fatal bad_message and nothing of it is stored after the first bad
// entry. It returns an error only when the session must end.
func (s *conn) onLogEntries(ctx context.Context, env node.Envelope) error {
	c := s.c
	if c.cfg.Log == nil {
		return nil
	}
	var batch node.LogEntries
	if err := json.Unmarshal(env.Body, &batch); err != nil {
		return s.sendError(ctx, env.ID, berrors.BadMessage, "log_entries body does not parse", false)
	}
	seq, hash, err := c.cfg.Log.LogHead(ctx)
	if err != nil {
		return fmt.Errorf("read change-log head: %w", err)
	}
	n, verr := node.VerifyChain(seq, hash, batch.Entries)
	if n > 0 {
		good := batch.Entries[:n]
		if err := c.cfg.Log.AppendLog(ctx, good); err != nil {
			c.log.Error("store change-log entries", "from_seq", good[0].Seq, "error", err)
			return nil // not acknowledged: the core sends them again on the next session
		}
		last := good[n-1]
		if err := s.send(ctx, node.TypeLogAck, env.ID, node.LogAck{Seq: last.Seq, Hash: last.Hash}); err != nil {
			return err
		}
	}
	if verr != nil {
		c.log.Warn("refused change-log entries that do not verify", "head_seq", seq, "error", verr)
		return s.sendError(ctx, env.ID, berrors.BadMessage, verr.Error(), false)
	}
	return nil
}
