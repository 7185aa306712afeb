// Package ui owns the web dashboard berthd serves under /ui/: server-rendered pages, login
// sessions in a cookie, CSRF tokens and the live Server-Sent Events streams (docs/ui.md).
//
// The dashboard is a client of the API, not a second code path: every page reads, and every
// action writes, through the API's own handler in process ([sdk/client] over [inProcess]),
// carrying the logged-in user's bearer, so scopes, admission and Idempotency-Keys are the API's.
package ui

import (
	"context"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

//go:embed assets templates
var embedded embed.FS

// Config configures a [Handler]. The zero value of every field but API works.
type Config struct {
	// API is the API's HTTP handler (core/api's server); every read and action of the
	// dashboard is a request to it. Required.
	API http.Handler
	// Wake, when set, returns a channel that receives after a change to the state the pages
	// show, closed or not before ctx ends; each open live stream re-renders on a receive.
	// nil: each open stream re-renders every StreamInterval instead.
	Wake func(ctx context.Context) <-chan struct{}
	// StreamInterval is how often an open live stream re-renders when Wake is nil, and how
	// often it sends a keep-alive comment otherwise (a workload's live log too, which follows
	// again five intervals after its follow ended); zero means 2 s.
	StreamInterval time.Duration
	// StreamMaxAge ends a live stream after this long (the browser reconnects), so no stream
	// outlives a revoked session by more than it; zero means 10 minutes.
	StreamMaxAge time.Duration
	// Generation, when set, returns a number that changes after every change to the state the
	// pages show (the same collections Wake follows); the overview, services and nodes data of a
	// session is then read once per change and reused until the number moves or the data is
	// CacheMaxAge old. nil: every render reads through the API.
	Generation func() uint64
	// CacheMaxAge is how long a cached page's data is used at most while Generation stands
	// still (the store records no write for a node session's last frame); zero means 5 s.
	CacheMaxAge time.Duration
	// SessionTTL is the lifetime of a password login's session; zero means 12 hours.
	SessionTTL time.Duration
	// Metrics registers the dashboard's metrics (berth_ui_*); nil registers them nowhere.
	Metrics prometheus.Registerer
	// Logger receives the dashboard's logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler serves the dashboard. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
	// api is the transport every sdk/client call of the dashboard goes through.
	api   http.RoundTripper
	m     metrics
	cache *liveCache
	// bufs pools the buffers pages render into (render.go).
	bufs sync.Pool
}

// metrics are what an operator watches of the dashboard.
type metrics struct {
	streams prometheus.Gauge
	logins  *prometheus.CounterVec
	csrf    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_ui_streams_open",
			Help: "Live dashboard streams (Server-Sent Events) open now."}),
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_ui_logins_total",
			Help: "Dashboard logins by result: ok, failed, throttled, unavailable."}, []string{"result"}),
		csrf: prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_ui_csrf_refusals_total",
			Help: "Dashboard form posts refused for a missing or wrong CSRF token."}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.logins, m.csrf)
	}
	return m
}

// New returns the dashboard handler over cfg.API. It parses the embedded templates and
// panics if they do not parse (a build defect, caught by every test).
func New(cfg Config) *Handler {
	if cfg.API == nil {
		panic("ui: Config.API is required")
	}
	if cfg.StreamInterval <= 0 {
		cfg.StreamInterval = 2 * time.Second
	}
	if cfg.StreamMaxAge <= 0 {
		cfg.StreamMaxAge = 10 * time.Minute
	}
	if cfg.CacheMaxAge <= 0 {
		cfg.CacheMaxAge = 5 * time.Second
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, log: cfg.Logger.With("component", "ui"), api: inProcess{api: cfg.API}, m: newMetrics(cfg.Metrics)}
	h.cache = &liveCache{gen: cfg.Generation, maxAge: cfg.CacheMaxAge, now: cfg.Now, entries: map[[32]byte]*cacheEntry{}}
	h.pages = parsePages()
	h.routes()
	return h
}

// Owns reports whether path is the dashboard's (so the server routes it here).
func Owns(path string) bool {
	return path == "/ui" || len(path) >= len(Prefix) && path[:len(Prefix)] == Prefix
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	static, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic("ui: embedded assets: " + err.Error())
	}
	m.Handle("GET /ui/assets/", http.StripPrefix("/ui/assets/", assetServer(static)))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, Prefix, http.StatusSeeOther) })
	m.HandleFunc("GET /ui/login", h.loginPage)
	m.HandleFunc("POST /ui/login", h.login)
	m.HandleFunc("POST /ui/logout", h.authed(h.logout))
	m.HandleFunc("GET /ui/{$}", h.authed(h.overview))
	m.HandleFunc("GET /ui/services", h.authed(h.servicesPage))
	m.HandleFunc("GET /ui/deploy", h.authed(h.deployPage))
	m.HandleFunc("POST /ui/deploy", h.authed(h.deploy))
	m.HandleFunc("GET /ui/services/{project}/{name}", h.authed(h.servicePage))
	m.HandleFunc("GET /ui/services/{project}/{name}/undo", h.authed(h.undoPreview))
	m.HandleFunc("POST /ui/services/{project}/{name}/undo", h.authed(h.undo))
	m.HandleFunc("POST /ui/services/{project}/{name}/restart", h.authed(h.restart))
	m.HandleFunc("POST /ui/services/{project}/{name}/scale", h.authed(h.scale))
	m.HandleFunc("GET /ui/services/{project}/{name}/promote/{tag}", h.authed(h.promotePage))
	m.HandleFunc("POST /ui/services/{project}/{name}/promote/{tag}", h.authed(h.promote))
	m.HandleFunc("GET /ui/nodes", h.authed(h.nodesPage))
	m.HandleFunc("GET /ui/nodes/{id}", h.authed(h.nodePage))
	m.HandleFunc("GET /ui/nodes/{id}/metrics", h.authed(h.nodeMetrics))
	m.HandleFunc("GET /ui/workloads", h.authed(h.workloadsPage))
	m.HandleFunc("GET /ui/workloads/{id}", h.authed(h.workloadPage))
	m.HandleFunc("GET /ui/operations", h.authed(h.operationsPage))
	m.HandleFunc("GET /ui/changelog", h.authed(h.changelogPage))
	m.HandleFunc("GET /ui/domains", h.authed(h.domainsPage))
	m.HandleFunc("GET /ui/registry", h.authed(h.registryPage))
	m.HandleFunc("GET /ui/secrets", h.authed(h.secretsPage))
	m.HandleFunc("GET /ui/jobs", h.authed(h.jobsPage))
	m.HandleFunc("GET /ui/access", h.authed(h.accessPage))
	m.HandleFunc("GET /ui/access/tokens/new", h.authed(h.newTokenPage))
	m.HandleFunc("POST /ui/access/tokens", h.authed(h.createToken))
	m.HandleFunc("GET /ui/access/tokens/{name}/revoke", h.authed(h.revokeTokenPage))
	m.HandleFunc("POST /ui/access/tokens/{name}/revoke", h.authed(h.revokeToken))
	m.HandleFunc("GET /ui/access/users/new", h.authed(h.newUserPage))
	m.HandleFunc("POST /ui/access/users", h.authed(h.createUser))
	m.HandleFunc("GET /ui/access/users/{name}/credential", h.authed(h.credentialPage))
	m.HandleFunc("POST /ui/access/users/{name}/credential", h.authed(h.changeCredential))
	m.HandleFunc("GET /ui/plugins", h.authed(h.pluginsPage))
	m.HandleFunc("GET /ui/backups", h.authed(h.backupsPage))
	m.HandleFunc("GET /ui/backups/{project}/{id}/restore", h.authed(h.restorePage))
	m.HandleFunc("POST /ui/backups/{project}/{id}/restore", h.authed(h.restore))
	m.HandleFunc("GET /ui/stream/{page}", h.authed(h.stream))
	m.HandleFunc("GET /ui/stream/logs/{id}", h.authed(h.logStream))
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		h.renderError(w, r, http.StatusNotFound, "There is no such page.")
	})
	h.mux = m
}

// ServeHTTP serves a dashboard request: security headers on every answer, a CSRF check on
// every POST, then the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "same-origin")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
	hdr.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.TLS != nil {
		hdr.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if r.Method == http.MethodPost && !h.csrfOK(w, r) {
		h.m.csrf.Inc()
		h.log.Warn("refused a form without a valid CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
		h.renderError(w, r, http.StatusForbidden, "The form's security token is missing or stale. Reload the page and try again.")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// ContentSecurityPolicy is the policy of every dashboard answer: only this origin, no inline
// script or style, no eval, no framing, forms only to this origin.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"

// assetServer serves the embedded assets with a cache lifetime of an hour (they change only
// with the binary) and no directory listings.
func assetServer(static fs.FS) http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || r.URL.Path[len(r.URL.Path)-1] == '/' {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "private, max-age=3600")
		files.ServeHTTP(w, r)
	})
}
