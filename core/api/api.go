// Package api serves Berth's HTTP API under /api/v1 with echo: JSON-only bounded
// bodies, bearer tokens with scopes, and problem+json errors (docs/api.md).
package api

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/machines"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/releases"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
)

// DefaultMaxBodyBytes bounds a JSON request body when Config.MaxBodyBytes is zero: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// Hinter is told that state beyond one service changed (a node enrolled, retired, lost or
// removed, a secret or a route compiler binding written), so a full reconcile pass runs soon. A
// service's changes need no hint: each write carries its reconcile request, which wakes the
// reconciler through the store (docs/reconciliation.md section 6).
type Hinter interface{ Hint(reason string) }

// Config wires the API. Every pointer field is required except Metrics,
// Sessions and Ready.
type Config struct {
	Catalog *services.Catalog
	Nodes   *nodes.Registry
	// Clusters serves /api/v1/clusters and names the cluster of join tokens; nil leaves the
	// routes out and every node in the default cluster.
	Clusters *clusters.Registry
	// RelaysRotated, when not nil, is called after a cluster's relay credential was rotated, so
	// the relay sessions this process serves under the old generation end at once.
	RelaysRotated func(cluster string)
	Bundles       *bundles.Store
	// ImageReleases records and reserves registry tags (docs/registry.md
	// section 7); nil serves no release routes.
	ImageReleases *registry.Releases
	Tokens        *identity.Tokens
	Hinter        Hinter
	// Events serves GET /api/v1/events; nil leaves the route out.
	Events *events.Log
	// Changelog records every change made through the API and serves GET
	// /api/v1/changelog; nil records nothing and leaves the route out.
	Changelog *changelog.Log
	// Sessions serves GET /api/v1/nodes/session (it authenticates on its own).
	Sessions http.Handler
	// NodeOps, when not nil, serves workload logs and node metrics by asking
	// nodes over their sessions (nodeops.go).
	NodeOps NodeCommander
	// ShippedLogs, when not nil, is the index of shipped log segments: workload logs merge it
	// with the node's live tail and outlive the node (docs/logs.md section 7).
	ShippedLogs *logs.Index
	// PublicURL is how nodes reach this server, e.g. "http://127.0.0.1:7070";
	// it is written into join commands.
	PublicURL string
	// RegistryHost is the host (and port) of Berth's registry in the image references a
	// promotion writes ("<host>/<project>/<service>@sha256:..."); empty: the host of PublicURL.
	RegistryHost string
	// ServerFingerprint is the pin of the server's TLS certificate
	// ("sha256:<64 hex>"), written into join commands (docs/node-protocol.md
	// section 2.2); empty leaves --fingerprint out.
	ServerFingerprint string
	// PublicKeyPin is curl's pin of the server's public key ("sha256//<base64>",
	// identity.PublicKeyPin), written into join commands and setup scripts
	// (docs/joining.md section 3); empty trusts the system CAs.
	PublicKeyPin string
	ClusterID    string
	// ClusterPublicKey is the cluster signing key handed to enrolling nodes;
	// CurrentPublicKey, when not nil, is asked instead, so that nodes
	// enrolled after a key rotation pin the new key.
	ClusterPublicKey ed25519.PublicKey
	CurrentPublicKey func() ed25519.PublicKey
	// MaxBodyBytes bounds JSON bodies; zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Metrics is the registry /metrics serves; nil makes a private one.
	Metrics *prometheus.Registry
	// Ready reports whether the server can serve (store reachable, gateway up);
	// nil means always ready.
	Ready func(ctx context.Context) error
	// Policy runs the admission hooks and serves /modules and
	// /policy-bindings (docs/wasm-abi.md section 9); nil means no policies.
	Policy *policy.Engine
	// Routes serves GET /routes; nil answers an empty table.
	Routes RouteStatuser
	// Plugins serves GET /api/v1/plugins; nil lists none.
	Plugins PluginLister
	// Orchestration serves runner enrollment, placements and operations under /api/v1 and,
	// when its Transport is on, /api/runner/v1 (docs/runner-protocol.md); nil leaves them out.
	Orchestration *Orchestration
	// KeyRotator serves POST /api/v1/cluster/signing-key/rotate; nil leaves the route out.
	KeyRotator KeyRotator
	// RegistryGC serves POST /api/v1/registry/gc (registry_gc.go); nil leaves the route out.
	RegistryGC RegistryCollector
	// Manifests, when not nil, is asked whether the registry still holds the
	// manifest a release names before a promotion or a deploy_on_push apply
	// points a service at it ([registry.Registry.ManifestExists]); nil trusts
	// the release record.
	Manifests ManifestChecker
	// Leases serves /leases, /nodes/{id}/lost, /nodes/{id}/fence and /nodes/{id}/fence-ack, and
	// supersedes a removed node's leases (leases.go); nil leaves the routes out.
	Leases *fencing.Authority
	// Runtime holds runtime specs, slots and verdicts (docs/reconciliation.md). Required.
	Runtime *rollout.Store
	// Idempotency holds the Idempotency-Key records (docs/api.md section 1.7). Required.
	Idempotency *idempotency.Records
	// Certificates reads the certificate statuses shown with domains; nil shows none.
	Certificates CertificateStatuses
	// DNSRecords serves GET /api/v1/dns-records (dns.go, docs/dns.md section 6.3); nil answers
	// an empty list.
	DNSRecords DNSRecordLister
	// Now is the clock of Idempotency-Key records; nil means time.Now.
	Now func() time.Time
	// Releases serves /releases and the binaries POST /nodes/{id}/upgrade
	// offers (upgrade.go, docs/upgrades.md); nil serves none and refuses
	// upgrades with release_not_found.
	Releases *releases.Catalog
	// CoreVersion is the version upgrade targets are checked against by the
	// skew rule; empty means internal/version.Version.
	CoreVersion string
	// Bindings declares service bindings at apply and serves /projects/{p}/bindings and
	// binding deletion (bindings.go, docs/bindings.md); nil refuses services with bindings.
	Bindings *bindings.Manager
	// Resources serves declared resources (resources.go, docs/resources.md); nil leaves the
	// routes out.
	Resources *ResourcesConfig
	// Secrets serves the secret routes and checks services' secret references (secrets.go,
	// docs/api.md section 10); nil leaves the routes out and refuses references.
	Secrets *SecretsConfig
	// ACME says whether a tls mode acme domain can be proven by a challenge
	// (a certs.Config; docs/certificates.md section 6); nil refuses tls mode
	// acme as tls_domain_unverifiable.
	ACME DomainChecker
	// Backups serves the service backup routes (backups.go, docs/backups.md); nil leaves them
	// out.
	Backups *BackupsConfig
	// LoginLimit bounds login attempts per client address; the zero value means
	// DefaultLoginLimit.
	LoginLimit LoginLimit
	// Guard checks fenced shared-storage writes (bundle uploads with the fencing headers); nil
	// refuses such writes as unavailable.
	Guard *fencing.Guard
	// Deployer runs every change to what a service runs (core/deploy); nil builds one from this
	// Config (Catalog, Runtime, Bundles, Secrets, Bindings, Policy, ImageReleases, Manifests,
	// ACME, Events, Metrics).
	Deployer *deploy.Deployer
	// Jobs serves the job routes (jobs.go, docs/jobs.md section 7); nil leaves them out.
	Jobs *jobs.Controller
	// Platform serves GET /platform-jobs, berthd's own periodic work with its last passes
	// (docs/jobs.md section 10); nil leaves the route out.
	Platform *jobs.Platform
	// Machines serves /machines (machines.go, docs/machines.md); nil leaves the routes out.
	Machines *machines.Machines
}

// Server is the API's HTTP handler.
type Server struct {
	cfg      Config
	runtime  *rollout.Store
	deployer *deploy.Deployer
	log      *slog.Logger
	e        *echo.Echo
	requests *prometheus.CounterVec
	logins   *loginSources
}

// New builds the API handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if cfg.Runtime == nil || cfg.Idempotency == nil {
		panic("api: Config.Runtime and Config.Idempotency are required") // a wiring bug
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "api"), runtime: cfg.Runtime}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	s.logins = newLoginSources(cfg.LoginLimit, now)
	s.deployer = cfg.Deployer
	if s.deployer == nil {
		s.deployer = s.newDeployer()
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_api_requests_total", Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	cfg.Metrics.MustRegister(s.requests)

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe)
	e.Use(s.refuseUnreadBody)
	e.Use(refuseCredentialsInURL)
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{})))

	v1 := e.Group("/api/v1")
	v1.POST("/nodes/enroll", s.enroll) // the join token is the proof
	if cfg.Sessions != nil {
		v1.GET("/nodes/session", echo.WrapHandler(cfg.Sessions))
	}
	v1.GET("/bundles/:digest", s.downloadBundle, s.auth(scopeNodeOrRead))

	v1.POST("/nodes/join-tokens", s.createJoinToken, s.auth(identity.ScopeNodeEnroll))
	v1.POST("/nodes/join-codes", s.createJoinCode, s.auth(identity.ScopeNodeEnroll))
	e.GET("/join/:code/setup.sh", s.joinSetup) // the join code is the proof
	e.GET("/downloads/:name", s.download)
	v1.GET("/nodes", s.listNodes, s.auth(identity.ScopeNodesRead))
	v1.GET("/nodes/:id", s.getNode, s.auth(identity.ScopeNodesRead))
	v1.DELETE("/nodes/:id", s.removeNode, s.auth(identity.ScopeNodeRemove, reauth))
	if cfg.Leases != nil {
		v1.GET("/leases", s.listLeases, s.auth(identity.ScopeNodesRead))
		v1.GET("/nodes/:id/fence", s.nodeFence, s.auth(identity.ScopeNodesRead))
		v1.POST("/nodes/:id/lost", s.nodeLost, s.auth(identity.ScopeNodeRemove, reauth))
		v1.POST("/nodes/:id/fence-ack", s.fenceAck, s.auth(identity.ScopeNodeFenceAck, reauth))
	}
	if cfg.KeyRotator != nil {
		v1.POST("/cluster/signing-key/rotate", s.rotateSigningKey, s.auth(identity.ScopeAdmin, reauth))
	}
	if cfg.RegistryGC != nil {
		v1.POST("/registry/gc", s.registryGC, s.auth(identity.ScopeAdmin))
	}
	v1.GET("/plugins", s.listPlugins, s.auth(identity.ScopeNodesRead))
	v1.GET("/releases", s.listReleases, s.auth(identity.ScopeNodesRead))
	v1.GET("/releases/:sha256", s.downloadRelease, s.auth(scopeNodeOrRead))
	v1.POST("/nodes/:id/upgrade", s.upgradeNode, s.auth(identity.ScopeAdmin))
	if cfg.Events != nil {
		v1.GET("/events", s.listEvents, s.auth(identity.ScopeNodesRead))
	}
	if cfg.Changelog != nil {
		v1.GET("/changelog", s.listChangelog, s.auth(identity.ScopeNodesRead))
	}
	v1.GET("/projects", s.listProjects, s.auth(identity.ScopeServicesRead))
	v1.PUT("/projects/:project", s.putProject, s.auth(identity.ScopeServicesWrite))
	v1.GET("/projects/:project", s.getProject, s.auth(identity.ScopeServicesRead))
	v1.GET("/projects/:project/services", s.listServices, s.auth(identity.ScopeServicesRead))
	v1.PUT("/projects/:project/services/:name", s.putService, s.auth(identity.ScopeServiceDeploy))
	v1.GET("/projects/:project/services/:name", s.getService, s.auth(identity.ScopeServicesRead))
	v1.DELETE("/projects/:project/services/:name", s.deleteService, s.auth(identity.ScopeServicesWrite))
	v1.GET("/projects/:project/workloads", s.listWorkloads, s.auth(identity.ScopeServicesRead))
	s.registerRollout(v1)
	if cfg.Jobs != nil {
		s.registerJobs(v1)
	}
	if s.cfg.Platform != nil {
		v1.GET("/platform-jobs", s.listPlatformJobs, s.auth(identity.ScopeNodesRead))
	}
	s.registerReleases(v1)
	v1.GET("/workloads", s.listWorkloads, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/bundles", s.pushBundle, s.auth(identity.ScopeServiceDeploy, anyService))
	v1.GET("/projects/:project/bundles", s.listBundles, s.auth(identity.ScopeServicesRead))
	s.registerSecrets(v1)
	s.registerBindings(v1)
	s.registerResources(v1)
	s.registerIdentity(v1)
	s.registerWasm(v1)
	s.registerNodeOps(v1)
	s.registerNodeCapacity(v1)
	s.registerOrchestration(v1)
	s.registerBackups(v1)
	s.registerClusters(v1)
	s.registerMachines(v1)
	s.registerDNS(v1)
	s.registerRunnerTransport(e)
	e.RouteNotFound("/*", func(c echo.Context) error {
		return problem(abierrors.NotFound, "no such endpoint: "+c.Request().Method+" "+c.Request().URL.Path)
	})
	s.e = e
	return s
}

// bodyKind says what request body a route reads (docs/api.md section 1.1).
type bodyKind int

const (
	// bodyNone: the route reads no body and refuses a non-empty one with 400 bad_request.
	bodyNone bodyKind = iota
	// bodyJSON: the handler decodes one JSON object (bind, bindOptional, runnerBind), which
	// refuses every other JSON value.
	bodyJSON
	// bodyUpload: the handler streams a binary upload (a bundle or a WebAssembly module).
	bodyUpload
)

// routeBody is the body kind of the route c matched, by method and echo's route pattern. Every
// route not listed reads no body; a route added without a case refuses bodies, which its first
// test shows at once.
func routeBody(c echo.Context) bodyKind {
	if c.Path() == abirunner.Prefix+abirunner.PathBackupArchive {
		return bodyUpload // the archive itself, streamed (docs/backups.md section 2)
	}
	if strings.HasPrefix(c.Path(), abirunner.Prefix+"/") {
		return bodyJSON // every runner transport call is one JSON object (docs/runner-protocol.md)
	}
	switch c.Request().Method + " " + c.Path() {
	case "POST /api/v1/nodes/enroll",
		"POST /api/v1/nodes/join-tokens",
		"POST /api/v1/clusters",
		"POST /api/v1/nodes/join-codes",
		"POST /api/v1/machines",
		"POST /api/v1/nodes/:id/fence-ack",
		"POST /api/v1/nodes/:id/retire",
		"PUT /api/v1/nodes/:id/capacity",
		"POST /api/v1/nodes/:id/drain",
		"POST /api/v1/nodes/:id/upgrade",
		"POST /api/v1/cluster/signing-key/rotate",
		"POST /api/v1/registry/gc",
		"PUT /api/v1/projects/:project/secrets/:secret",
		"PUT /api/v1/projects/:project/secret-sets/:set",
		"POST /api/v1/secrets/keyring/rotate",
		"POST /api/v1/nodes/:id/secret-key/rotate",
		"PUT /api/v1/projects/:project",
		"PUT /api/v1/projects/:project/services/:name",
		"PUT /api/v1/projects/:project/services/:name/spec",
		"POST /api/v1/projects/:project/services/:name/rollout/undo",
		"POST /api/v1/projects/:project/services/:name/rollout/pause", "POST /api/v1/projects/:project/services/:name/rollout/resume",
		"POST /api/v1/projects/:project/services/:name/rollout/restart",
		"POST /api/v1/projects/:project/services/:name/rebalance",
		"POST /api/v1/projects/:project/services/:name/run",
		"POST /api/v1/projects/:project/services/:name/releases",
		"POST /api/v1/projects/:project/services/:name/releases/:tag/promote",
		"POST /api/v1/policy-bindings",
		"POST /api/v1/runners/enrollment-tokens",
		"PUT /api/v1/projects/:project/placement",
		"POST /api/v1/projects/:project/placement/rollback",
		"POST /api/v1/projects/:project/operations",
		"PUT /api/v1/projects/:project/resources/:type/:name", "POST /api/v1/projects/:project/resources/:type/:name/plan",
		"POST /api/v1/login",
		"POST /api/v1/users",
		"POST /api/v1/users/:user/credential",
		"PUT /api/v1/users/:user/roles",
		"POST /api/v1/tokens",
		"POST /api/v1/projects/:project/services/:name/backups",
		"POST /api/v1/projects/:project/backups/:id/restore":
		return bodyJSON
	case "POST /api/v1/projects/:project/bundles",
		"POST /api/v1/modules":
		return bodyUpload
	}
	return bodyNone
}

// selfAuthenticated reports whether the route c matched carries its own proof, or none, rather
// than going through [Server.auth]: everything outside /api/v1 (operational endpoints, the
// runner transport), login, node enrollment and the node session.
func selfAuthenticated(c echo.Context) bool {
	switch c.Request().Method + " " + c.Path() {
	case "POST /api/v1/login", "POST /api/v1/nodes/enroll", "GET /api/v1/nodes/session":
		return true
	}
	return !strings.HasPrefix(c.Path(), "/api/v1/")
}

// refuseUnreadBody answers 400 bad_request to a request carrying a body the route does not read
// (every GET and DELETE, POST /nodes/{id}/lost), so that nothing a client sent is silently
// dropped. On a route behind a bearer the refusal waits for [Server.auth] to have checked the
// bearer (an unauthenticated request is 401 whatever it carries); elsewhere it is made here.
func (s *Server) refuseUnreadBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Path() == "/*" || !selfAuthenticated(c) {
			return next(c)
		}
		if err := unreadBody(c); err != nil {
			return err
		}
		return next(c)
	}
}

// unreadBody is the 400 bad_request of a request carrying a body its route does not read, or
// nil. A body of unknown length is probed by one byte.
func unreadBody(c echo.Context) error {
	r := c.Request()
	if routeBody(c) != bodyNone || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	if r.ContentLength < 0 {
		var one [1]byte
		n, _ := io.ReadFull(r.Body, one[:])
		if n == 0 {
			return nil
		}
	}
	return problem(abierrors.BadRequest, fmt.Sprintf("%s %s takes no request body", r.Method, c.Path()))
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.e.ServeHTTP(w, r) }

func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		status := c.Response().Status
		s.requests.WithLabelValues(c.Path(), fmt.Sprint(status)).Inc()
		if c.Path() != "/healthz" && c.Path() != "/readyz" && c.Path() != "/metrics" {
			s.log.Debug("request", "method", c.Request().Method, "path", c.Request().URL.Path, "status", status, "duration_ms", time.Since(start).Milliseconds())
		}
		return nil
	}
}

func (s *Server) readyz(c echo.Context) error {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(c.Request().Context()); err != nil {
			s.log.Warn("not ready", "err", err)
			return problem(abierrors.Unavailable, "not ready")
		}
	}
	return c.String(http.StatusOK, "ready\n")
}

// problem returns an *abierrors.Error for handlers to return.
func problem(code abierrors.Code, msg string) error { return abierrors.New(code, msg) }

// statusClientClosed is the status recorded for a request its client cancelled (the
// convention of nginx's 499); the client never reads it.
const statusClientClosed = 499

// handleError writes every error as application/problem+json with a stable code.
// Internal causes go to the log only.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil {
		// The client went away (a cancelled CLI, a closed tab): no one reads an answer, and it
		// is no internal error.
		s.log.Debug("client cancelled the request", "method", c.Request().Method, "path", c.Request().URL.Path)
		c.Response().WriteHeader(statusClientClosed)
		return
	}
	var ae *abierrors.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		code := abierrors.BadRequest
		switch he.Code {
		case http.StatusNotFound:
			code = abierrors.NotFound
		case http.StatusMethodNotAllowed:
			code = abierrors.MethodNotAllowed
		case http.StatusRequestEntityTooLarge:
			code = abierrors.BodyTooLarge
		case http.StatusUnauthorized:
			code = abierrors.Unauthenticated
		}
		ae = abierrors.New(code, fmt.Sprint(he.Message))
	default:
		s.log.Error("internal error", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
		ae = abierrors.New(abierrors.Internal, "internal error; see the server log")
	}
	status := ae.Code.HTTPStatus()
	if status >= 500 && ae.Err != nil {
		s.log.Error("request failed", "path", c.Request().URL.Path, "code", ae.Code, "err", ae.Err)
	}
	c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	body := map[string]any{
		"title":  http.StatusText(status),
		"status": status,
		"code":   ae.Code,
		"detail": ae.Message,
	}
	addReasons(body, err)
	_ = c.JSON(status, body)
}

// principal keys.
const principalKey = "berth.principal"

const scopeNodeOrRead identity.Scope = "berth.internal:node-or-read"

// authOpt changes what [Server.auth] checks.
type authOpt int

const (
	// anyService lets a service-bound token use a project route that names no service
	// (bundle uploads).
	anyService authOpt = iota + 1
	// reauth makes a human session need a login within the last 5 minutes.
	reauth
)

// authNeed is what [Server.auth] checked for the route, kept for rechecks of long answers.
type authNeed struct {
	scope identity.Scope
	opts  []authOpt
}

// authNeedKey keys the request's authNeed.
const authNeedKey = "berth.authneed"

// auth authenticates the bearer and checks scope against the route's project and service
// (docs/api.md section "Identity"). Credential failures are one generic 401; a valid bearer
// without the scope, or outside its project or service bounds, is one generic 403. A node
// credential is accepted only where scope is scopeNodeOrRead. Nothing is cached: a revoked
// token or an outdated session fails on its next request. Only then is a body the route does
// not read refused ([unreadBody]).
func (s *Server) auth(scope identity.Scope, opts ...authOpt) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			tok := bearer(c)
			if tok == "" {
				return problem(abierrors.Unauthenticated, "authentication failed")
			}
			ctx := c.Request().Context()
			if strings.HasPrefix(tok, identity.PrefixNode) {
				if scope != scopeNodeOrRead {
					return problem(abierrors.Unauthenticated, "authentication failed")
				}
				n, err := s.cfg.Nodes.Authenticate(ctx, tok)
				if errors.Is(err, identity.ErrUnauthenticated) {
					return problem(abierrors.Unauthenticated, "authentication failed")
				}
				if err != nil {
					return abierrors.Wrap(abierrors.Unavailable, "the node store is unavailable", err)
				}
				if err := unreadBody(c); err != nil {
					return err
				}
				c.Set(principalKey, &identity.Principal{Kind: identity.KindNode, ID: n.ID})
				return next(c)
			}
			need := authNeed{scope: scope, opts: opts}
			p, err := s.authorize(c, tok, need)
			if err != nil {
				return err
			}
			if err := unreadBody(c); err != nil {
				return err
			}
			c.Set(principalKey, p)
			c.Set(authNeedKey, need)
			// Every mutating route behind a token honours Idempotency-Key (idempotency.go).
			return s.idempotent(tok, next)(c)
		}
	}
}

// authorize authenticates the API bearer tok (a token or a session, not a node credential)
// and checks it holds need on the route c matched: the principal, or the problem to answer
// (401 unauthenticated, 403 forbidden, 401 reauthentication_required, 503 unavailable).
func (s *Server) authorize(c echo.Context, tok string, need authNeed) (*identity.Principal, error) {
	p, err := s.cfg.Tokens.Authenticate(c.Request().Context(), tok)
	if errors.Is(err, identity.ErrUnauthenticated) {
		return nil, problem(abierrors.Unauthenticated, "authentication failed")
	}
	if err != nil {
		return nil, abierrors.Wrap(abierrors.Unavailable, "the identity store is unavailable", err)
	}
	want := need.scope
	if want == scopeNodeOrRead {
		want = identity.ScopeServicesRead
	}
	if want != scopeAuthenticated {
		service := ""
		if strings.Contains(c.Path(), "/services/:name") {
			service = c.Param("name")
		}
		if !p.Allows(want, c.Param("project"), service, slices.Contains(need.opts, anyService)) {
			return nil, problem(abierrors.Forbidden, forbiddenDetail(want, c.Param("project"), service))
		}
	}
	if slices.Contains(need.opts, reauth) && !s.cfg.Tokens.Fresh(p) {
		return nil, problem(abierrors.ReauthenticationRequired, "log in again: this needs a login within the last 5 minutes")
	}
	return p, nil
}

// forbiddenDetail is the detail of a route's 403: the scope the route needs (the table of
// docs/api.md section 9) and the project and service it was asked on, if any. It says nothing
// about the bearer, which the caller knows.
func forbiddenDetail(scope identity.Scope, project, service string) string {
	msg := fmt.Sprintf("this request needs scope %s", scope)
	switch {
	case service != "":
		msg += fmt.Sprintf(" on service %s/%s", project, service)
	case project != "":
		msg += fmt.Sprintf(" on project %s", project)
	}
	return msg + "; the credential does not hold it there"
}

func principal(c echo.Context) *identity.Principal {
	p, _ := c.Get(principalKey).(*identity.Principal)
	return p
}

func (s *Server) createJoinToken(c echo.Context) error {
	var req struct {
		TTLSeconds int    `json:"ttl_seconds"`
		Cluster    string `json:"cluster"`
	}
	if err := s.bindOptional(c, &req); err != nil {
		return err
	}
	cluster, err := s.joinTokenCluster(c.Request().Context(), req.Cluster)
	if err != nil {
		return err
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if req.TTLSeconds < 0 || ttl > nodes.MaxJoinTokenTTL {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("ttl_seconds must be between 0 and %d", int(nodes.MaxJoinTokenTTL.Seconds())))
	}
	tok, exp, err := s.cfg.Nodes.CreateClusterJoinToken(c.Request().Context(), ttl, cluster)
	if err != nil {
		return err
	}
	s.log.Info("join token created", "expires_at", exp, "cluster", cluster)
	// The join command carries exactly three values: server URL, join token
	// and certificate fingerprint (docs/node-protocol.md section 2.2).
	cmd := fmt.Sprintf("berth-agent enroll --server %s --join-token %s", s.cfg.PublicURL, tok)
	if s.cfg.ServerFingerprint != "" {
		cmd += " --fingerprint " + s.cfg.ServerFingerprint
	}
	if cluster == "" {
		cluster = clusters.Default
	}
	return c.JSON(http.StatusCreated, map[string]any{
		"cluster":      cluster,
		"token":        tok,
		"join_command": cmd,
		"fingerprint":  s.cfg.ServerFingerprint,
		"expires_at":   exp,
	})
}

func (s *Server) enroll(c echo.Context) error {
	var req struct {
		JoinToken    string            `json:"join_token"`
		PublicKey    string            `json:"public_key"`
		BoxPublicKey string            `json:"box_public_key"`
		Hostname     string            `json:"hostname"`
		Region       string            `json:"region"`
		Labels       map[string]string `json:"labels"`
		Address      string            `json:"address"`
		Capacity     struct {
			CPUs     int   `json:"cpus"`
			MemoryMB int64 `json:"memory_mb"`
		} `json:"capacity"`
		Allocatable *struct {
			CPUMilli  int64            `json:"cpu_m"`
			MemoryMiB int64            `json:"memory_mib"`
			DiskMiB   int64            `json:"disk_mib"`
			Extended  map[string]int64 `json:"extended"`
		} `json:"allocatable"`
	}
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.JoinToken == "" {
		return problem(abierrors.Unauthenticated, "authentication failed")
	}
	if req.Address == "" {
		req.Address = "127.0.0.1"
	}
	if err := validateEnroll(req.Hostname, req.Region, req.Address, req.Labels); err != nil {
		return err
	}
	var alloc nodes.Resources
	if a := req.Allocatable; a != nil {
		alloc = nodes.Resources{CPUMilli: a.CPUMilli, MemoryMiB: a.MemoryMiB, DiskMiB: a.DiskMiB, Extended: a.Extended}
		if err := alloc.Validate("allocatable"); err != nil {
			return problem(abierrors.ValidationFailed, err.Error())
		}
	}
	wctx, done := s.changeCtx(c)
	defer done()
	n, cred, err := s.cfg.Nodes.Enroll(wctx, nodes.EnrollRequest{
		JoinToken: req.JoinToken, PublicKey: req.PublicKey, BoxPublicKey: req.BoxPublicKey, Hostname: req.Hostname, Region: req.Region,
		Labels: req.Labels, Address: req.Address, CPUs: req.Capacity.CPUs, MemoryMB: req.Capacity.MemoryMB, Allocatable: alloc,
		Admit: s.enrollAdmitter(c, carrierAdmits),
	})
	switch {
	case errors.Is(err, nodes.ErrJoinTokenUsed):
		return problem(abierrors.JoinTokenUsed, "this join token was already used; create a new one")
	case errors.Is(err, nodes.ErrJoinTokenExpired):
		return problem(abierrors.JoinTokenExpired, "this join token is expired or unknown; create a new one")
	case nodes.IsBadKey(err):
		return problem(abierrors.ValidationFailed, "public_key must be a base64-encoded Ed25519 public key, box_public_key (when given) a base64-encoded X25519 one")
	case err != nil:
		return err
	}
	s.log.Info("node enrolled", "node_id", n.ID, "hostname", n.Hostname, "address", n.Address, "region", n.Region)
	s.awaitChange(c, "nodes", n.ID, n.LogOutbox)
	s.cfg.Hinter.Hint("node.enrolled")
	return c.JSON(http.StatusCreated, map[string]any{
		"node_id":            n.ID,
		"credential":         cred,
		"cluster_public_key": base64.StdEncoding.EncodeToString(s.clusterKey()),
		"cluster_id":         s.cfg.ClusterID,
	})
}

// clusterKey is the signing key enrolling nodes pin: the current one.
func (s *Server) clusterKey() ed25519.PublicKey {
	if s.cfg.CurrentPublicKey != nil {
		return s.cfg.CurrentPublicKey()
	}
	return s.cfg.ClusterPublicKey
}
