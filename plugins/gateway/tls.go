package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/berthhq/berth/abi/routes"
)

// TLS data plane (docs/plugins.md section 5.6): certificates chosen by SNI
// from the table in force, passthrough by SNI, and the plain listener's
// HTTP-01 answers and redirects (in proxy.go).

// helloTimeout bounds how long a client may take to send its ClientHello
// and finish the handshake on the TLS listener.
const helloTimeout = 10 * time.Second

// maxLoggedNames bounds the names whose failed handshakes are logged per
// table; past it one line says further names go unlogged.
const maxLoggedNames = 1024

// Reasons of berth_gateway_tls_handshake_failures_total.
const (
	failNoRoute       = "no_route"
	failNoCertificate = "no_certificate"
	failNoSNI         = "no_sni"
	failBadHello      = "bad_hello"
)

// errHandshake is what GetCertificate answers for a name it has no
// certificate for; the client sees a TLS alert.
var errHandshake = errors.New("berth: no certificate for this server name")

// certificates are the parsed certificates of a table by name: exact
// names and wildcards ("*.example.com") as keys.
type certificates map[string]*tls.Certificate

// compileCertificates parses the table's certificates. A certificate that
// does not parse or whose key does not match is dropped with a log line
// naming its names (never its key) and counted. When two certificates name
// the same name, the one that expires last wins.
func (p *Proxy) compileCertificates(t routes.Table) certificates {
	out := make(certificates, len(t.Certificates))
	for _, c := range t.Certificates {
		kp, err := tls.X509KeyPair([]byte(c.CertPEM), []byte(c.KeyPEM))
		if err != nil {
			// X509KeyPair's errors name the problem, never the key bytes.
			p.logger.Warn("gateway: certificate refused; its names have no certificate",
				"names", c.Names, "not_after", c.NotAfter, "revision", t.Revision, "error", err)
			p.obs.certificateRefused()
			continue
		}
		for _, n := range c.Names {
			if old, ok := out[n]; ok && old.Leaf != nil && kp.Leaf != nil && !kp.Leaf.NotAfter.After(old.Leaf.NotAfter) {
				continue
			}
			out[n] = &kp
		}
	}
	p.obs.certificatesInForce(len(t.Certificates))
	return out
}

// lookup returns the routes of host: its own, else those of the wildcard
// one label deep that covers it, else nil. A hostname with routes of its
// own never falls back to the wildcard, even when none of them matches a
// request.
func (c *compiled) lookup(host string) *vhost {
	if vh, ok := c.byHost[host]; ok {
		return vh
	}
	if w := routes.WildcardOf(host); w != "" {
		return c.byHost[w]
	}
	return nil
}

// certificate returns the certificate for host: one naming it exactly,
// else one whose wildcard covers it, else nil.
func (c *compiled) certificate(host string) *tls.Certificate {
	if kp, ok := c.certs[host]; ok {
		return kp
	}
	if w := routes.WildcardOf(host); w != "" {
		return c.certs[w]
	}
	return nil
}

// TLSConfig returns the configuration of the gateway's TLS listener: the
// certificate is chosen at each handshake by SNI from the table in force
// ([Proxy.SetTable] swaps it with the routes), for routes with tls_mode
// acme or manual only; ALPN offers h2 and http/1.1. A handshake for a name
// without such a route or certificate, or without a name, fails; the name is
// logged once per table and counted (docs/plugins.md section 5.6).
func (p *Proxy) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			host := normalizeHost(hello.ServerName)
			st := p.state.Load()
			if host == "" {
				p.handshakeFailed(failNoSNI, "", hello.Conn)
				return nil, errHandshake
			}
			rt := st.lookup(host)
			if rt == nil || !routes.TerminatesTLS(rt.mode) {
				p.handshakeFailed(failNoRoute, host, hello.Conn)
				return nil, errHandshake
			}
			kp := st.certificate(host)
			if kp == nil {
				p.handshakeFailed(failNoCertificate, host, hello.Conn)
				return nil, errHandshake
			}
			return kp, nil
		},
	}
}

// handshakeFailed counts a failed handshake and logs its name the first
// time in the table in force.
func (p *Proxy) handshakeFailed(reason, host string, conn net.Conn) {
	p.obs.handshakeFailed(reason)
	if host == "" {
		return
	}
	p.tlsLogMu.Lock()
	_, seen := p.tlsLogged[host]
	full := len(p.tlsLogged) >= maxLoggedNames
	if !seen && !full {
		p.tlsLogged[host] = struct{}{}
	}
	if !seen && full && !p.tlsLogFull {
		p.tlsLogFull = true
		p.tlsLogMu.Unlock()
		p.logger.Warn("gateway: too many server names without a certificate; further ones are not logged until the table changes", "names", maxLoggedNames)
		return
	}
	p.tlsLogMu.Unlock()
	if seen || full {
		return
	}
	remote := ""
	if conn != nil {
		remote = conn.RemoteAddr().String()
	}
	p.logger.Warn("gateway: TLS handshake refused; later ones for this name are not logged until the table changes",
		"server_name", host, "reason", reason, "remote_addr", remote)
}

// NewTLSServer returns the gateway's HTTP server for the connections of a
// [TLSListener]: HTTP/2 or HTTP/1.1 as the handshake's ALPN chose, with the
// bounds of [NewServer]. Its own complaints (clients that go away mid-way)
// go to the proxy's log at debug level.
func (p *Proxy) NewTLSServer() *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	return &http.Server{
		Handler:           p,
		Protocols:         &protos,
		TLSConfig:         p.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          log.New(debugWriter{p}, "", 0),
	}
}

// debugWriter sends an *http.Server's log lines to the proxy's logger at
// debug level.
type debugWriter struct{ p *Proxy }

func (d debugWriter) Write(b []byte) (int, error) {
	d.p.logger.Debug("gateway: tls server", "message", string(bytes.TrimSpace(b)))
	return len(b), nil
}

// TLSListener is the gateway's TLS listener: it reads each connection's
// ClientHello, relays connections for passthrough routes to their upstreams
// unchanged, and hands the others, with the handshake done by
// [Proxy.TLSConfig], to an *http.Server through Accept (serve it with the
// server [Proxy.NewTLSServer] returns). Close stops accepting and ends the
// connections it relays. Safe for concurrent use.
type TLSListener struct {
	proxy *Proxy
	raw   net.Listener
	cfg   *tls.Config
	ready chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu     sync.Mutex
	active map[net.Conn]struct{} // connections in their hello or relayed; mu must be held
}

var _ net.Listener = (*TLSListener)(nil)

// NewTLSListener starts accepting on raw (a TCP listener) for p. The
// caller serves it with p.NewTLSServer().Serve and closes it.
func (p *Proxy) NewTLSListener(raw net.Listener) *TLSListener {
	l := &TLSListener{proxy: p, raw: raw, cfg: p.TLSConfig(), ready: make(chan net.Conn),
		done: make(chan struct{}), active: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection whose TLS handshake succeeded, or
// net.ErrClosed after Close.
func (l *TLSListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("gateway tls listener: %w", net.ErrClosed)
	}
}

// Addr is the address of the underlying listener.
func (l *TLSListener) Addr() net.Addr { return l.raw.Addr() }

// Close stops accepting, closes the connections still in their handshake
// or relayed by passthrough, and waits for their goroutines. Connections
// already handed to Accept belong to the server. Idempotent.
func (l *TLSListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.raw.Close()
		l.mu.Lock()
		for c := range l.active {
			_ = c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return err
}

// track adds c to the active set, or reports false (and closes c) once the
// listener is closed.
func (l *TLSListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		_ = c.Close()
		return false
	default:
	}
	l.active[c] = struct{}{}
	return true
}

func (l *TLSListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.active, c)
	l.mu.Unlock()
}

func (l *TLSListener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.raw.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) {
				// Out of descriptors: wait as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
				case <-l.done:
					return
				}
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.proxy.logger.Error("gateway: tls listener stopped accepting", "error", err)
			return
		}
		backoff = 0
		if !l.track(c) {
			return
		}
		l.wg.Add(1)
		go l.handle(c)
	}
}

// handle reads c's ClientHello and either relays c (passthrough) or
// finishes the handshake and hands the TLS connection to Accept.
func (l *TLSListener) handle(c net.Conn) {
	defer l.wg.Done()
	handedOver := false
	defer func() {
		l.untrack(c)
		if !handedOver {
			_ = c.Close()
		}
	}()
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	name, peeked, err := peekServerName(c)
	if err != nil {
		l.proxy.obs.handshakeFailed(failBadHello)
		l.proxy.logger.Debug("gateway: not a TLS ClientHello", "remote_addr", c.RemoteAddr().String(), "error", err)
		return
	}
	host := normalizeHost(name)
	// A passthrough hostname has one route: match conditions are refused
	// on passthrough routes, so the table holds no other.
	if vh := l.proxy.state.Load().lookup(host); host != "" && vh != nil && vh.mode == routes.TLSPassthrough {
		_ = c.SetDeadline(time.Time{})
		l.proxy.passthrough(c, peeked, vh.routes[0], l.done)
		return
	}
	tc := tls.Server(&prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(peeked), c)}, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		// Counted and logged by GetCertificate when it refused the name.
		l.proxy.logger.Debug("gateway: tls handshake failed", "server_name", host, "remote_addr", c.RemoteAddr().String(), "error", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case l.ready <- tc:
		handedOver = true
	case <-l.done:
	}
}

// prefixConn is a connection whose first bytes were already read: reads
// return them first, then the rest of the connection.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// errHelloRead stops the peeking handshake once the ClientHello is read.
var errHelloRead = errors.New("berth: client hello read")

// peekServerName reads c's ClientHello and returns its server name (SNI,
// "" when the client sent none) and every byte read from c, so that the
// connection can be replayed to a TLS server or an upstream unchanged. It
// parses the hello with crypto/tls itself and writes nothing to c.
func peekServerName(c net.Conn) (string, []byte, error) {
	var buf bytes.Buffer
	var name string
	got := false
	err := tls.Server(readOnlyConn{Conn: c, r: io.TeeReader(c, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, got = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	if !got {
		return "", buf.Bytes(), fmt.Errorf("read client hello: %w", err)
	}
	return name, buf.Bytes(), nil
}

// readOnlyConn lets crypto/tls read a ClientHello without writing to the
// client: writes (the alert of the aborted handshake) are dropped.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (r readOnlyConn) Read(b []byte) (int, error)  { return r.r.Read(b) }
func (r readOnlyConn) Write(b []byte) (int, error) { return 0, io.ErrClosedPipe }

// passthrough relays c, whose first bytes (peeked) were already read, to one
// of rt's healthy upstreams, tried in turn on a failed connect, and copies
// both directions until both are done or stop closes. The client's address
// must be in rt's allow_sources.
func (p *Proxy) passthrough(c net.Conn, peeked []byte, rt *route, stop <-chan struct{}) {
	if !rt.allows(c.RemoteAddr().String()) {
		p.obs.passthroughDone(rt.service, "source_not_allowed")
		p.logger.Info("gateway: passthrough refused: source not allowed", "server_name", rt.hostname, "remote_addr", c.RemoteAddr().String())
		return
	}
	n := len(rt.healthy)
	if n == 0 {
		p.obs.passthroughDone(rt.service, "no_upstream")
		p.logger.Warn("gateway: passthrough without a healthy upstream", "server_name", rt.hostname)
		return
	}
	start := rt.next.Add(1) - 1
	var up net.Conn
	for i := range n {
		u := rt.healthy[(start+uint64(i))%uint64(n)]
		d := net.Dialer{Timeout: rt.connect}
		conn, err := d.Dial("tcp", u.Address)
		if err == nil {
			up = conn
			break
		}
		p.obs.upstreamError(rt.service, u.Address, err)
		p.logger.Warn("gateway: passthrough upstream failed", "server_name", rt.hostname, "upstream", u.Address,
			"workload_id", u.WorkloadID, "retrying", i+1 < n, "error", err)
	}
	if up == nil {
		p.obs.passthroughDone(rt.service, "no_upstream")
		return
	}
	defer up.Close()
	p.obs.passthroughDone(rt.service, "relayed")
	if _, err := up.Write(peeked); err != nil {
		p.logger.Warn("gateway: passthrough upstream failed", "server_name", rt.hostname, "upstream", up.RemoteAddr().String(), "error", err)
		return
	}
	copied := make(chan struct{}, 2)
	halfClose := func(conn net.Conn) {
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}
	go func() { _, _ = io.Copy(up, c); halfClose(up); copied <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); halfClose(c); copied <- struct{}{} }()
	for left := 2; left > 0; left-- {
		select {
		case <-copied:
		case <-stop:
			_ = c.Close()
			_ = up.Close()
			for ; left > 0; left-- {
				<-copied
			}
			return
		}
	}
}
