package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/routes"
)

// Upstream transport limits. Upstreams are workloads on the cluster network,
// spoken to in plain HTTP/1.1.
const (
	// dialTimeout bounds a TCP connect to one upstream. A workload that does
	// not accept within it is treated like a refused connection, so an
	// idempotent request moves on to the next upstream.
	dialTimeout = 5 * time.Second
	// responseHeaderTimeout bounds the wait for an upstream's response
	// headers once the request is written (the common edge default, as
	// nginx's proxy_read_timeout). A body may then stream for as long as it
	// takes; requests are never retried after this timeout, since the
	// upstream may be doing the work.
	responseHeaderTimeout = 60 * time.Second
	// idleConnTimeout is how long a pooled upstream connection may sit idle.
	idleConnTimeout = 90 * time.Second
	// maxIdleConnsPerHost keeps enough warm connections to one workload for
	// bursts without holding sockets open forever.
	maxIdleConnsPerHost = 64
	// maxIdleConns bounds the whole pool across all workloads.
	maxIdleConns = 1024
)

// gatewayHeader marks responses the gateway wrote itself, so a client (and a
// test) can tell them apart from an application's own error statuses.
const gatewayHeader = "X-Berth-Gateway"

// Proxy is the gateway's reverse proxy: an [http.Handler] that routes each
// request by its Host header to one of the healthy upstreams of the matching
// route, in turn.
//
// The zero value is not usable; call [NewProxy]. A Proxy serves an empty table
// (every host answers 404) until [Proxy.SetTable] is called. All methods are
// safe for concurrent use.
type Proxy struct {
	logger    *slog.Logger
	errLog    *log.Logger // ReverseProxy's own complaints, sent to logger
	transport *http.Transport
	buffers   *bufferPool

	// state holds the compiled table; requests load it without locking.
	state atomic.Pointer[compiled]
	// mu serialises SetTable so that round-robin counters carry over from
	// one table to the next.
	mu sync.Mutex
}

// compiled is an immutable route table prepared for lookup.
type compiled struct {
	table  routes.Table
	byHost map[string]*route
}

// route is one hostname's healthy upstreams and its round-robin counter.
type route struct {
	hostname string
	healthy  []routes.Upstream
	// restricted reports whether allow holds the only sources let in; an
	// empty allow list then lets no one in (every entry was invalid).
	restricted bool
	allow      []netip.Prefix
	// tls is the route's TLS mode when the gateway cannot serve it on its
	// plain HTTP listener; empty when it can (routes.TLSNone).
	tls string
	// next is shared with the route of the same hostname in later tables.
	next *atomic.Uint64
}

// allows reports whether a client at remoteAddr ("ip:port", as in
// http.Request.RemoteAddr) may use the route. Only the TCP peer counts: a
// forwarded header is the client's word and is never trusted here. An IPv4
// client on an IPv6 socket (::ffff:a.b.c.d) matches IPv4 prefixes.
func (rt *route) allows(remoteAddr string) bool {
	if !rt.restricted {
		return true
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range rt.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// NewProxy returns a Proxy with an empty route table that logs proxy errors to
// logger (nil discards them). Its upstream connections are pooled for the
// Proxy's lifetime.
func NewProxy(logger *slog.Logger) *Proxy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	p := &Proxy{
		logger:  logger,
		errLog:  slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		buffers: &bufferPool{},
		transport: &http.Transport{
			// Never route workload traffic through HTTP_PROXY.
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			ResponseHeaderTimeout: responseHeaderTimeout,
			IdleConnTimeout:       idleConnTimeout,
			MaxIdleConns:          maxIdleConns,
			MaxIdleConnsPerHost:   maxIdleConnsPerHost,
			ExpectContinueTimeout: 1 * time.Second,
			// Pass bodies through as the upstream encoded them; never let
			// the transport add gzip and decode it behind our back.
			DisableCompression: true,
		},
	}
	p.state.Store(&compiled{byHost: map[string]*route{}})
	return p
}

// SetTable atomically replaces the whole route table with t. Requests already
// routed finish against the table they started with; later requests see t.
// Hostnames are matched case-insensitively and without a trailing dot;
// upstreams that are unhealthy or whose Address is not "host:port" receive no
// traffic. A route's AllowSources restrict it to clients in those prefixes
// (an entry that is not a prefix is dropped and never widens the route); a
// TLSMode other than "none" is not served in plain HTTP. Both fail closed. A route's round-robin position survives the replacement. The Proxy
// keeps its own copy of t, so the caller may reuse it.
func (p *Proxy) SetTable(t routes.Table) {
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.state.Load()
	next := &compiled{table: cloneTable(t), byHost: make(map[string]*route, len(t.Routes))}
	for _, r := range next.table.Routes {
		host := normalizeHost(r.Hostname)
		if host == "" {
			p.logger.Warn("gateway: route without hostname ignored",
				"project", r.Project, "service", r.Service, "revision", t.Revision)
			continue
		}
		if _, dup := next.byHost[host]; dup {
			p.logger.Warn("gateway: duplicate hostname in route table, first route kept",
				"host", host, "revision", t.Revision)
			continue
		}
		rt := &route{hostname: host, restricted: len(r.AllowSources) > 0}
		for _, src := range r.AllowSources {
			pfx, err := netip.ParsePrefix(src)
			if err != nil {
				p.logger.Warn("gateway: allow_sources entry that is not a CIDR prefix ignored; the route stays restricted",
					"host", host, "allow_source", src, "error", err)
				continue
			}
			rt.allow = append(rt.allow, pfx.Masked())
		}
		if r.TLSMode != "" && r.TLSMode != routes.TLSNone {
			rt.tls = r.TLSMode
			p.logger.Warn("gateway: route needs TLS, which this gateway does not serve; it answers tls_unavailable",
				"host", host, "tls_mode", r.TLSMode, "revision", t.Revision)
		}
		for _, u := range r.Upstreams {
			if !u.Healthy {
				continue
			}
			if _, _, err := net.SplitHostPort(u.Address); err != nil {
				p.logger.Warn("gateway: upstream with invalid address ignored",
					"host", host, "workload_id", u.WorkloadID, "upstream", u.Address, "error", err)
				continue
			}
			rt.healthy = append(rt.healthy, u)
		}
		if old, ok := prev.byHost[host]; ok {
			rt.next = old.next
		} else {
			rt.next = new(atomic.Uint64)
		}
		next.byHost[host] = rt
	}
	p.state.Store(next)
}

// Table returns a copy of the route table last given to [Proxy.SetTable], or
// the zero Table before the first call.
func (p *Proxy) Table() routes.Table {
	return cloneTable(p.state.Load().table)
}

// ServeHTTP routes r to a healthy upstream of the route for its Host. It
// answers 404 (code no_route) for an unknown host, 403 (source_not_allowed)
// when the client's address is outside the route's allow_sources, 421
// (tls_unavailable) when the route's TLS mode is one the gateway does not
// serve, 503 (no_healthy_upstream) when the route has no healthy upstream,
// and 502 (bad_gateway) when no upstream could be reached; each of these
// carries the X-Berth-Gateway header. Anything an upstream answers, including
// its own errors, passes through unchanged and is streamed as it arrives.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := normalizeHost(r.Host)
	rt, ok := p.state.Load().byHost[host]
	if !ok {
		writeProblem(w, http.StatusNotFound, abierrors.NoRoute, "no-route",
			"no route for host", fmt.Sprintf("no service is routed at host %q", host))
		return
	}
	if !rt.allows(r.RemoteAddr) {
		writeProblem(w, http.StatusForbidden, abierrors.SourceNotAllowed, "source-not-allowed",
			"source not allowed", fmt.Sprintf("the service at host %q does not accept clients from this address", host))
		return
	}
	if rt.tls != "" {
		writeProblem(w, http.StatusMisdirectedRequest, abierrors.TLSUnavailable, "tls-unavailable",
			"tls unavailable", fmt.Sprintf("the service at host %q is routed with tls_mode %q, which this gateway does not serve", host, rt.tls))
		return
	}
	n := len(rt.healthy)
	if n == 0 {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, abierrors.NoHealthyUpstream, "no-healthy-upstream",
			"no healthy upstream", fmt.Sprintf("no workload of the service at host %q is healthy", host))
		return
	}
	start := rt.next.Add(1) - 1
	for i := range n {
		u := rt.healthy[(start+uint64(i))%uint64(n)]
		err := p.forward(w, r, u.Address)
		if err == nil {
			return
		}
		retry := i+1 < n && retryable(r, err)
		p.logError(r, host, u, err, retry)
		if !retry {
			break
		}
	}
	writeProblem(w, http.StatusBadGateway, abierrors.BadGateway, "bad-gateway",
		"bad gateway", fmt.Sprintf("no upstream of the service at host %q could be reached", host))
}

// forward proxies r to the upstream at addr. It returns the error of the
// round trip when no response came back, in which case nothing has been
// written to w but possibly a 1xx informational response.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, addr string) error {
	var failed error
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = addr
			pr.Out.Host = pr.In.Host // the application sees the host it is served at
			pr.SetXForwarded()
		},
		Transport:     p.transport,
		FlushInterval: -1, // stream every write of the upstream as it arrives
		BufferPool:    p.buffers,
		ErrorLog:      p.errLog,
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) {
			failed = err
		},
	}
	rp.ServeHTTP(w, r)
	return failed
}

// logError logs one failed attempt at an upstream: the host, the upstream and
// the error, never the request body or query.
func (p *Proxy) logError(r *http.Request, host string, u routes.Upstream, err error, retrying bool) {
	level := slog.LevelWarn
	msg := "gateway: upstream request failed"
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		level, msg = slog.LevelInfo, "gateway: client went away before the upstream answered"
	}
	p.logger.LogAttrs(r.Context(), level, msg,
		slog.String("host", host),
		slog.String("upstream", u.Address),
		slog.String("workload_id", u.WorkloadID),
		slog.String("method", r.Method),
		slog.Bool("retrying", retrying),
		slog.Any("error", err))
}

// retryable reports whether a request that failed with err may be sent to
// another upstream: the client is still there, the request is idempotent and
// has no body, and err says the upstream never took the request (the dial
// failed) or dropped the connection before answering.
func retryable(r *http.Request, err error) bool {
	if r.Context().Err() != nil {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return false
	}
	if r.ContentLength != 0 || (r.Body != nil && r.Body != http.NoBody) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// copyBufferSize is the size of the buffers response bodies are copied
// through, the size ReverseProxy would allocate for each request on its own.
const copyBufferSize = 32 << 10

// bufferPool recycles the copy buffers of [httputil.ReverseProxy] across
// requests. It implements [httputil.BufferPool].
type bufferPool struct{ pool sync.Pool }

// Get returns a buffer of copyBufferSize bytes.
func (b *bufferPool) Get() []byte {
	if buf, ok := b.pool.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, copyBufferSize)
}

// Put returns buf to the pool for reuse.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	buf = buf[:copyBufferSize]
	b.pool.Put(&buf)
}

// problem is an RFC 9457 problem document as the gateway writes it.
type problem struct {
	Title  string         `json:"title"`
	Status int            `json:"status"`
	Code   abierrors.Code `json:"code"`
	Detail string         `json:"detail"`
}

// writeProblem writes the gateway's own error response, marked with the
// X-Berth-Gateway header set to mark.
func writeProblem(w http.ResponseWriter, status int, code abierrors.Code, mark, title, detail string) {
	body, err := json.Marshal(problem{Title: title, Status: status, Code: code, Detail: detail})
	if err != nil { // plain strings and an int: cannot fail
		body = []byte(`{"title":"internal","status":500,"code":"internal"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set(gatewayHeader, mark)
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client is gone if this fails; nothing to do
}

// normalizeHost returns the routing key of a Host header or route hostname:
// lower case, without port, IPv6 brackets or a trailing dot.
func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// cloneTable returns a deep copy of t.
func cloneTable(t routes.Table) routes.Table {
	c := routes.Table{Revision: t.Revision}
	if t.Routes == nil {
		return c
	}
	c.Routes = make([]routes.Route, len(t.Routes))
	for i, r := range t.Routes {
		r.Upstreams = append([]routes.Upstream(nil), r.Upstreams...)
		c.Routes[i] = r
	}
	return c
}
