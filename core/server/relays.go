package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirelay "github.com/berthhq/berth/abi/relay"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/relay"
)

// RelayPath is where relays dial berthd (docs/relay.md section 10).
const RelayPath = "/relay/v1/session"

// relayFront accepts the cluster relays (docs/relay.md sections 10 and 11): it authenticates each
// relay's credential, records its registration, and serves the node routes (the node session,
// enrollment, bundle and release downloads, pulls under /v2/) on the streams it carries, with the
// relay's identity in each connection's context.
type relayFront struct {
	clusters *clusters.Registry
	core     *relay.Core
	carried  *streamListener
	srv      *http.Server
	log      *slog.Logger
	instance string

	mu   sync.Mutex
	live map[string]map[*relaySession]struct{} // sessions served here, by cluster
}

// relaySession is one relay session this process serves.
type relaySession struct {
	cluster string
	reg     clusters.Registration
	end     func()
}

// newRelayFront builds the relay endpoint over handler, the server's whole handler, of which
// only the node routes are served on carried streams.
func newRelayFront(cl *clusters.Registry, handler http.Handler, metrics prometheus.Registerer, log *slog.Logger) (*relayFront, error) {
	f := &relayFront{clusters: cl, log: log.With("component", "relay"), instance: identity.NewID("core_"),
		live: map[string]map[*relaySession]struct{}{}, carried: newStreamListener()}
	core, err := relay.NewCore(relay.CoreConfig{Handler: f.serveStream, Authenticate: f.admit, Logger: f.log, Metrics: metrics})
	if err != nil {
		return nil, err
	}
	f.core = core
	f.srv = &http.Server{
		Handler:           carriedRoutes(handler),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if cc, ok := c.(carriedConn); ok {
				return clusters.WithCarrier(ctx, cc.carrier)
			}
			return ctx
		},
	}
	go func() { _ = f.srv.Serve(f.carried) }()
	return f, nil
}

// wrap mounts the relay endpoint in front of next.
func (f *relayFront) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == RelayPath {
			f.core.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// close ends every relay session and the carried connections.
func (f *relayFront) close(ctx context.Context) {
	_ = f.core.Close()
	_ = f.srv.Shutdown(ctx)
}

// admit judges a relay's upgrade after its protocol version: the credential, then the
// registration. It answers the cluster and the accepted generation in the upgrade's headers.
func (f *relayFront) admit(w http.ResponseWriter, r *http.Request) (*relay.Admission, error) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	cl, gen, err := f.clusters.AuthenticateRelay(ctx, bearer)
	switch {
	case errors.Is(err, clusters.ErrCredentialStale):
		return nil, abierrors.New(abierrors.RelayCredentialStale, fmt.Sprintf(
			"cluster %s rotated this relay credential away (generation %d is not the current one); restart the relay with the current credential", cl.Name, gen))
	case errors.Is(err, identity.ErrUnauthenticated):
		return nil, err
	case err != nil:
		return nil, abierrors.Wrap(abierrors.Unavailable, "the core could not check the relay credential; retry", err)
	}
	g, err := abirelay.ParseRegistration(r.Header.Get(abirelay.HeaderRegistration))
	if err != nil {
		return nil, abierrors.New(abierrors.RelayRegistrationRefused, err.Error())
	}
	reg := clusters.Registration{RelayID: g.RelayID, Build: g.Build, NodeID: g.NodeID, Address: g.Address,
		Sequence: g.Sequence, Generation: gen, Core: f.instance}
	if _, err := f.clusters.Register(ctx, cl.Name, reg); err != nil {
		switch {
		case errors.Is(err, clusters.ErrCredentialStale):
			return nil, abierrors.New(abierrors.RelayCredentialStale, fmt.Sprintf("cluster %s: generation %d is no longer the current one", cl.Name, gen))
		case errors.Is(err, clusters.ErrSequenceNotAdvancing), errors.Is(err, clusters.ErrInvalid), errors.Is(err, clusters.ErrNoRelay):
			return nil, abierrors.New(abierrors.RelayRegistrationRefused, err.Error())
		}
		return nil, abierrors.Wrap(abierrors.Unavailable, "the core could not record the relay's registration; retry", err)
	}
	w.Header().Set(abirelay.HeaderCluster, cl.Name)
	w.Header().Set(abirelay.HeaderGeneration, strconv.FormatInt(gen, 10))
	rs := &relaySession{cluster: cl.Name, reg: reg}
	f.log.Info("relay registered", "cluster", cl.Name, "relay", g.RelayID, "sequence", g.Sequence, "build", g.Build, "address", g.Address, "generation", gen)
	return &relay.Admission{
		ID: g.RelayID,
		Context: func(ctx context.Context) context.Context {
			return clusters.WithCarrier(ctx, clusters.Carrier{Cluster: cl.Name, RelayID: g.RelayID, Session: g.Sequence})
		},
		Check: func(h abirelay.StreamHeader) error { return f.check(rs, h) },
		Run:   func(ctx context.Context, end func()) { f.renew(ctx, rs, end) },
		Done:  func() { f.done(rs) },
	}, nil
}

// check refuses a stream before anything of it is served (docs/relay.md section 11): one that
// names another registration than the session's, and any stream of a cluster whose election is
// not this registration (none live, two live, or this one superseded or of a rotated generation).
func (f *relayFront) check(rs *relaySession, h abirelay.StreamHeader) error {
	if h.Registration.RelayID != rs.reg.RelayID || h.Registration.Session != rs.reg.Sequence {
		return fmt.Errorf("%s: the stream names registration %s/%d, the session is %s/%d",
			abierrors.RelayRegistrationRefused, h.Registration.RelayID, h.Registration.Session, rs.reg.RelayID, rs.reg.Sequence)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	won, err := f.clusters.Elect(ctx, rs.cluster)
	switch {
	case errors.Is(err, clusters.ErrAmbiguous):
		return fmt.Errorf("%s: %w", abierrors.RelayAmbiguous, err)
	case errors.Is(err, clusters.ErrNotConnected):
		return fmt.Errorf("%s: %w", abierrors.RelayNotConnected, err)
	case err != nil:
		return err
	case won.RelayID != rs.reg.RelayID || won.Sequence != rs.reg.Sequence:
		return fmt.Errorf("%s: registration %s/%d was superseded by %s/%d", abierrors.RelayRegistrationRefused,
			rs.reg.RelayID, rs.reg.Sequence, won.RelayID, won.Sequence)
	}
	return nil
}

// renew keeps the session's registration live every clusters.RenewEvery while the session
// stands, and ends the session when the registration was superseded or its generation rotated
// away (the relay then redials and learns which).
func (f *relayFront) renew(ctx context.Context, rs *relaySession, end func()) {
	rs.end = end
	f.mu.Lock()
	if f.live[rs.cluster] == nil {
		f.live[rs.cluster] = map[*relaySession]struct{}{}
	}
	f.live[rs.cluster][rs] = struct{}{}
	f.mu.Unlock()
	t := time.NewTicker(clusters.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f.clusters.Renew(rctx, rs.cluster, rs.reg.RelayID, rs.reg.Sequence)
		cancel()
		switch {
		case errors.Is(err, clusters.ErrSuperseded), errors.Is(err, clusters.ErrCredentialStale), errors.Is(err, clusters.ErrNotFound):
			f.log.Warn("relay session ended: its registration is no longer current", "cluster", rs.cluster, "relay", rs.reg.RelayID, "err", err)
			end()
			return
		case err != nil:
			f.log.Warn("relay renewal failed", "cluster", rs.cluster, "relay", rs.reg.RelayID, "err", err)
		}
	}
}

// done removes the registration of an ended session, unless a newer one replaced it.
func (f *relayFront) done(rs *relaySession) {
	f.mu.Lock()
	delete(f.live[rs.cluster], rs)
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.clusters.Unregister(ctx, rs.cluster, rs.reg.RelayID, rs.reg.Sequence); err != nil {
		f.log.Warn("relay unregistration failed; the registration expires on its own", "cluster", rs.cluster, "relay", rs.reg.RelayID, "err", err)
	}
	f.log.Info("relay session ended", "cluster", rs.cluster, "relay", rs.reg.RelayID, "sequence", rs.reg.Sequence)
}

// rotated ends at once every relay session this process serves for cluster: their credential's
// generation is gone, and each relay learns it on its next dial and parks.
func (f *relayFront) rotated(cluster string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for rs := range f.live[cluster] {
		if rs.end != nil {
			rs.end()
		}
	}
}

// serveStream hands a carried node connection to the carried routes' server.
func (f *relayFront) serveStream(ctx context.Context, conn net.Conn, h abirelay.StreamHeader) {
	carrier, _ := clusters.CarrierFrom(ctx)
	carrier.RemoteAddr = h.RemoteAddr
	if !f.carried.push(ctx, carriedConn{Conn: conn, carrier: carrier}) {
		_ = conn.Close()
	}
}

// carriedPrefixes are the routes served on a relay's streams: what a node's agent asks of the
// core. Everything else answers 404 there.
var carriedPrefixes = []string{"/api/v1/nodes/session", "/api/v1/nodes/enroll", "/api/v1/bundles/", "/api/v1/releases/", "/v2/"}

// carriedRoutes serves only the node routes of next; under /v2/ only GET and HEAD (pulls).
func carriedRoutes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range carriedPrefixes {
			if r.URL.Path == strings.TrimSuffix(p, "/") || strings.HasPrefix(r.URL.Path, p) {
				if p == "/v2/" && r.Method != http.MethodGet && r.Method != http.MethodHead {
					break
				}
				next.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = fmt.Fprintf(w, `{"title":"Not Found","status":404,"code":%q,"detail":"%s %s is not served through a relay"}`+"\n",
			abierrors.NotFound, r.Method, strings.ReplaceAll(r.URL.Path, `"`, ""))
	})
}

// carriedConn is a relay stream with the identity of the relay that carried it.
type carriedConn struct {
	net.Conn
	carrier clusters.Carrier
}

// RemoteAddr is the node's address as the relay saw it.
func (c carriedConn) RemoteAddr() net.Addr { return relayAddr(c.carrier.RemoteAddr) }

type relayAddr string

func (a relayAddr) Network() string { return "relay" }
func (a relayAddr) String() string  { return string(a) }

// streamListener is a net.Listener whose connections are the relays' streams.
type streamListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newStreamListener() *streamListener {
	return &streamListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// push hands c to Accept; false when the listener closed or ctx ended first.
func (l *streamListener) push(ctx context.Context, c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	case <-ctx.Done():
		return false
	}
}

func (l *streamListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *streamListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *streamListener) Addr() net.Addr { return relayAddr("relay-streams") }
