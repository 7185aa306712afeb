package server

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/backup"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/machines"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/releases"
	"github.com/berthhq/berth/core/resources"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/secrets/delivery"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/session"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/ui"
	"github.com/berthhq/berth/host/plugin"
)

// The constructors Run calls, in order. Each builds one layer of berthd from the layers before
// it and pushes what must be undone onto the close stack; none holds logic of its own.

// closeStack undoes start-up in reverse order, as deferred calls would.
type closeStack []func()

func (c *closeStack) push(f func()) { *c = append(*c, f) }

func (c *closeStack) close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// base is what every other part stands on: the data directory (locked), the cluster's keys
// and TLS, the metrics registry and the store.
type base struct {
	key       ed25519.PrivateKey
	clusterID string
	tls       *identity.ServerTLS
	metrics   *prometheus.Registry
	st        *store.Store
	apiAddr   net.Addr
}

func openBase(ctx context.Context, cfg *Config, ln net.Listener, closers *closeStack) (*base, error) {
	log := cfg.Logger
	if cfg.DebugListen != "" {
		stopDebug, err := startDebug(cfg.DebugListen, log)
		if err != nil {
			return nil, err
		}
		closers.push(stopDebug)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	unlock, err := store.LockDir(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("lock data directory %s (is another berthd using it?): %w", cfg.DataDir, err)
	}
	closers.push(func() { _ = unlock() })
	if _, err := os.Lstat(filepath.Join(cfg.DataDir, backup.IncompleteMarker)); err == nil {
		return nil, fmt.Errorf("data directory %s holds %s: a restore into it did not finish; empty the directory and run berthd restore again (docs/operating.md section 5.2)", cfg.DataDir, backup.IncompleteMarker)
	}
	b := &base{apiAddr: ln.Addr()}
	var created bool
	if b.key, created, err = identity.LoadOrCreateSigningKey(cfg.DataDir); err != nil {
		return nil, err
	}
	if created {
		log.Info("cluster signing key created", "path", filepath.Join(cfg.DataDir, "keys"))
	}
	if b.clusterID, _, err = identity.ClusterID(cfg.DataDir); err != nil {
		return nil, err
	}
	if cfg.PublicURL == "" {
		cfg.PublicURL = "https://" + ln.Addr().String()
	}
	tlsHosts := []string{}
	if h, _, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		tlsHosts = append(tlsHosts, h)
	}
	if u, err := url.Parse(cfg.PublicURL); err == nil && u.Hostname() != "" {
		tlsHosts = append(tlsHosts, u.Hostname())
	}
	if b.tls, err = identity.LoadOrCreateServerTLS(cfg.DataDir, cfg.TLSCertFile, cfg.TLSKeyFile, tlsHosts); err != nil {
		return nil, err
	}
	if b.tls.Created {
		log.Info("self-signed TLS certificate created", "path", filepath.Join(cfg.DataDir, identity.TLSCertFile))
	}
	log.Info("serving TLS", "fingerprint", b.tls.Fingerprint, "fingerprint_file", filepath.Join(cfg.DataDir, identity.FingerprintFile))
	b.metrics = prometheus.NewRegistry()
	b.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if b.st, err = store.Open(ctx, store.Config{URI: cfg.MongoURI, DataDir: cfg.DataDir, Logger: log, Metrics: b.metrics}); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	closers.push(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.st.Close(cctx); err != nil {
			log.Warn("close store", "err", err)
		}
	})
	return b, nil
}

// state is the desired state's owners over the store: identity, nodes, services, the change
// log (recovered), events, and the blob and bundle stores.
type state struct {
	tokens    *identity.Tokens
	reg       *nodes.Registry
	clusters  *clusters.Registry
	cat       *services.Catalog
	clog      *changelog.Log
	evlog     *events.Log
	blobStore blobs.Store
	bundles   *bundles.Store
	// logs indexes the workload log segments nodes ship (core/logs; docs/logs.md section 6).
	logs *logs.Index
}

func openState(ctx context.Context, cfg Config, b *base, closers *closeStack) (*state, error) {
	log := cfg.Logger
	// Each login's argon2id verification holds 64 MiB and a CPU: run as many at once as an
	// eighth of memory holds, at most 4 per CPU (docs/api.md section 9.2).
	loginSlots := identity.LoginConcurrencyFor(machineMemory(), runtime.GOMAXPROCS(0))
	log.Info("login verifications bounded", "at_once", loginSlots)
	s := &state{tokens: identity.NewTokens(b.st, identity.WithLoginConcurrency(loginSlots))}
	if err := bootstrapIdentity(ctx, cfg, s.tokens); err != nil {
		return nil, err
	}
	s.reg, s.cat = nodes.NewRegistry(b.st, nil), services.NewCatalog(b.st, nil)
	if err := s.reg.EnsureIndexes(ctx); err != nil {
		return nil, err
	}
	if err := s.cat.EnsureIndexes(ctx); err != nil {
		return nil, err
	}
	if err := s.reg.MarkAllDisconnected(ctx); err != nil {
		return nil, err
	}
	s.clusters = clusters.New(b.st, nil)
	if err := s.clusters.EnsureDefault(ctx); err != nil {
		return nil, err
	}
	var err error
	if s.clog, err = openChangelog(ctx, b.st, log); err != nil {
		return nil, err
	}
	s.evlog = events.New(b.st, nil)
	if err := s.evlog.EnsureIndexes(ctx); err != nil {
		return nil, err
	}
	blobStore, stopMigrate, err := openBlobs(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	closers.push(stopMigrate)
	s.blobStore = blobStore
	retention := cfg.LogRetention
	if retention == (logs.Retention{}) {
		retention = logs.DefaultRetention
	}
	if s.logs, err = logs.New(ctx, logs.Config{Store: b.st, Blobs: blobStore, Retention: func(string) logs.Retention { return retention }}); err != nil {
		return nil, err
	}
	if s.bundles, err = bundles.Open(b.st, blobStore, filepath.Join(cfg.DataDir, "blobs", ".incoming"), cfg.MaxBundleBytes); err != nil {
		return nil, err
	}
	return s, nil
}

// bootstrapIdentity creates the bootstrap human admin when configured and the admin token at
// first start (shown once on stderr; the file keeps it, 0600).
func bootstrapIdentity(ctx context.Context, cfg Config, tokens *identity.Tokens) error {
	log := cfg.Logger
	if cfg.BootstrapAdmin != "" {
		created, err := tokens.BootstrapAdmin(ctx, cfg.BootstrapAdmin, cfg.BootstrapPassword)
		if err != nil {
			return fmt.Errorf("bootstrap admin: %w", err)
		}
		if created {
			log.Info("bootstrap admin created", "user", cfg.BootstrapAdmin)
		} else {
			log.Info("bootstrap admin exists already; nothing changed", "user", cfg.BootstrapAdmin)
		}
	}
	adminCreated, adminToken, err := tokens.EnsureAdmin(ctx, cfg.DataDir)
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	if adminCreated {
		fmt.Fprintf(os.Stderr, "\nAdmin token (shown once; also in %s):\n  %s\n\n", filepath.Join(cfg.DataDir, "admin-token"), adminToken)
	}
	return nil
}

// openChangelog opens the change log with the outboxes it drains (docs/node-protocol.md section
// 7.2) and appends what a stopped berthd left in them before this one serves a write.
func openChangelog(ctx context.Context, st *store.Store, log *slog.Logger) (*changelog.Log, error) {
	clog := changelog.New(st, 1, nil).WithLogger(log)
	for _, t := range [][2]string{
		{"projects", ""}, {bundles.Collection, ""}, {registry.ReleasesCollection, ""}, {"services", ""}, {"nodes", ""},
		{"runtime_specs", ""}, {policy.DecisionsCollection, "seq"}, {policy.BindingsCollection, ""}, {fencing.Collection, ""},
		{identity.UsersCollection, ""}, {identity.TokensCollection, ""}, {identity.TokenNamesCollection, ""},
		{secrets.Collection, ""}, {secrets.SetsCollection, ""},
	} {
		clog.TrackOutbox(t[0], t[1])
	}
	// An embedded store has this one process (it holds the data directory's lock): everything
	// pending is a leftover. Against a shared MongoDB, another replica may be appending its
	// young changes right now.
	var recoverAge time.Duration
	if !st.Embedded() {
		recoverAge = changelog.RecoverAge
	}
	rcctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := clog.RecoverOlderThan(rcctx, recoverAge); err != nil {
		return nil, err
	}
	return clog, nil
}

// parts are the processes and engines berthd drives: orchestration, the WebAssembly
// extensions, the gateway, secrets with their re-wrapper, and the DNS plugin.
type parts struct {
	orch     *orchestration
	ext      *extensions
	gw       reconciler.RouteSink
	sec      *secrets.Store
	rewrap   *secrets.Rewrapper
	dns      *dns
	machines *machines.Machines
	// machineProviders are the machine provider plugins; the machine worker runs when there is one.
	machineProviders []*plugin.Provider
	supervised       []*plugin.Provider // the provider plugins in GET /api/v1/plugins
	// providers is the registry of every provider plugin by the resource types it declares.
	providers *providers
}

func startParts(ctx context.Context, cfg Config, b *base, s *state, closers *closeStack) (*parts, error) {
	log := cfg.Logger
	p := &parts{providers: newProviders()}
	var err error
	// The corestore plugin's backup executor is a runner node, so bindings need the transport.
	if p.orch, err = newOrchestration(ctx, b.st, s.bundles, cfg.RunnerTransport || cfg.CorestoreConfig != "", cfg.OrchestrationInterval, log); err != nil {
		return nil, err
	}
	if err := p.orch.legacy(cfg.RunnerRegistrationSecret); err != nil {
		return nil, err
	}
	if p.ext, err = startExtensions(ctx, cfg.DataDir, b.st, s.bundles, s.clog, b.metrics, log); err != nil {
		return nil, err
	}
	closers.push(p.ext.close)
	if cfg.GatewayListen != "off" {
		sink, err := startGateway(ctx, cfg, p.providers, log)
		if err != nil {
			return nil, err
		}
		// The gateway outlives berthd (docs/plugins.md section 5.3): on the way out berthd
		// lets go of it, and the next start reattaches.
		closers.push(sink.p.Detach)
		p.gw = sink
		p.supervised = append(p.supervised, sink.p)
		b.metrics.MustRegister(newGatewayCollector(sink.metricsSocket, log))
	}
	if p.sec, err = openSecrets(ctx, cfg, b.st, log); err != nil {
		return nil, err
	}
	rewrapCtx, stopRewrap := context.WithCancel(ctx)
	closers.push(stopRewrap)
	// Stored certificates are sealed under the same keyring, whether or not ACME is on now.
	p.rewrap = secrets.NewRewrapper(rewrapCtx, p.sec, secrets.RewrapConfig{PerSecond: cfg.RewrapPerSecond, Logger: log,
		Also: []secrets.SealedSet{certs.NewStorage(b.st, p.sec.Keyring(), nil, log, nil)}})
	p.rewrap.Kick() // resumes a rotation an earlier berthd did not finish
	// The DNS plugin and the records it writes (docs/dns.md section 9).
	if p.dns, err = startDNS(ctx, cfg, p.providers, b.st, p.orch.api.Operations, s.cat, s.reg, p.sec, log); err != nil {
		return nil, err
	}
	if p.dns != nil {
		closers.push(p.dns.close)
		p.supervised = append(p.supervised, p.dns.handle)
	}
	// Machines and their provider plugins (docs/machines.md).
	m, handles, err := startMachines(ctx, cfg, p.providers, b.st, p.orch.api.Operations, s.reg, p.sec, s.cat, b.tls.PublicKeyPin, log)
	if err != nil {
		return nil, err
	}
	p.machines, p.machineProviders = m, handles
	for _, h := range handles {
		closers.push(func() { _ = h.Close() })
		p.supervised = append(p.supervised, h)
	}
	// Every other provider of the catalog, by the types it declares (docs/plugins.md section 4.6).
	closers.push(p.providers.closeVendors)
	if err := p.providers.startVendors(ctx, cfg, log); err != nil {
		return nil, err
	}
	p.supervised = append(p.supervised, p.providers.vendors...)
	return p, nil
}

// control is what turns desired state into running workloads: leases, node sessions,
// certificates in front of the gateway, and the reconciler.
type control struct {
	// dep is the one home of service changes (core/deploy); made by newFront, once the parts it
	// needs (bindings, registry) exist; deployer reads it for the parts made before.
	dep      *deploy.Deployer
	leases   *fencing.Authority
	sessions *session.Server
	rec      *reconciler.Reconciler
	runtime  *rollout.Store
	acme     ACMEConfig
	// jobs records fire times and places job runs (core/jobs; docs/jobs.md section 8).
	jobs *jobs.Controller
	// platform runs and records berthd's own periodic work (docs/jobs.md section 10).
	platform *jobs.Platform
}

func newControl(ctx context.Context, cfg Config, b *base, s *state, p *parts, closers *closeStack) (*control, error) {
	log := cfg.Logger
	c := &control{leases: fencing.New(b.st, fencing.Config{Logger: log}), acme: withDNS01(cfg.ACME, p.dns, log)}
	retired, err := identity.RetiredSigningKeys(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var dnsChallenges session.DNSChallenger
	if p.dns != nil {
		dnsChallenges = p.dns.records
	}
	c.sessions = session.New(session.Config{
		DNS:    dnsChallenges,
		Logs:   s.logs,
		Leases: c.leases, Nodes: s.reg, Catalog: s.cat, SigningKey: b.key, RetiredKeys: retired, ClusterID: b.clusterID, Logger: log, Events: s.evlog, Changelog: s.clog,
		RelayRequired: s.clusters.RequiresRelay,
		OnChange: func(reason string) {
			// A session's start or end changes which nodes are schedulable: any service's
			// placement may move, which is the full pass's work.
			if reason != "status_report" {
				c.rec.Hint(reason)
			}
		},
		OnNodeChange: func(reason, nodeID string) {
			// A status report moves the node's workloads (observations, receipts): their
			// services' work runs at once. A session's start or end changes nothing a focused
			// pass would do (the session sends the desired state at hello itself), and a
			// thousand nodes reconnecting must not each cost one.
			if reason == "status_report" {
				c.rec.HintNode(reason, nodeID)
			}
		},
		Metrics: b.metrics,
	})
	routeSink, stopCerts, err := startCerts(c.acme, b.st, p.sec, s.cat, p.gw, s.evlog, b.metrics, log)
	if err != nil {
		return nil, err
	}
	closers.push(stopCerts)
	c.runtime = rollout.NewStore(b.st, s.cat, nil)
	c.rec = reconciler.New(reconciler.Config{
		RegistryHost: publicHost(cfg.PublicURL),
		Catalog:      s.cat, Nodes: s.reg, Pusher: c.sessions, Routes: routeSink, Compiler: p.ext.compiler, Runtime: c.runtime,
		Admit: policy.Deploy{Engine: p.ext.policy}, Logger: log, Sweep: cfg.Sweep,
		Leases: c.leases, LeaseSender: c.sessions, Secrets: &delivery.Sealer{Secrets: p.sec}, Events: s.evlog, Metrics: b.metrics,
		RollBack: func(ctx context.Context, svc *services.Service) (*services.Service, error) {
			return c.deployer().RollBack(ctx, svc)
		},
	})
	if c.jobs, err = jobs.NewController(jobs.ControllerConfig{Store: b.st, Catalog: s.cat, Nodes: s.reg, Events: s.evlog,
		Metrics: b.metrics, Logger: log, Wake: func(nodeID string) { c.rec.HintNode("job.run", nodeID) }}); err != nil {
		return nil, err
	}
	c.platform = jobs.NewPlatform(b.st, log)
	for kind, count := range map[string]func() int64{
		"full":    func() int64 { return c.rec.Stats().Full },
		"focused": func() int64 { return c.rec.Stats().Focused },
	} {
		b.metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "berth_reconcile_passes_total", ConstLabels: prometheus.Labels{"kind": kind},
			Help: "Reconcile passes run: full (the sweep) or focused (woken by a service's or node's change).",
		}, func() float64 { return float64(count()) }))
	}
	return c, nil
}

// deployer returns the deployer, nil until newFront made it.
func (c *control) deployer() *deploy.Deployer { return c.dep }

// front is what berthd serves and the work behind it: bindings (the corestore plugin), the
// registry and its collector, backups, and the API on one HTTPS server.
type front struct {
	follows *registry.FollowWorker // deploy on push's follows (docs/registry.md section 8.1)
	binds   *bindings.Manager
	// res are the declared resources of the provider plugins' types (docs/resources.md).
	res     *resources.Manager
	gc      *registry.Collector
	backups *backups.Manager
	api     *api.Server
	relays  *relayFront
	srv     *http.Server
}

func newFront(ctx context.Context, cfg Config, b *base, s *state, p *parts, c *control, closers *closeStack) (*front, error) {
	log := cfg.Logger
	f := &front{}
	exec := bindings.ExecutorAccess{Runners: p.orch.api.Runners, URL: loopbackURL(b.apiAddr), Fingerprint: b.tls.Fingerprint}
	binds, corestore, err := startBindings(ctx, cfg, p.providers, b.st, p.sec, s.cat, c.deployer, exec, log)
	if err != nil {
		return nil, err
	}
	f.binds = binds
	// Every provider is launched by now: the registry holds every declared type.
	f.res = resources.New(resources.Config{Store: b.st, Queue: p.orch.api.Operations, Types: p.providers.types, Secrets: p.sec,
		Admit: resourceAdmission(p.ext.policy), Events: s.evlog, Metrics: b.metrics, DriftInterval: cfg.ResourceDriftInterval,
		Logger: log.With("component", "resources")})
	supervised := p.supervised
	if corestore != nil {
		closers.push(func() { _ = corestore.Close() })
		supervised = append(supervised, corestore)
	}
	pluginStatuses := func() []plugin.Status {
		out := make([]plugin.Status, 0, len(supervised))
		for _, h := range supervised {
			out = append(out, h.Status())
		}
		return out
	}
	b.metrics.MustRegister(&plugin.StatusCollector{List: pluginStatuses})
	imageReleases := registry.NewReleases(b.st, nil)
	f.follows = registry.NewFollowWorker(registry.FollowWorkerConfig{Releases: imageReleases, Follower: newTagFollower(cfg, s.cat, c.deployer, log),
		Refusal: deploy.RefusalReason, Logger: log, Metrics: b.metrics})
	oci, err := newRegistry(ctx, cfg, s.blobStore, imageReleases, f.follows, s.tokens, s.reg, log)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	c.dep = deploy.New(deploy.Config{
		Catalog: s.cat, Runtime: c.runtime, Bundles: s.bundles, Secrets: p.sec, Bindings: binds, Policy: p.ext.policy, Releases: imageReleases, Manifests: oci,
		RegistryHost: publicHost(cfg.PublicURL), ACME: acmeChecker(c.acme), Events: s.evlog, Metrics: b.metrics, Logger: log,
	})
	f.gc = registry.NewCollector(oci, imageReleases, s.cat.ImagesInUse, registry.GCPolicy{})
	// Service backups (docs/backups.md): records and operations on this store, archives in the
	// blob store; a backup request backs up the bindings the service declares. With the
	// corestore plugin, its executor is the only runner node that claims them.
	bcfg := backups.Config{Store: b.st, Queue: p.orch.api.Operations, Blobs: s.blobStore, Events: s.evlog, Registerer: b.metrics, Log: log}
	if binds != nil {
		bcfg.ExecutorNode, bcfg.ProjectName = bindings.ExecutorNode, projectName(s.cat)
	}
	f.backups = backups.New(bcfg)
	f.api = api.New(api.Config{
		RegistryGC:    f.gc,
		Backups:       &api.BackupsConfig{Manager: f.backups, Bindings: bindingKinds(binds)},
		ImageReleases: imageReleases,
		Manifests:     oci,
		Secrets:       &api.SecretsConfig{Store: p.sec, Rewrap: p.rewrap.Kick},
		Catalog:       s.cat, Nodes: s.reg, Bundles: s.bundles, Tokens: s.tokens, Hinter: c.rec, Sessions: c.sessions, NodeOps: c.sessions, ShippedLogs: s.logs, Events: s.evlog, Changelog: s.clog,
		PublicURL: cfg.PublicURL, ServerFingerprint: b.tls.Fingerprint, PublicKeyPin: b.tls.PublicKeyPin, ClusterID: b.clusterID, ClusterPublicKey: b.key.Public().(ed25519.PublicKey), CurrentPublicKey: c.sessions.PublicKey,
		Logger: log, Metrics: b.metrics,
		Ready:  func(ctx context.Context) error { return b.st.Ping(ctx) },
		Policy: p.ext.policy, Routes: c.rec, KeyRotator: keyRotator{dataDir: cfg.DataDir, sessions: c.sessions},
		Orchestration: p.orch.api, Leases: c.leases, Guard: fencing.NewGuard(b.st, nil), ACME: acmeChecker(c.acme),
		// The release directory, and the binaries berthd was shipped with (beside its plugins):
		// upgrades and the setup scripts of join codes download from both (docs/joining.md).
		Releases:     releases.New(cfg.ReleaseDir).WithShipped(cfg.PluginDir),
		Plugins:      pluginStatuses,
		Bindings:     binds,
		Resources:    &api.ResourcesConfig{Manager: f.res, Types: p.providers.types.List},
		Runtime:      c.runtime,
		Idempotency:  idempotency.New(b.st),
		Certificates: certs.NewStatusReader(b.st),
		DNSRecords:   dnsrecords.NewReader(b.st),
		Deployer:     c.dep,
		Jobs:         c.jobs,
		Platform:     c.platform,
		Machines:     p.machines,
		Clusters:     s.clusters,
		RelaysRotated: func(cluster string) {
			if f.relays != nil {
				f.relays.rotated(cluster)
			}
		},
	})
	handler := withRegistry(withDashboard(f.api, ui.New(ui.Config{API: f.api, Metrics: b.metrics, Logger: log, Wake: dashboardFeed(b.st),
		Generation: ui.Generation(b.st.View(), dashboardCollections()...)})), oci)
	if f.relays, err = newRelayFront(s.clusters, handler, b.metrics, log); err != nil {
		return nil, fmt.Errorf("relay endpoint: %w", err)
	}
	closers.push(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.relays.close(ctx)
	})
	f.srv = &http.Server{
		Handler:           f.relays.wrap(handler),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{b.tls.Certificate}},
	}
	return f, nil
}

// dashboardFeed is the dashboard's change feed: a live page re-renders after a write to what its
// pages show (services, their workloads, slots and verdicts, nodes), not on a timer.
func dashboardFeed(st *store.Store) func(ctx context.Context) <-chan struct{} {
	return func(ctx context.Context) <-chan struct{} {
		return st.View().Notify(ctx, dashboardCollections()...)
	}
}
