package relay

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirelay "github.com/berthhq/berth/abi/relay"
)

// Config configures the relay side.
type Config struct {
	// CoreURL is the ws:// or wss:// URL of berthd's relay endpoint (required).
	CoreURL string
	// Listener accepts the nodes' connections; the caller wraps it in TLS (required). The relay closes it.
	Listener net.Listener
	// Credential is sent as the bearer of the upgrade request; empty sends none.
	Credential string
	// Build is the relay's version, sent in its registration.
	Build string
	// NodeID is the node the relay runs on as the core knows it; empty names none.
	NodeID string
	// Address is the listen address the registration names (default: the listener's address).
	Address string
	// HTTPClient dials the core (its TLS configuration included); nil uses http.DefaultClient.
	HTTPClient *http.Client
	// Logger receives the relay's logs; nil drops them.
	Logger *slog.Logger
	// Metrics registers the relay's metric families; nil registers none.
	Metrics prometheus.Registerer

	// SessionWait bounds how long a new node connection waits for a core session (default 5 s).
	SessionWait time.Duration
	// WriteTimeout bounds each write to a stream, to a node and on the core session (default 8 s).
	WriteTimeout time.Duration
	// StreamOpenTimeout bounds the core's acknowledgement of a new stream (default 5 s).
	StreamOpenTimeout time.Duration
	// KeepAlive is the yamux ping interval (default 5 s).
	KeepAlive time.Duration
	// DialTimeout bounds one dial of the core, the upgrade included (default 10 s).
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the jittered reconnect backoff (defaults 250 ms and 10 s).
	BackoffMin, BackoffMax time.Duration
	// ReregisterSpacing and ReregisterWindow pace closing the nodes of an older core session once a
	// new one is up (defaults 75 ms and 5 s: the spacing shrinks to fit the window).
	ReregisterSpacing, ReregisterWindow time.Duration
}

func (c *Config) defaults() error {
	if c.CoreURL == "" {
		return errors.New("relay: the core URL is required")
	}
	if c.Listener == nil {
		return errors.New("relay: a node listener is required")
	}
	if c.Address == "" {
		c.Address = c.Listener.Addr().String()
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	if c.Logger == nil {
		c.Logger = discard()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.SessionWait, DefaultSessionWait)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.StreamOpenTimeout, DefaultStreamOpenTimeout)
	def(&c.KeepAlive, DefaultKeepAlive)
	def(&c.DialTimeout, 10*time.Second)
	def(&c.BackoffMin, DefaultBackoffMin)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.ReregisterSpacing, DefaultReregisterSpacing)
	def(&c.ReregisterWindow, DefaultReregisterWindow)
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	return nil
}

// Relay carries node connections to the core over one yamux session on one WebSocket.
type Relay struct {
	cfg Config
	log *slog.Logger
	id  string
	met *relayMetrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	sess    *yamux.Session
	seq     uint64        // sequence of the current (or last) core session; only grows
	regSeq  uint64        // sequence of the last registration offered (one per dial); only grows
	gen     int64         // the credential generation the first accepted registration pinned; 0 before
	cluster string        // the cluster the core accepted the relay for
	parked  string        // why the relay parked, "" while it is not parked
	up      chan struct{} // closed while a session is up; replaced when it goes down
	lastErr string        // why the last dial or session failed
	nodes   map[*node]struct{}
}

// node is one carried node connection.
type node struct {
	conn    net.Conn
	seq     uint64        // the core session it was opened on
	kick    chan struct{} // closed to ask the node to re-register (close its connection)
	kickOne sync.Once
}

func (n *node) close() { n.kickOne.Do(func() { close(n.kick) }) }

func (n *node) kicked() bool {
	select {
	case <-n.kick:
		return true
	default:
		return false
	}
}

// Start starts the relay: the core session loop and the node accept loop. Close stops it.
func Start(cfg Config) (*Relay, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, fmt.Errorf("relay id: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, log: cfg.Logger, id: hex.EncodeToString(idb[:]), ctx: ctx, cancel: cancel,
		up: make(chan struct{}), lastErr: "not yet connected", nodes: map[*node]struct{}{}}
	r.met = newRelayMetrics(cfg.Metrics, r)
	r.wg.Add(2)
	go r.sessionLoop()
	go r.acceptLoop()
	return r, nil
}

// ID is the relay's process-unique id, named in every stream header.
func (r *Relay) ID() string { return r.id }

// Close stops accepting nodes, closes every node connection and the core session, and returns once
// every goroutine of the relay has ended.
func (r *Relay) Close() error {
	r.cancel()
	err := r.cfg.Listener.Close()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Ready reports whether the relay holds an established core session and, when not, why.
func (r *Relay) Ready() (bool, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.parked != "" {
		return false, []string{"parked: " + r.parked + "; only a restart with the bearer of the cluster's current relay credential serves the cluster again"}
	}
	if r.sess != nil && !r.sess.IsClosed() {
		return true, nil
	}
	return false, []string{"no core session: " + r.lastErr}
}

// Nodes reports how many node connections the relay carries.
func (r *Relay) Nodes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.nodes)
}

// sessionLoop keeps one core session up, reconnecting with jittered, bounded backoff.
func (r *Relay) sessionLoop() {
	defer r.wg.Done()
	backoff := r.cfg.BackoffMin
	for {
		sess, seq, scancel, err := r.dial()
		var pe parkError
		if errors.As(err, &pe) {
			r.park(pe.why)
			return
		}
		if err != nil {
			r.setDown(err.Error())
			r.met.dialFailed()
			r.log.Warn("relay: core session failed", "err", err)
			if !r.pause(&backoff) {
				return
			}
			continue
		}
		r.setUp(sess, seq)
		r.met.sessionUp()
		began := time.Now()
		r.log.Info("relay: core session established", "relay", r.id, "session", seq)
		if seq > 1 {
			r.wg.Add(1)
			go r.reregister(seq)
		}
		select {
		case <-r.ctx.Done():
			_ = sess.Close()
			scancel()
			r.setDown("relay stopping")
			return
		case <-sess.CloseChan():
			scancel()
			r.setDown("core session lost")
			r.log.Warn("relay: core session lost", "session", seq)
		}
		// A session that held for a while restarts the backoff; one dropped at once keeps growing it,
		// so a core that accepts and drops is not redialled in a tight loop.
		if time.Since(began) >= stableSession {
			backoff = r.cfg.BackoffMin
		}
		if !r.pause(&backoff) {
			return
		}
	}
}

// stableSession is how long a core session must have held for the backoff to start over.
const stableSession = 30 * time.Second

// pause waits a jittered backoff (between half of it and all of it) and doubles it up to its bound;
// false when the relay is stopping.
func (r *Relay) pause(backoff *time.Duration) bool {
	wait := *backoff/2 + mrand.N(*backoff/2+1)
	*backoff = min(2**backoff, r.cfg.BackoffMax)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// parkError ends the session loop for good: the credential's generation is gone.
type parkError struct{ why string }

func (e parkError) Error() string { return e.why }

// park stops the relay from registering again for the rest of the process (docs/relay.md
// section 10): not ready, says why once, keeps its listener and the nodes it carries, never exits.
func (r *Relay) park(why string) {
	r.mu.Lock()
	r.parked = why
	r.lastErr = why
	if r.sess != nil {
		r.sess = nil
		r.up = make(chan struct{})
	}
	r.mu.Unlock()
	r.met.parked()
	r.log.Error("relay: parked: it will not register again; restart it with the bearer of the cluster's current relay credential", "reason", why)
}

// coreProblem reads the code and detail of a problem+json answer (at most the 1 KiB the
// WebSocket client keeps of a refused upgrade).
func coreProblem(resp *http.Response) (code, detail string) {
	if resp == nil || resp.Body == nil {
		return "", ""
	}
	var p struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&p) != nil {
		return "", ""
	}
	return p.Code, p.Detail
}

// dial offers the next registration, opens the WebSocket, checks the negotiated version and the
// accepted credential generation, and starts the yamux client on it. It returns the registration's
// sequence, which names the session in every stream header. A parkError when the core says the
// credential's generation is gone or accepted another generation than the pinned one.
func (r *Relay) dial() (*yamux.Session, uint64, context.CancelFunc, error) {
	dctx, cancel := context.WithTimeout(r.ctx, r.cfg.DialTimeout)
	defer cancel()
	r.mu.Lock()
	r.regSeq++
	seq := r.regSeq
	pinned := r.gen
	r.mu.Unlock()
	reg, err := abirelay.RelayRegistration{RelayID: r.id, Build: r.cfg.Build, NodeID: r.cfg.NodeID, Address: r.cfg.Address, Sequence: seq}.Encode()
	if err != nil {
		return nil, 0, nil, err
	}
	h := http.Header{}
	h.Set(abirelay.HeaderRegistration, reg)
	if r.cfg.Credential != "" {
		h.Set("Authorization", "Bearer "+r.cfg.Credential)
	}
	ws, resp, err := websocket.Dial(dctx, r.cfg.CoreURL, &websocket.DialOptions{
		HTTPClient: r.cfg.HTTPClient, HTTPHeader: h, Subprotocols: []string{abirelay.Subprotocol}})
	if err != nil {
		if resp != nil {
			code, detail := coreProblem(resp)
			if code == string(abierrors.RelayCredentialStale) {
				return nil, 0, nil, parkError{fmt.Sprintf("the core refused this relay's credential as rotated away (%s): %s", code, detail)}
			}
			if code != "" {
				return nil, 0, nil, fmt.Errorf("dial %s: the core answered %s, %s: %s", r.cfg.CoreURL, resp.Status, code, detail)
			}
			return nil, 0, nil, fmt.Errorf("dial %s: the core answered %s: %w", r.cfg.CoreURL, resp.Status, err)
		}
		return nil, 0, nil, fmt.Errorf("dial %s: %w", r.cfg.CoreURL, err)
	}
	if ws.Subprotocol() != abirelay.Subprotocol {
		_ = ws.Close(websocket.StatusProtocolError, "relay protocol "+abirelay.Subprotocol+" required")
		return nil, 0, nil, fmt.Errorf("dial %s: the core did not accept the relay protocol %s", r.cfg.CoreURL, abirelay.Subprotocol)
	}
	if g := resp.Header.Get(abirelay.HeaderGeneration); g != "" {
		gen, perr := strconv.ParseInt(g, 10, 64)
		if perr != nil || gen <= 0 {
			_ = ws.Close(websocket.StatusProtocolError, "malformed credential generation")
			return nil, 0, nil, fmt.Errorf("dial %s: the core answered the credential generation %q", r.cfg.CoreURL, g)
		}
		if pinned != 0 && gen != pinned {
			_ = ws.Close(websocket.StatusPolicyViolation, "relay parked")
			return nil, 0, nil, parkError{fmt.Sprintf("this relay is bound to credential generation %d and the core accepted it as generation %d", pinned, gen)}
		}
		r.mu.Lock()
		if r.gen == 0 {
			r.gen = gen
			r.cluster = resp.Header.Get(abirelay.HeaderCluster)
			r.log.Info("relay: registration accepted", "cluster", r.cluster, "generation", gen)
		}
		r.mu.Unlock()
	}
	ws.SetReadLimit(wsReadLimit)
	// The NetConn lives until the session closes it or the relay stops.
	sctx, scancel := context.WithCancel(r.ctx)
	nc := websocket.NetConn(sctx, ws, websocket.MessageBinary)
	sess, err := yamux.Client(nc, muxConfig(r.log, r.cfg.WriteTimeout, r.cfg.StreamOpenTimeout, r.cfg.KeepAlive))
	if err != nil {
		_ = nc.Close()
		scancel()
		return nil, 0, nil, fmt.Errorf("start the mux: %w", err)
	}
	return sess, seq, scancel, nil
}

func (r *Relay) setUp(s *yamux.Session, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq = seq
	r.sess = s
	r.lastErr = ""
	close(r.up)
}

func (r *Relay) setDown(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastErr = why
	if r.sess != nil {
		r.sess = nil
		r.up = make(chan struct{})
	}
}

// current returns the live session and its sequence, or a channel closed when one is up.
func (r *Relay) current() (*yamux.Session, uint64, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess != nil && !r.sess.IsClosed() {
		return r.sess, r.seq, nil
	}
	return nil, 0, r.up
}

// reregister closes, paced, every node opened on a session older than seq, so it reconnects and
// registers again on the new one.
func (r *Relay) reregister(seq uint64) {
	defer r.wg.Done()
	r.mu.Lock()
	var old []*node
	for n := range r.nodes {
		if n.seq < seq {
			old = append(old, n)
		}
	}
	r.mu.Unlock()
	if len(old) == 0 {
		return
	}
	spacing := r.cfg.ReregisterSpacing
	if len(old) > 1 && spacing*time.Duration(len(old)-1) > r.cfg.ReregisterWindow {
		spacing = r.cfg.ReregisterWindow / time.Duration(len(old)-1)
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for i, n := range old {
		if i > 0 {
			t.Reset(spacing)
			select {
			case <-r.ctx.Done():
				return
			case <-t.C:
			}
		}
		r.log.Info("relay: node asked to re-register: the relay's core session changed", "node", n.conn.RemoteAddr().String())
		r.met.nodeReregistered()
		n.close()
	}
}

// acceptLoop accepts node connections until the listener is closed.
func (r *Relay) acceptLoop() {
	defer r.wg.Done()
	for {
		c, err := r.cfg.Listener.Accept()
		if err != nil {
			if r.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("relay: accept", "err", err)
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		r.wg.Add(1)
		go r.carry(c)
	}
}

// carry forwards one node connection over one stream until either side ends it.
func (r *Relay) carry(c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	log := r.log.With("node", c.RemoteAddr().String())
	if tc, ok := c.(*tls.Conn); ok {
		hctx, cancel := context.WithTimeout(r.ctx, r.cfg.WriteTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			log.Warn("relay: node TLS handshake", "err", err)
			r.met.nodeRefused("tls_handshake")
			return
		}
	}

	sess, seq, up := r.current()
	if sess == nil {
		t := time.NewTimer(r.cfg.SessionWait)
		select {
		case <-up:
			t.Stop()
			sess, seq, _ = r.current()
		case <-t.C:
		case <-r.ctx.Done():
			t.Stop()
			return
		}
		if sess == nil {
			log.Warn("relay: node refused", "reason", fmt.Sprintf("no core session after waiting %d ms", r.cfg.SessionWait.Milliseconds()))
			r.met.nodeRefused("no_core_session")
			return
		}
	}
	st, err := sess.OpenStream()
	if err != nil {
		log.Warn("relay: open stream", "err", err)
		r.met.nodeRefused("open_stream")
		return
	}
	defer st.Close()
	hdr, err := abirelay.StreamHeader{Version: abirelay.HeaderVersion, RemoteAddr: c.RemoteAddr().String(),
		Registration: abirelay.Registration{RelayID: r.id, Session: seq}}.Encode()
	if err != nil {
		log.Warn("relay: stream header", "err", err)
		return
	}
	_ = st.SetWriteDeadline(time.Now().Add(r.cfg.WriteTimeout))
	if _, err := st.Write(hdr); err != nil {
		log.Warn("relay: write stream header", "err", err)
		return
	}
	n := &node{conn: c, seq: seq, kick: make(chan struct{})}
	r.mu.Lock()
	r.nodes[n] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.nodes, n)
		r.mu.Unlock()
	}()

	upDone := make(chan error, 1)
	go func() { upDone <- pipe(guardedStream{Stream: st, sess: sess}, c, r.cfg.WriteTimeout) }() // node → core
	downErr := make(chan error, 1)
	go func() { downErr <- pipe(c, st, r.cfg.WriteTimeout) }() // core → node

	var upErr error
	upOpen, dnOpen := true, true
	select {
	case upErr = <-upDone:
		upOpen = false
	case <-downErr:
		dnOpen = false
	case <-n.kick:
	case <-r.ctx.Done():
	}
	nodeEOF := !upOpen && upErr == nil
	nodeGone := !upOpen && !isWriteError(upErr)
	switch {
	case sess.IsClosed() && r.ctx.Err() == nil && !nodeGone && !n.kicked():
		// The core session is gone under a node whose own connection stands: keep the node until
		// the next session asks it to re-register, so a reconnect does not close every node at once.
		var upc <-chan error
		if upOpen {
			upc = upDone
		}
	wait:
		for {
			select {
			case <-n.kick:
				break wait
			case <-r.ctx.Done():
				break wait
			case err := <-upc:
				upOpen, upc = false, nil
				if !isWriteError(err) {
					break wait // the node went away
				}
				// The node spoke into the lost session: its bytes are gone with it, and the node
				// stays until it is asked to re-register.
			}
		}
	case nodeEOF && dnOpen:
		// The node ended its side: half-close the stream and give the core its write budget to finish.
		_ = st.Close()
		t := time.NewTimer(r.cfg.WriteTimeout)
		select {
		case <-downErr:
			dnOpen = false
		case <-t.C:
		case <-n.kick:
		case <-r.ctx.Done():
		}
		t.Stop()
	}
	_ = c.Close()
	_ = st.Close()
	_ = st.SetDeadline(time.Now())
	if upOpen {
		<-upDone
	}
	if dnOpen {
		<-downErr
	}
	log.Debug("relay: node connection ended", "err", upErr)
}

// writeError is a pipe's failure to write to its destination, told apart from its source ending.
type writeError struct{ error }

func (e writeError) Unwrap() error { return e.error }

func isWriteError(err error) bool {
	var we writeError
	return errors.As(err, &we)
}

// pipe copies src to dst with one bounded buffer, each write under its own deadline, so a peer that
// stops reading ends its own connection and never blocks another.
func pipe(dst, src net.Conn, writeTimeout time.Duration) error {
	buf := make([]byte, DefaultCopyBuffer)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return writeError{werr}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// ReadyHandler answers /readyz: 200 with {"ready":true} while the relay holds an established core
// session, otherwise 503 with {"ready":false,"refusals":[...]} naming why not.
func (r *Relay) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ok, why := r.Ready()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		body := map[string]any{"ready": ok}
		if !ok {
			body["refusals"] = why
		}
		_ = json.NewEncoder(w).Encode(body)
	})
}
