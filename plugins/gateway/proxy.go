package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/routes"
)

// Upstream transport defaults and limits (docs/plugins.md section 5.4).
// Upstreams are workloads on the cluster network, spoken to in plain HTTP/1.1.
const (
	// DefaultConnectTimeout bounds a TCP connect to one upstream when the
	// route sets no timeouts.connect_ms. A workload that does not accept
	// within it is skipped like a refused one: an idempotent request moves
	// on to the next upstream; when none is left the answer is 504.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultResponseHeaderTimeout bounds the wait for an upstream's
	// response headers once the request is written, when the route sets no
	// timeouts.response_header_ms (the common edge default, as nginx's
	// proxy_read_timeout). A body may then stream for as long as it takes;
	// requests are never retried after this timeout, since the upstream may
	// be doing the work. The answer is 504 gateway_timeout.
	DefaultResponseHeaderTimeout = 60 * time.Second
	// DefaultIdleTimeout is how long a pooled upstream connection may sit
	// idle when the route sets no timeouts.idle_ms.
	DefaultIdleTimeout = 90 * time.Second
	// maxIdleConnsPerHost keeps enough warm connections to one workload for
	// a few hundred concurrent clients without holding sockets forever.
	maxIdleConnsPerHost = 256
	// maxIdleConns bounds each transport's pool across all workloads.
	maxIdleConns = 2048
)

// gatewayHeader marks responses the gateway wrote itself, so a client (and a
// test) can tell them apart from an application's own error statuses.
const gatewayHeader = "X-Berth-Gateway"

// Proxy is the gateway's reverse proxy: an [http.Handler] that routes each
// request by its Host header to one of the healthy upstreams of the matching
// route, in turn.
//
// The zero value is not usable; call [NewProxy] or [NewProxyWithConfig]. A
// Proxy serves an empty table (every host answers 404) until
// [Proxy.SetTable] is called. All methods are safe for concurrent use.
type Proxy struct {
	logger  *slog.Logger
	errLog  *log.Logger // ReverseProxy's own complaints, sent to logger
	buffers *bufferPool
	obs     *observer
	ids     *requestIDs

	// state holds the compiled table; requests load it without locking.
	state atomic.Pointer[compiled]
	// mu serialises SetTable so that round-robin counters and transports
	// carry over from one table to the next.
	mu sync.Mutex
	// transports holds one pooled transport per distinct (resolved)
	// timeouts of the routes in the current table. mu must be held.
	transports map[routes.Timeouts]*http.Transport
	// httpsPort is the port redirects to https:// name; 443 is left out.
	httpsPort int

	// tlsLogged holds the server names whose refused handshakes were
	// logged since the last SetTable; tlsLogFull reports whether the
	// overflow line was. tlsLogMu must be held.
	tlsLogMu   sync.Mutex
	tlsLogged  map[string]struct{}
	tlsLogFull bool
}

// compiled is an immutable route table prepared for lookup.
type compiled struct {
	table  routes.Table
	byHost map[string]*vhost
	// certs are the table's parsed certificates by name.
	certs certificates
	// challenges are the HTTP-01 answers by host and token.
	challenges map[[2]string]string
}

// vhost is one hostname's routes, in precedence order
// ([routes.CompareRoutes]), and the TLS mode they share.
type vhost struct {
	// mode is the hostname's TLS mode; "" for routes.TLSNone.
	mode   string
	routes []*route
}

// match returns the first route of v that r meets, or nil. A hostname
// with one route without match conditions (the common case) costs one
// comparison; matching allocates nothing unless r's path has dot
// segments or doubled slashes ([routes.CleanPath]).
func (v *vhost) match(r *http.Request) *route {
	if len(v.routes) == 1 && v.routes[0].plain {
		return v.routes[0]
	}
	for _, rt := range v.routes {
		if rt.matches(r) {
			return rt
		}
	}
	return nil
}

// headerMatch is a route's header condition with its name in the canonical
// form net/http keys http.Header by.
type headerMatch struct {
	key, value string
}

// route is one route of a hostname: its match conditions, its healthy
// upstreams and its round-robin counter.
type route struct {
	hostname string
	// plain reports whether the route has no match conditions.
	plain bool
	// prefix, strip and headers are the route's path_prefix, strip_prefix
	// and header matches (docs/routes.md section 3).
	prefix  string
	strip   bool
	headers []headerMatch
	// key is the route's identity across tables: hostname and match key.
	key     string
	service string // "project/service", the metrics' service label
	healthy []*upstream
	// restricted reports whether allow holds the only sources let in; an
	// empty allow list then lets no one in (every entry was invalid).
	restricted bool
	allow      []netip.Prefix
	// mode is the route's TLS mode; "" for routes.TLSNone.
	mode string
	// redirect and hsts are the route's https_redirect and its HSTS
	// header value ("" for none).
	redirect bool
	hsts     string
	// connect bounds a passthrough dial to one upstream.
	connect time.Duration
	// next is shared with the route of the same hostname and match
	// conditions in later tables.
	next *atomic.Uint64
	// durations and noUpstreamRequests are the route's metric series
	// (requests no upstream answered), looked up on first use.
	durations          seriesCache[prometheus.Observer]
	noUpstreamRequests seriesCache[prometheus.Counter]
}

// upstream is one healthy upstream of a route with the reverse proxy that
// forwards to it, built once per table rather than once per request.
type upstream struct {
	routes.Upstream
	rp *httputil.ReverseProxy
	// requests are the upstream's request counters, looked up on first
	// use.
	requests seriesCache[prometheus.Counter]
}

// matches reports whether r meets every match condition of rt.
func (rt *route) matches(r *http.Request) bool {
	if rt.prefix != "" && !routes.PathMatches(rt.prefix, r.URL.Path) {
		return false
	}
	for _, h := range rt.headers {
		found := false
		for _, v := range r.Header[h.key] {
			if v == h.value {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
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

// Config configures a Proxy. Its zero value works: no logs, metrics or
// access log.
type Config struct {
	// Logger receives the proxy's warnings (failed upstreams, ignored
	// routes); nil discards them.
	Logger *slog.Logger
	// Metrics, when not nil, gets the gateway's metric families
	// (docs/plugins.md section 5.5); registering them twice panics.
	Metrics prometheus.Registerer
	// AccessLog, when not nil, receives one JSON line per request
	// (docs/plugins.md section 5.5). The proxy writes through a buffer it
	// flushes every second and on [Proxy.Close]; the writer need not be
	// safe for concurrent use.
	AccessLog io.Writer
	// HTTPSPort is the port of the gateway's TLS listener as clients reach
	// it, named in the Location of HTTPS redirects; zero means 443, which
	// a Location leaves out (docs/plugins.md section 5.6).
	HTTPSPort int
}

// NewProxy returns a Proxy with an empty route table that logs proxy errors to
// logger (nil discards them), without metrics or access log.
func NewProxy(logger *slog.Logger) *Proxy {
	return NewProxyWithConfig(Config{Logger: logger})
}

// NewProxyWithConfig returns a Proxy with an empty route table. Its upstream
// connections are pooled for the Proxy's lifetime; call [Proxy.Close] to
// flush the access log and stop its flusher.
func NewProxyWithConfig(cfg Config) *Proxy {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		logger:     logger,
		errLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		buffers:    &bufferPool{},
		ids:        newRequestIDs(),
		transports: map[routes.Timeouts]*http.Transport{},
		httpsPort:  cfg.HTTPSPort,
		tlsLogged:  map[string]struct{}{},
	}
	p.obs = newObserver(cfg.Metrics, cfg.AccessLog, logger)
	p.state.Store(&compiled{byHost: map[string]*vhost{}})
	if p.httpsPort == 0 {
		p.httpsPort = 443
	}
	return p
}

// Close flushes the access log and stops its flusher. The Proxy still serves
// afterwards, writing the access log synchronously. Idempotent.
func (p *Proxy) Close() error { return p.obs.close() }

// resolve fills in a route's zero timeouts with the defaults.
func resolve(t routes.Timeouts) routes.Timeouts {
	if t.ConnectMS == 0 {
		t.ConnectMS = DefaultConnectTimeout.Milliseconds()
	}
	if t.ResponseHeaderMS == 0 {
		t.ResponseHeaderMS = DefaultResponseHeaderTimeout.Milliseconds()
	}
	if t.IdleMS == 0 {
		t.IdleMS = DefaultIdleTimeout.Milliseconds()
	}
	return t
}

// transportLocked returns the pooled transport for resolved timeouts t,
// creating it on first use. mu must be held.
func (p *Proxy) transportLocked(t routes.Timeouts) *http.Transport {
	if tr, ok := p.transports[t]; ok {
		return tr
	}
	dialer := &net.Dialer{Timeout: time.Duration(t.ConnectMS) * time.Millisecond, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		// Never route workload traffic through HTTP_PROXY.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ResponseHeaderTimeout: time.Duration(t.ResponseHeaderMS) * time.Millisecond,
		IdleConnTimeout:       time.Duration(t.IdleMS) * time.Millisecond,
		MaxIdleConns:          maxIdleConns,
		MaxIdleConnsPerHost:   maxIdleConnsPerHost,
		ExpectContinueTimeout: 1 * time.Second,
		// Pass bodies through as the upstream encoded them; never let
		// the transport add gzip and decode it behind our back.
		DisableCompression: true,
		// Upstreams speak HTTP/1.1, whatever the client spoke.
		ForceAttemptHTTP2: false,
	}
	p.transports[t] = tr
	return tr
}

// bufferedFlush is the longest a written part of a response of known length
// whose body is not complete yet waits in the gateway's buffers before it is
// flushed to the client (see [recorder.Write]).
const bufferedFlush = 100 * time.Millisecond

// newReverseProxy returns the reverse proxy that forwards to addr over tr;
// with strip set, requests go on without that path prefix
// ([routes.StripPath]). A failed round trip is recorded in the *recorder it
// writes to, so the caller can retry or answer; nothing reaches the client
// then.
func (p *Proxy) newReverseProxy(addr, hostname string, tr http.RoundTripper, stream bool, strip string) *httputil.ReverseProxy {
	// Header values every request to the route shares: the transport
	// only reads them.
	hostVal, httpVal, httpsVal := []string{hostname}, []string{"http"}, []string{"https"}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = addr
			pr.Out.Host = pr.In.Host // the application sees the host it is served at
			if strip != "" {
				stripPrefix(pr.Out.URL, strip)
			}
			setXForwarded(pr, hostVal, httpVal, httpsVal)
		},
		Transport: tr,
		// ReverseProxy flushes every write of text/event-stream and of
		// responses of unknown length by itself. Others are not flushed
		// here: a response that arrives whole goes out in one write at
		// its end, and the recorder flushes a body of known length that
		// is still incomplete after a write at most bufferedFlush later,
		// so a slow answer with a Content-Length still trickles.
		FlushInterval: 0,
		BufferPool:    p.buffers,
		ErrorLog:      p.errLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if rec, ok := w.(*recorder); ok {
				rec.err = err
			}
		},
		// A 101 is written on the hijacked connection, never through the
		// recorder: note it for the access log and the metrics.
		ModifyResponse: func(res *http.Response) error {
			if res.StatusCode == http.StatusSwitchingProtocols {
				if rec, ok := res.Request.Context().Value(upgradeKey{}).(*recorder); ok {
					rec.status = res.StatusCode
				}
			}
			return nil
		},
	}
	if stream {
		rp.FlushInterval = -1 // the route asks for every write at once
	}
	return rp
}

// stripPrefix removes prefix, which the route matched, from u's path. The
// escaped form is kept when u has one that starts with prefix too (so an
// encoded "%2F" further on stays encoded); otherwise u is re-encoded from
// its decoded path.
func stripPrefix(u *url.URL, prefix string) {
	raw := u.RawPath
	u.Path = routes.StripPath(prefix, u.Path)
	u.RawPath = ""
	if raw != "" && routes.PathMatches(prefix, raw) && routes.CleanPath(raw) == raw {
		if rest := raw[len(prefix):]; rest != "" {
			u.RawPath = rest
		}
	}
}

// setXForwarded sets the X-Forwarded-For, -Host and -Proto headers of
// pr.Out as [httputil.ProxyRequest.SetXForwarded] does (ReverseProxy has
// already dropped any the client sent), sharing hostVal (the route's
// hostname) when the client's Host is exactly it, and httpVal or httpsVal,
// instead of allocating them for every request.
func setXForwarded(pr *httputil.ProxyRequest, hostVal, httpVal, httpsVal []string) {
	h := pr.Out.Header
	if clientIP, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		h["X-Forwarded-For"] = []string{clientIP}
	} else {
		delete(h, "X-Forwarded-For")
	}
	if pr.In.Host == hostVal[0] {
		h["X-Forwarded-Host"] = hostVal
	} else {
		h["X-Forwarded-Host"] = []string{pr.In.Host}
	}
	if pr.In.TLS == nil {
		h["X-Forwarded-Proto"] = httpVal
	} else {
		h["X-Forwarded-Proto"] = httpsVal
	}
}

// SetTable atomically replaces the whole route table with t. Requests already
// routed finish against the table they started with; later requests see t.
// Hostnames are matched case-insensitively and without a trailing dot, then
// the routes of the hostname in precedence order ([routes.CompareRoutes])
// by their path prefix and headers (docs/routes.md section 3); a route
// repeating another's hostname and conditions, or whose TLS mode differs
// from the hostname's first route, is logged and left out;
// upstreams that are unhealthy or whose Address is not "host:port" receive no
// traffic. A route's AllowSources restrict it to clients in those prefixes
// (an entry that is not a prefix is dropped and never widens the route); a
// TLSMode other than "none" is not served in plain HTTP. Both fail closed.
// The table's certificates and HTTP-01 answers are swapped with the routes,
// so a TLS handshake sees one table or the other (docs/plugins.md section
// 5.6). A route's round-robin position survives the replacement. The Proxy
// keeps its own copy of t, so the caller may reuse it.
func (p *Proxy) SetTable(t routes.Table) {
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.state.Load()
	prevRoutes := make(map[string]*route, len(prev.table.Routes))
	for _, vh := range prev.byHost {
		for _, rt := range vh.routes {
			prevRoutes[rt.key] = rt
		}
	}
	next := &compiled{table: cloneTable(t), byHost: make(map[string]*vhost, len(t.Routes)),
		certs: p.compileCertificates(t), challenges: make(map[[2]string]string, len(t.Challenges))}
	for _, c := range t.Challenges {
		next.challenges[[2]string{normalizeHost(c.Host), c.Token}] = c.KeyAuth
	}
	used := map[routes.Timeouts]bool{}
	// Precedence order, whatever order t came in (a table from berthd is
	// normalized already).
	ordered := make([]*routes.Route, len(next.table.Routes))
	for i := range next.table.Routes {
		ordered[i] = &next.table.Routes[i]
	}
	slices.SortStableFunc(ordered, func(a, b *routes.Route) int {
		return cmp.Or(strings.Compare(normalizeHost(a.Hostname), normalizeHost(b.Hostname)), routes.CompareRoutes(sortedCopy(a), sortedCopy(b)))
	})
	keys := make(map[string]bool, len(ordered))
	for _, r := range ordered {
		host := normalizeHost(r.Hostname)
		if host == "" {
			p.logger.Warn("gateway: route without hostname ignored",
				"project", r.Project, "service", r.Service, "revision", t.Revision)
			continue
		}
		key := host + "\x00" + r.MatchKey()
		if keys[key] {
			p.logger.Warn("gateway: route repeating another's hostname and match conditions ignored, first route kept",
				"host", host, "path_prefix", r.PathPrefix, "revision", t.Revision)
			continue
		}
		mode := r.TLSMode
		if mode == routes.TLSNone {
			mode = ""
		}
		vh := next.byHost[host]
		if vh != nil && vh.mode != mode {
			p.logger.Warn("gateway: route whose tls_mode differs from its hostname's first route ignored",
				"host", host, "tls_mode", r.TLSMode, "revision", t.Revision)
			continue
		}
		keys[key] = true
		rt := &route{hostname: host, service: r.Project + "/" + r.Service, restricted: len(r.AllowSources) > 0,
			key: key, plain: r.Conditions() == 0, prefix: r.PathPrefix}
		if r.PathPrefix != "" && r.StripPrefix {
			rt.strip = true
		}
		for _, h := range r.Headers {
			rt.headers = append(rt.headers, headerMatch{key: http.CanonicalHeaderKey(h.Name), value: h.Value})
		}
		tr := p.transportLocked(resolve(r.Timeouts))
		used[resolve(r.Timeouts)] = true
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
			rt.mode = r.TLSMode
			rt.redirect = r.HTTPSRedirect
			if r.HSTSMaxAgeS > 0 && routes.TerminatesTLS(r.TLSMode) {
				rt.hsts = "max-age=" + strconv.FormatInt(r.HSTSMaxAgeS, 10)
			}
			if routes.TerminatesTLS(r.TLSMode) && next.certificate(host) == nil {
				p.logger.Info("gateway: route has no certificate yet; TLS handshakes for it fail",
					"host", host, "tls_mode", r.TLSMode, "revision", t.Revision)
			}
		}
		rt.connect = time.Duration(resolve(r.Timeouts).ConnectMS) * time.Millisecond
		for _, u := range r.Upstreams {
			if !u.Healthy {
				continue
			}
			if _, _, err := net.SplitHostPort(u.Address); err != nil {
				p.logger.Warn("gateway: upstream with invalid address ignored",
					"host", host, "workload_id", u.WorkloadID, "upstream", u.Address, "error", err)
				continue
			}
			strip := ""
			if rt.strip {
				strip = rt.prefix
			}
			rt.healthy = append(rt.healthy, &upstream{Upstream: u, rp: p.newReverseProxy(u.Address, r.Hostname, tr, r.Stream, strip)})
		}
		if old, ok := prevRoutes[key]; ok {
			rt.next = old.next
		} else {
			rt.next = new(atomic.Uint64)
		}
		if vh == nil {
			vh = &vhost{mode: rt.mode}
			next.byHost[host] = vh
		}
		vh.routes = append(vh.routes, rt)
	}
	p.state.Store(next)
	p.tlsLogMu.Lock()
	clear(p.tlsLogged)
	p.tlsLogFull = false
	p.tlsLogMu.Unlock()
	// Transports no route uses any more let go of their connections; the
	// requests still running on them finish first.
	for k, tr := range p.transports {
		if !used[k] {
			delete(p.transports, k)
			tr.CloseIdleConnections()
		}
	}
	p.obs.tableChanged(next)
}

// sortedCopy returns r, or a copy of r whose header matches are sorted by
// [routes.CompareHeaders] when they are not: [routes.CompareRoutes]
// compares header sets as a normalized table holds them.
func sortedCopy(r *routes.Route) *routes.Route {
	if slices.IsSortedFunc(r.Headers, routes.CompareHeaders) {
		return r
	}
	c := *r
	c.Headers = slices.Clone(r.Headers)
	slices.SortFunc(c.Headers, routes.CompareHeaders)
	return &c
}

// Table returns a copy of the route table last given to [Proxy.SetTable], or
// the zero Table before the first call.
func (p *Proxy) Table() routes.Table {
	return cloneTable(p.state.Load().table)
}

// ServeHTTP routes r to a healthy upstream of the route for its Host (its
// own, else a wildcard route one label deep) whose match conditions r
// meets, the first in precedence order. On the plain listener an
// HTTP-01 request the table answers gets its key authorization first. It
// answers 404 (code no_route) for an unknown host or when no route of the
// host matches r's path and headers, 403 (source_not_allowed)
// when the client's address is outside the route's allow_sources, 308 to
// https:// for a route with https_redirect once it can be served so, 421
// (tls_unavailable) for a TLS route in plain HTTP otherwise or for a
// passthrough route over TLS, 503 (no_healthy_upstream) when the route has no healthy upstream,
// 504 (gateway_timeout) when the last upstream tried timed out (connect or
// response headers), and 502 (bad_gateway) when it refused the connection or
// broke it before answering; each of these carries the X-Berth-Gateway
// header. Anything an upstream answers, including its own errors, passes
// through unchanged. Every request carries an X-Request-Id to the upstream
// and back: the client's when it sent a usable one, a new one otherwise
// (docs/plugins.md section 5.5).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := getRecorder(w)
	defer putRecorder(rec)
	rec.id, rec.idVal = p.ids.forRequest(r)
	rec.start = time.Now()
	p.serve(rec, r)
	p.obs.done(rec, r)
}

func (p *Proxy) serve(w *recorder, r *http.Request) {
	host := normalizeHost(r.Host)
	st := p.state.Load()
	if r.TLS == nil && len(st.challenges) > 0 && strings.HasPrefix(r.URL.Path, acmeChallengePath) {
		if keyAuth, ok := st.challenges[[2]string{host, r.URL.Path[len(acmeChallengePath):]}]; ok && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			h := w.Header()
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", strconv.Itoa(len(keyAuth)))
			h.Set("Cache-Control", "no-store")
			h.Set(gatewayHeader, "acme-challenge")
			w.WriteHeader(http.StatusOK)
			if r.Method == http.MethodGet {
				_, _ = io.WriteString(w, keyAuth)
			}
			return
		}
	}
	vh := st.lookup(host)
	if vh == nil {
		writeProblem(w, http.StatusNotFound, abierrors.NoRoute, "no-route",
			"no route for host", fmt.Sprintf("no service is routed at host %q", host))
		return
	}
	rt := vh.match(r)
	if rt == nil {
		writeProblem(w, http.StatusNotFound, abierrors.NoRoute, "no-route",
			"no route for request", fmt.Sprintf("no route of host %q matches the request's path and headers", host))
		return
	}
	w.service, w.route = rt.service, rt
	if !rt.allows(r.RemoteAddr) {
		writeProblem(w, http.StatusForbidden, abierrors.SourceNotAllowed, "source-not-allowed",
			"source not allowed", fmt.Sprintf("the service at host %q does not accept clients from this address", host))
		return
	}
	if rt.mode != "" {
		switch {
		case r.TLS == nil && rt.redirect && (rt.mode == routes.TLSPassthrough || st.certificate(host) != nil):
			w.Header().Set("Location", p.httpsURL(host, r))
			w.Header().Set(gatewayHeader, "https-redirect")
			w.WriteHeader(http.StatusPermanentRedirect)
			return
		case r.TLS == nil:
			writeProblem(w, http.StatusMisdirectedRequest, abierrors.TLSUnavailable, "tls-unavailable",
				"tls unavailable", fmt.Sprintf("the service at host %q is served over HTTPS only (tls_mode %q)", host, rt.mode))
			return
		case rt.mode == routes.TLSPassthrough:
			writeProblem(w, http.StatusMisdirectedRequest, abierrors.TLSUnavailable, "tls-unavailable",
				"tls unavailable", fmt.Sprintf("the service at host %q terminates its own TLS; connect with that server name", host))
			return
		}
		if rt.hsts != "" {
			w.Header().Set("Strict-Transport-Security", rt.hsts)
		}
	}
	n := len(rt.healthy)
	if n == 0 {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, abierrors.NoHealthyUpstream, "no-healthy-upstream",
			"no healthy upstream", fmt.Sprintf("no workload of the service at host %q is healthy", host))
		return
	}
	if r.Header.Get("Upgrade") != "" {
		r = r.WithContext(context.WithValue(r.Context(), upgradeKey{}, w))
	}
	tried, err := p.attempt(w, r, host, rt, nil)
	if err != nil && retryable(r, err) {
		// The route table may have changed since this request read it: a rollout withdraws a
		// workload from the table before its node stops it, and a request that picked the old
		// table just before the swap finds the workload gone. It is tried once more on the
		// upstreams the current table names that it has not tried (never sent: see retryable).
		if now := p.state.Load(); now != st {
			if vh := now.lookup(host); vh != nil {
				if rt2 := vh.match(r); rt2 != nil && len(rt2.healthy) > 0 {
					w.retries++
					w.service, w.route = rt2.service, rt2
					_, err = p.attempt(w, r, host, rt2, tried)
				}
			}
		}
	}
	if err == nil {
		return
	}
	if timedOut(err) {
		writeProblem(w, http.StatusGatewayTimeout, abierrors.GatewayTimeout, "gateway-timeout",
			"gateway timeout", fmt.Sprintf("the upstream of the service at host %q did not answer in time", host))
		return
	}
	writeProblem(w, http.StatusBadGateway, abierrors.BadGateway, "bad-gateway",
		"bad gateway", fmt.Sprintf("no upstream of the service at host %q could be reached", host))
}

// attempt sends r to the healthy upstreams of rt in round-robin order, skipping those in
// skip (addresses already tried), moving to the next only while the failure is retryable. It
// returns the addresses it tried, and nil once an upstream answered, else the last error.
func (p *Proxy) attempt(w *recorder, r *http.Request, host string, rt *route, skip []string) ([]string, error) {
	n := len(rt.healthy)
	start := rt.next.Add(1) - 1
	err := error(errNoUpstreamLeft)
	tried := skip // grows only on a failure: a request answered at once allocates nothing here
	for i := range n {
		u := rt.healthy[(start+uint64(i))%uint64(n)]
		if slices.Contains(skip, u.Address) {
			continue
		}
		if len(tried) > len(skip) {
			w.retries++
		}
		w.upstream, w.up, w.err = u.Address, u, nil
		u.rp.ServeHTTP(w, r)
		if err = w.err; err == nil {
			return tried, nil
		}
		tried = append(tried, u.Address)
		w.upstreamErrors++
		p.obs.upstreamError(rt.service, u.Address, err)
		retry := i+1 < n && retryable(r, err)
		p.logError(r, host, u.Upstream, err, retry)
		if !retry {
			break
		}
	}
	return tried, err
}

// errNoUpstreamLeft is attempt's error when every healthy upstream was tried already.
var errNoUpstreamLeft = errors.New("gateway: every upstream of the route was tried")

// acmeChallengePath is the prefix of ACME HTTP-01 requests (RFC 8555
// section 8.3).
const acmeChallengePath = "/.well-known/acme-challenge/"

// httpsURL is the https:// URL of r at host on the gateway's TLS port, with
// r's path and query.
func (p *Proxy) httpsURL(host string, r *http.Request) string {
	if p.httpsPort != 443 {
		host = net.JoinHostPort(host, strconv.Itoa(p.httpsPort))
	}
	return "https://" + host + r.URL.RequestURI()
}

// upgradeKey carries the *recorder of an upgrade request to ModifyResponse.
type upgradeKey struct{}

// timedOut reports whether err, a failed round trip, is a timeout of the
// gateway's own (connect or response headers) rather than a refusal, a
// broken connection or the client going away.
func timedOut(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
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
		return true // refused, unreachable, or the connect timed out: never sent
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// copyBufferSize is the size of the buffers response bodies are copied
// through, the size ReverseProxy would allocate for each request on its own.
const copyBufferSize = 32 << 10

// bufferPool recycles the copy buffers of [httputil.ReverseProxy] across
// requests. It implements [httputil.BufferPool]. The pool holds pointers to
// the buffers' arrays, so that neither Get nor Put allocates.
type bufferPool struct{ pool sync.Pool }

// Get returns a buffer of copyBufferSize bytes.
func (b *bufferPool) Get() []byte {
	if buf, ok := b.pool.Get().(*[copyBufferSize]byte); ok {
		return buf[:]
	}
	return make([]byte, copyBufferSize)
}

// Put returns buf, one that Get returned, to the pool for reuse.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	b.pool.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
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
	if strings.IndexByte(h, ':') >= 0 { // a port or an IPv6 address
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			h = h[1 : len(h)-1]
		}
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// cloneTable returns a deep copy of t.
func cloneTable(t routes.Table) routes.Table {
	c := routes.Table{Revision: t.Revision,
		Challenges: append([]routes.Challenge(nil), t.Challenges...),
		Excluded:   append([]routes.Exclusion(nil), t.Excluded...)}
	for _, cert := range t.Certificates {
		cert.Names = append([]string(nil), cert.Names...)
		c.Certificates = append(c.Certificates, cert)
	}
	if t.Routes == nil {
		return c
	}
	c.Routes = make([]routes.Route, len(t.Routes))
	for i, r := range t.Routes {
		r.Upstreams = append([]routes.Upstream(nil), r.Upstreams...)
		r.AllowSources = append([]string(nil), r.AllowSources...)
		r.Headers = append([]routes.HeaderMatch(nil), r.Headers...)
		c.Routes[i] = r
	}
	return c
}
