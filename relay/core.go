package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirelay "github.com/berthhq/berth/abi/relay"
)

// StreamHandler serves one node connection carried by a relay. conn is the stream after its header;
// the handler owns it and must close it. ctx ends when the relay's session ends and carries what
// the relay's [Admission.Context] put in it.
type StreamHandler func(ctx context.Context, conn net.Conn, h abirelay.StreamHeader)

// Admission is an accepted relay: what the core side needs to serve its session. Every field but
// ID may be nil.
type Admission struct {
	// ID names the relay in logs.
	ID string
	// Context derives the session's context, the one every StreamHandler of it receives.
	Context func(ctx context.Context) context.Context
	// Check judges each stream's header before anything of the stream is served; an error
	// refuses the stream (closed, logged with the error).
	Check func(h abirelay.StreamHeader) error
	// Run runs while the session stands, its ctx ending with it; calling end ends the session
	// (the relay reconnects). For renewals.
	Run func(ctx context.Context, end func())
	// Done is called once the session ended and every stream handler returned.
	Done func()
}

// Authenticator judges a relay's upgrade request after its protocol version was accepted. It may
// set headers of the answer on w (never write it). An *abierrors.Error is answered with its code
// and status and its message as the detail; any other error as 401 unauthenticated. A nil
// Authenticator accepts every relay with an empty Admission.
type Authenticator func(w http.ResponseWriter, r *http.Request) (*Admission, error)

// CoreConfig configures the core side.
type CoreConfig struct {
	// Handler serves each node stream (required).
	Handler StreamHandler
	// Authenticate judges the relay's credential; nil accepts every relay.
	Authenticate Authenticator
	// Logger receives the transport's logs; nil drops them.
	Logger *slog.Logger
	// Metrics registers the core side's metric families; nil registers none.
	Metrics prometheus.Registerer
	// HeaderTimeout bounds reading one stream's header (default DefaultHeaderTimeout).
	HeaderTimeout time.Duration
	// WriteTimeout bounds each write on the session (default DefaultWriteTimeout).
	WriteTimeout time.Duration
	// KeepAlive is the yamux ping interval (default DefaultKeepAlive).
	KeepAlive time.Duration
}

// Core is the core side of the relay transport: an http.Handler that accepts a relay's WebSocket,
// runs the yamux server on it and hands each stream, after its header, to the StreamHandler.
type Core struct {
	cfg    CoreConfig
	log    *slog.Logger
	met    *coreMetrics
	mu     sync.Mutex
	closed bool
	sess   map[*yamux.Session]struct{}
	wg     sync.WaitGroup
}

// NewCore returns the core side; mount it on the route the relays dial.
func NewCore(cfg CoreConfig) (*Core, error) {
	if cfg.Handler == nil {
		return nil, errors.New("relay core: a stream handler is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	c := &Core{cfg: cfg, log: cfg.Logger, sess: map[*yamux.Session]struct{}{}}
	c.met = newCoreMetrics(cfg.Metrics, c)
	return c, nil
}

// offersSubprotocol reports whether the upgrade request offers the protocol version this core speaks.
func offersSubprotocol(r *http.Request) bool {
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if strings.TrimSpace(p) == abirelay.Subprotocol {
				return true
			}
		}
	}
	return false
}

func writeProblem(w http.ResponseWriter, status int, code abierrors.Code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"title": http.StatusText(status), "status": status, "code": code, "detail": detail})
}

// ServeHTTP accepts one relay session and serves it until it ends. The protocol version is judged
// first, before the credential.
func (c *Core) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		writeProblem(w, http.StatusServiceUnavailable, abierrors.Unavailable, "the core is not accepting relays")
		return
	}
	if !offersSubprotocol(r) {
		writeProblem(w, http.StatusBadRequest, abierrors.RelayProtocolUnsupported,
			fmt.Sprintf("this core speaks the relay protocol %s; the relay offered %q",
				abirelay.Subprotocol, r.Header.Get("Sec-WebSocket-Protocol")))
		return
	}
	adm := &Admission{ID: r.RemoteAddr}
	if c.cfg.Authenticate != nil {
		got, err := c.cfg.Authenticate(w, r)
		if err != nil {
			c.log.Warn("relay refused", "remote", r.RemoteAddr, "err", err)
			c.met.relayRefused()
			var coded *abierrors.Error
			if errors.As(err, &coded) {
				writeProblem(w, coded.Code.HTTPStatus(), coded.Code, coded.Message)
				return
			}
			writeProblem(w, http.StatusUnauthorized, abierrors.Unauthenticated, "the relay credential is not valid")
			return
		}
		adm = got
	}
	if adm.Done != nil {
		defer adm.Done()
	}
	id := adm.ID
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{abirelay.Subprotocol}})
	if err != nil {
		c.log.Warn("relay upgrade failed", "remote", r.RemoteAddr, "err", err)
		return
	}
	ws.SetReadLimit(wsReadLimit)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	if adm.Context != nil {
		ctx = adm.Context(ctx)
	}
	sess, err := yamux.Server(nc, muxConfig(c.log, c.cfg.WriteTimeout, DefaultStreamOpenTimeout, c.cfg.KeepAlive))
	if err != nil {
		c.log.Error("relay session", "err", err)
		_ = nc.Close()
		return
	}
	if !c.track(sess) {
		_ = sess.Close()
		return
	}
	defer c.untrack(sess)
	c.log.Info("relay session established", "relay", id, "remote", r.RemoteAddr)
	go func() {
		<-sess.CloseChan()
		cancel()
	}()
	var streams sync.WaitGroup
	if adm.Run != nil {
		streams.Go(func() { adm.Run(ctx, func() { _ = sess.Close() }) })
	}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		streams.Add(1)
		go func() {
			defer streams.Done()
			c.serveStream(ctx, adm, sess, st)
		}()
	}
	_ = sess.Close()
	cancel()
	streams.Wait()
	c.log.Info("relay session ended", "relay", id, "remote", r.RemoteAddr)
}

// serveStream reads the header under its deadline and hands the stream on, or refuses it.
func (c *Core) serveStream(ctx context.Context, adm *Admission, sess *yamux.Session, st *yamux.Stream) {
	_ = st.SetReadDeadline(time.Now().Add(c.cfg.HeaderTimeout))
	h, err := abirelay.ReadHeader(st)
	if err != nil {
		c.log.Warn("relay stream refused", "code", abierrors.RelayHeaderInvalid, "relay", adm.ID, "err", err)
		c.met.streamRefused()
		_ = st.Close()
		return
	}
	if adm.Check != nil {
		if err := adm.Check(h); err != nil {
			c.log.Warn("relay stream refused", "relay", adm.ID, "remote", h.RemoteAddr, "err", err)
			c.met.streamRefused()
			_ = st.Close()
			return
		}
	}
	_ = st.SetReadDeadline(time.Time{})
	c.cfg.Handler(ctx, guardedStream{Stream: st, sess: sess}, h)
}

func (c *Core) track(s *yamux.Session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.sess[s] = struct{}{}
	c.wg.Add(1)
	return true
}

func (c *Core) untrack(s *yamux.Session) {
	c.mu.Lock()
	delete(c.sess, s)
	c.mu.Unlock()
	c.wg.Done()
}

// Sessions reports how many relay sessions are being served.
func (c *Core) Sessions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sess)
}

// Drop ends every relay session being served (the relays reconnect) and keeps accepting new ones.
func (c *Core) Drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.sess {
		_ = s.Close()
	}
}

// Close ends every relay session, refuses new ones and waits until each ServeHTTP has returned.
func (c *Core) Close() error {
	c.mu.Lock()
	c.closed = true
	for s := range c.sess {
		_ = s.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}
