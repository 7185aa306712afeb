// Package server wires berthd: the store, identity, the API, node sessions,
// the reconciler and the gateway plugin, and runs them until shutdown.
package server

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/backup"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/releases"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/secrets/delivery"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/session"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/ui"
	"github.com/berthhq/berth/host/plugin"
)

// Config is berthd's configuration. Zero values take the documented defaults.
type Config struct {
	// DataDir holds keys, the admin token, the embedded store and blobs. Required.
	DataDir string
	// BootstrapAdmin and BootstrapPassword, when set, create the first human admin once per
	// cluster ([identity.Tokens.BootstrapAdmin]); never logged.
	BootstrapAdmin, BootstrapPassword string
	// Listen is the API address; default "127.0.0.1:7070".
	Listen string
	// GatewayListen is where the gateway plugin serves HTTP; default
	// "127.0.0.1:8080". "off" runs no gateway.
	GatewayListen string
	// GatewayTLSListen is where the gateway plugin serves HTTPS
	// (certificates from the route table, passthrough by SNI;
	// docs/plugins.md section 5.6); empty or "off" runs no TLS listener.
	GatewayTLSListen string
	// MongoURI selects a MongoDB server; empty runs the embedded store.
	MongoURI string
	// PublicURL is how nodes and the CLI reach the API, used in join commands;
	// default "https://" + the listen address.
	PublicURL string
	// PluginDir holds berth-plugin-* binaries; default the directory of the
	// running executable.
	PluginDir string
	// TLSCertFile and TLSKeyFile are an operator-supplied certificate (PEM,
	// leaf first) and its key; both empty means a self-signed certificate
	// generated at first start under DataDir/tls (docs/node-protocol.md section 2.2).
	TLSCertFile, TLSKeyFile string
	// ReleaseDir holds the Berth binaries offered to nodes by `berth node
	// upgrade`, named <program>-<version>-<os>-<arch> (docs/upgrades.md
	// section 3); empty offers none.
	ReleaseDir string
	// MaxBundleBytes bounds a release bundle; zero means 512 MiB.
	MaxBundleBytes int64
	// S3 puts the blob store (bundles, registry) in an S3 bucket; an empty
	// Endpoint keeps it on the filesystem under DataDir/blobs.
	S3 blobs.S3Config
	// Sweep is the reconcile pass timing (docs/reconciliation.md section 6); zero fields take
	// the defaults: quiet 1 s, period 30 s, floor 5 s.
	Sweep  slots.SweepConfig
	Logger *slog.Logger
	// Ready, when not nil, is called once the API listens and the gateway runs.
	Ready func(apiAddr string)
	// RunnerTransport serves /api/runner/v1 (docs/runner-protocol.md section 6); false answers
	// 404 on the whole prefix.
	RunnerTransport bool
	// RunnerRegistrationSecret is the legacy shared runner registration secret
	// (docs/runner-protocol.md section 6.4); empty leaves it off. Only its digest is kept.
	RunnerRegistrationSecret string
	// OrchestrationInterval is the period of the placement pass and operation sweep; zero means
	// DefaultOrchestrationInterval.
	OrchestrationInterval time.Duration
	// Keyring is the secrets keyring file (docs/secrets.md section 2); empty means
	// DataDir/keys/secrets.keyring, generated at first start while the store holds no secret.
	Keyring string
	// ACME configures the gateway's certificates (certs.go,
	// docs/certificates.md section 7); the zero value serves tls mode
	// manual only.
	ACME ACMEConfig
	// RewrapPerSecond bounds how many secrets a keyring rotation re-wraps per second; zero means
	// 100, negative no bound.
	RewrapPerSecond int
	// CorestoreConfig is the corestore plugin's configuration file (JSON, 0600; the servers it
	// manages and their admin credentials, docs/bindings.md section 5); empty runs no corestore
	// plugin and refuses services with bindings.
	CorestoreConfig string
	// DebugListen, when set, serves Go runtime profiles (/debug/pprof/) on
	// this loopback address; empty serves none.
	DebugListen string
	// DNSConfig is a JSON file (owner-only) holding the DNS provider plugin's configuration
	// (docs/dns.md section 4); empty runs no DNS plugin. EdgeAddresses are the IP addresses
	// the domains of `dns: managed` services point at (docs/dns.md section 7).
	DNSConfig     string
	EdgeAddresses []string
}

func (c *Config) defaults() error {
	if c.DataDir == "" {
		return errors.New("berthd: a data directory is required (--data-dir)")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7070"
	}
	if c.GatewayListen == "" {
		c.GatewayListen = "127.0.0.1:8080"
	}
	if c.PluginDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find plugin directory: %w", err)
		}
		c.PluginDir = filepath.Dir(exe)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkEdgeAddresses(c.EdgeAddresses); err != nil {
		return err
	}
	return checkS3Config(c.S3)
}

// Run starts berthd and blocks until ctx is cancelled, then shuts down in
// order: stop accepting requests, end sessions, let go of the gateway (which keeps
// serving its last route table for the next start to reattach: docs/plugins.md), close
// the store.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	log := cfg.Logger
	// Listen before anything else, so a taken port fails at once and leaves
	// no half-created data directory behind.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	if cfg.DebugListen != "" {
		stopDebug, err := startDebug(cfg.DebugListen, log)
		if err != nil {
			return err
		}
		defer stopDebug()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	unlock, err := store.LockDir(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("lock data directory %s (is another berthd using it?): %w", cfg.DataDir, err)
	}
	defer unlock()
	if _, err := os.Lstat(filepath.Join(cfg.DataDir, backup.IncompleteMarker)); err == nil {
		return fmt.Errorf("data directory %s holds %s: a restore into it did not finish; empty the directory and run berthd restore again (docs/operating.md section 5.2)", cfg.DataDir, backup.IncompleteMarker)
	}

	key, created, err := identity.LoadOrCreateSigningKey(cfg.DataDir)
	if err != nil {
		return err
	}
	if created {
		log.Info("cluster signing key created", "path", filepath.Join(cfg.DataDir, "keys"))
	}
	clusterID, _, err := identity.ClusterID(cfg.DataDir)
	if err != nil {
		return err
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
	servTLS, err := identity.LoadOrCreateServerTLS(cfg.DataDir, cfg.TLSCertFile, cfg.TLSKeyFile, tlsHosts)
	if err != nil {
		return err
	}
	if servTLS.Created {
		log.Info("self-signed TLS certificate created", "path", filepath.Join(cfg.DataDir, identity.TLSCertFile))
	}
	log.Info("serving TLS", "fingerprint", servTLS.Fingerprint, "fingerprint_file", filepath.Join(cfg.DataDir, identity.FingerprintFile))

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	st, err := store.Open(ctx, store.Config{URI: cfg.MongoURI, DataDir: cfg.DataDir, Logger: log, Metrics: metrics})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := st.Close(cctx); err != nil {
			log.Warn("close store", "err", err)
		}
	}()

	// Each login's argon2id verification holds 64 MiB and a CPU: run as many at once as an
	// eighth of memory holds, at most 4 per CPU (docs/api.md section 9.2).
	loginSlots := identity.LoginConcurrencyFor(machineMemory(), runtime.GOMAXPROCS(0))
	log.Info("login verifications bounded", "at_once", loginSlots)
	tokens := identity.NewTokens(st, identity.WithLoginConcurrency(loginSlots))
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
		// Shown once; the file keeps it for the operator (0600).
		fmt.Fprintf(os.Stderr, "\nAdmin token (shown once; also in %s):\n  %s\n\n", filepath.Join(cfg.DataDir, "admin-token"), adminToken)
	}

	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		return err
	}
	if err := cat.EnsureIndexes(ctx); err != nil {
		return err
	}
	if err := reg.MarkAllDisconnected(ctx); err != nil {
		return err
	}
	clog := changelog.New(st, 1, nil).WithLogger(log)
	// Writes that record their change in the written document's outbox
	// (docs/node-protocol.md section 7.2); what a stopped berthd left there
	// is appended before this one serves a write.
	clog.TrackOutbox("projects", "")
	clog.TrackOutbox("bundles", "")
	clog.TrackOutbox(registry.ReleasesCollection, "")
	clog.TrackOutbox("services", "")
	clog.TrackOutbox("nodes", "")
	clog.TrackOutbox("runtime_specs", "")
	clog.TrackOutbox(policy.DecisionsCollection, "seq")
	clog.TrackOutbox(policy.BindingsCollection, "")
	clog.TrackOutbox(fencing.Collection, "")
	clog.TrackOutbox(identity.UsersCollection, "")
	clog.TrackOutbox(identity.TokensCollection, "")
	clog.TrackOutbox(identity.TokenNamesCollection, "")
	clog.TrackOutbox(secrets.Collection, "")
	clog.TrackOutbox(secrets.SetsCollection, "")
	// An embedded store has this one process (it holds the data directory's
	// lock): everything pending is a leftover. Against a shared MongoDB,
	// another replica may be appending its young changes right now.
	var recoverAge time.Duration
	if !st.Embedded() {
		recoverAge = changelog.RecoverAge
	}
	rcctx, rccancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = clog.RecoverOlderThan(rcctx, recoverAge)
	rccancel()
	if err != nil {
		return err
	}
	evlog := events.New(st, nil)
	if err := evlog.EnsureIndexes(ctx); err != nil {
		return err
	}
	blobStore, stopMigrate, err := openBlobs(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stopMigrate()
	blobs, err := bundles.NewWithBlobs(blobStore, filepath.Join(cfg.DataDir, "blobs", ".incoming"), st.Collection("bundles"), cfg.MaxBundleBytes)
	if err != nil {
		return err
	}
	// The corestore plugin's backup executor is a runner node, so bindings need the transport.
	orch, err := newOrchestration(ctx, st, blobs, cfg.RunnerTransport || cfg.CorestoreConfig != "", cfg.OrchestrationInterval, log)
	if err != nil {
		return err
	}
	if err := orch.legacy(cfg.RunnerRegistrationSecret); err != nil {
		return err
	}
	ext, err := startExtensions(ctx, cfg.DataDir, st, blobs, clog, metrics, log)
	if err != nil {
		return err
	}
	defer ext.close()

	var gw reconciler.RouteSink
	var gwHandle *plugin.Provider
	if cfg.GatewayListen != "off" {
		sink, err := startGateway(ctx, cfg, log)
		if err != nil {
			return err
		}
		// The gateway outlives berthd (docs/plugins.md section 5.3): on the
		// way out berthd lets go of it, and the next start reattaches.
		defer sink.p.Detach()
		gw, gwHandle = sink, sink.p
		metrics.MustRegister(newGatewayCollector(sink.metricsSocket, log))
	}

	var rec *reconciler.Reconciler
	// The deployer needs parts made below (the bindings, the registry); the reconciler, the
	// bindings and the registry reach it through this, once it is made.
	var dep *deploy.Deployer
	deployer := func() *deploy.Deployer { return dep }
	retired, err := identity.RetiredSigningKeys(cfg.DataDir)
	if err != nil {
		return err
	}
	sec, err := openSecrets(ctx, cfg, st, log)
	if err != nil {
		return err
	}
	rewrapCtx, stopRewrap := context.WithCancel(ctx)
	defer stopRewrap()
	// Stored certificates are sealed under the same keyring, whether or not ACME is on now.
	rewrapper := newRewrapper(rewrapCtx, sec, cfg.RewrapPerSecond, log, certs.NewStorage(st, sec.Keyring(), nil, log, nil))
	rewrapper.Kick() // resumes a rotation an earlier berthd did not finish

	// The DNS plugin and the records it writes (docs/dns.md section 9).
	dnsPart, err := startDNS(ctx, cfg, st, orch.api.Operations, cat, reg, sec, log)
	if err != nil {
		return err
	}
	if dnsPart != nil {
		defer dnsPart.close()
		dctx, stopDNS := context.WithCancel(ctx)
		dnsDone := make(chan struct{})
		go func() { defer close(dnsDone); dnsPart.run(dctx) }()
		defer func() { stopDNS(); <-dnsDone }()
	}
	cfg.ACME = withDNS01(cfg.ACME, dnsPart, log)

	leases := fencing.New(st, fencing.Config{Logger: log})
	var dnsChallenges session.DNSChallenger
	if dnsPart != nil {
		dnsChallenges = dnsPart.records
	}
	sessions := session.New(session.Config{
		DNS:    dnsChallenges,
		Leases: leases, Nodes: reg, Catalog: cat, SigningKey: key, RetiredKeys: retired, ClusterID: clusterID, Logger: log, Events: evlog, Changelog: clog,
		OnChange: func(reason string) {
			// A session's start or end changes which nodes are schedulable: any service's
			// placement may move, which is the full pass's work.
			if reason != "status_report" {
				rec.Hint(reason)
			}
		},
		OnNodeChange: func(reason, nodeID string) {
			// A status report moves the node's workloads (observations, receipts): their
			// services' work runs at once. A session's start or end changes nothing a focused
			// pass would do (the session sends the desired state at hello itself), and a
			// thousand nodes reconnecting must not each cost one.
			if reason == "status_report" {
				rec.HintNode(reason, nodeID)
			}
		},
		Metrics: metrics,
	})
	routeSink, stopCerts, err := startCerts(cfg.ACME, st, sec, cat, gw, evlog, metrics, log)
	if err != nil {
		return err
	}
	defer stopCerts()
	rec = reconciler.New(reconciler.Config{
		Catalog: cat, Nodes: reg, Pusher: sessions, Routes: routeSink, Compiler: ext.compiler,
		Admit: policy.Deploy{Engine: ext.policy}, Logger: log, Sweep: cfg.Sweep,
		Leases: leases, LeaseSender: sessions, Secrets: &delivery.Sealer{Secrets: sec}, Events: evlog, Metrics: metrics,
		RollBack: func(ctx context.Context, svc *services.Service) (*services.Service, error) {
			return deployer().RollBack(ctx, svc)
		},
	})

	for kind, count := range map[string]func() int64{
		"full":    func() int64 { return rec.Stats().Full },
		"focused": func() int64 { return rec.Stats().Focused },
	} {
		metrics.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "berth_reconcile_passes_total", ConstLabels: prometheus.Labels{"kind": kind},
			Help: "Reconcile passes run: full (the sweep) or focused (woken by a service's or node's change).",
		}, func() float64 { return float64(count()) }))
	}

	// The provider plugins berthd supervises, each in GET /api/v1/plugins and the
	// berth_plugin_* metrics: the gateway, the DNS plugin and the corestore plugin, those
	// configured.
	var supervised []*plugin.Provider
	if gwHandle != nil {
		supervised = append(supervised, gwHandle)
	}
	if dnsPart != nil {
		supervised = append(supervised, dnsPart.handle)
	}
	exec := executorAccess{runners: orch.api.Runners, url: loopbackURL(ln.Addr()), fingerprint: servTLS.Fingerprint}
	binds, corestoreHandle, err := startBindings(ctx, cfg, st, sec, cat, deployer, exec, func(reason, id string) {
		if rec != nil {
			rec.HintService(reason, id)
		}
	}, log)
	if err != nil {
		return err
	}
	if corestoreHandle != nil {
		defer corestoreHandle.Close()
		supervised = append(supervised, corestoreHandle)
	}
	pluginStatuses := func() []plugin.Status {
		out := make([]plugin.Status, 0, len(supervised))
		for _, h := range supervised {
			out = append(out, h.Status())
		}
		return out
	}
	metrics.MustRegister(&plugin.StatusCollector{List: pluginStatuses})
	imageReleases := registry.NewReleases(st.Collection(registry.ReleasesCollection), nil)
	oci, err := newRegistry(ctx, cfg, blobStore, imageReleases, tokens, reg, log, deployOnPush(cfg, deployer, rec, log))
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	dep = deploy.New(deploy.Config{
		Catalog: cat, Bundles: blobs, Secrets: sec, Bindings: binds, Policy: ext.policy, Releases: imageReleases, Manifests: oci,
		RegistryHost: publicHost(cfg.PublicURL), ACME: acmeChecker(cfg.ACME), Events: evlog, Metrics: metrics, Logger: log,
	})
	gc := registry.NewCollector(oci, imageReleases, cat.ImagesInUse, registry.GCPolicy{})
	// Service backups (docs/backups.md): records and operations on this store, archives in the
	// blob store; a backup request backs up the bindings the service declares.
	// With the corestore plugin, its executor is the only runner node that claims them.
	bcfg := backups.Config{Store: st, Queue: orch.api.Operations, Blobs: blobStore, Events: evlog, Registerer: metrics, Log: log}
	if binds != nil {
		bcfg.ExecutorNode, bcfg.ProjectName = corestoreExecutorNode, projectName(cat)
	}
	backupMgr := backups.New(bcfg)
	handler := api.New(api.Config{
		RegistryGC:    gc,
		Backups:       &api.BackupsConfig{Manager: backupMgr, Bindings: bindingKinds(binds)},
		ImageReleases: imageReleases,
		Manifests:     oci,
		Secrets:       &api.SecretsConfig{Store: sec, Rewrap: rewrapper.Kick},
		Catalog:       cat, Nodes: reg, Bundles: blobs, Tokens: tokens, Hinter: rec, Sessions: sessions, NodeOps: sessions, Events: evlog, Changelog: clog,
		PublicURL: cfg.PublicURL, ServerFingerprint: servTLS.Fingerprint, ClusterID: clusterID, ClusterPublicKey: key.Public().(ed25519.PublicKey), CurrentPublicKey: sessions.PublicKey,
		Logger: log, Metrics: metrics,
		Ready:  func(ctx context.Context) error { return st.Ping(ctx) },
		Policy: ext.policy, Routes: rec, KeyRotator: keyRotator{dataDir: cfg.DataDir, sessions: sessions},
		Orchestration: orch.api, Leases: leases, Guard: fencing.NewGuard(st, nil), ACME: acmeChecker(cfg.ACME),
		Releases: releases.New(cfg.ReleaseDir),
		Plugins:  pluginStatuses,
		Bindings: binds,
		Deployer: dep,
	})
	dashboard := ui.New(ui.Config{API: handler, Metrics: metrics, Logger: log})
	srv := &http.Server{
		Handler:           withRegistry(withDashboard(handler, dashboard), oci),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	rctx, stopRec := context.WithCancel(ctx)
	recDone := make(chan struct{})
	go func() { defer close(recDone); rec.Run(rctx) }()
	orchDone := make(chan struct{})
	go func() { defer close(orchDone); orch.run(rctx) }()
	bindDone := make(chan struct{})
	go func() {
		defer close(bindDone)
		if binds != nil {
			binds.Run(rctx, bindingWorkInterval)
		}
	}()
	idemDone := make(chan struct{})
	go func() { defer close(idemDone); handler.RunIdempotencySweep(rctx, 0) }()
	clogDone := make(chan struct{})
	go func() { defer close(clogDone); clog.Run(rctx) }()
	gcDone := make(chan struct{})
	go func() { defer close(gcDone); gc.Run(rctx) }()
	schedDone := make(chan struct{})
	go func() {
		defer close(schedDone)
		if binds != nil {
			runBackupSchedules(rctx, backupMgr, cat, log)
		}
	}()

	serveErr := make(chan error, 1)
	srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{servTLS.Certificate}}
	go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	log.Info("berthd ready", "api", cfg.PublicURL+"/api/v1", "gateway", cfg.GatewayListen, "data_dir", cfg.DataDir, "embedded_store", st.Embedded(), "cluster_id", clusterID)
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	// Start-up (the store's recovery, compiling WebAssembly modules, launching plugins) peaks
	// far above what berthd holds once running; hand that garbage back to the system now
	// instead of over the minutes the runtime's background scavenger would take.
	debug.FreeOSMemory()

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		stopRec()
		<-recDone
		<-orchDone
		<-bindDone
		<-idemDone
		<-clogDone
		<-gcDone
		<-schedDone
		return fmt.Errorf("api server: %w", err)
	}
	log.Info("berthd shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sessions.Close()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("api shutdown", "err", err)
	}
	stopRec()
	<-recDone
	<-orchDone
	<-bindDone
	<-idemDone
	<-clogDone
	<-gcDone
	<-schedDone
	return nil
}

// projectName names a project by id (a scan of the few projects).
func projectName(cat *services.Catalog) func(ctx context.Context, id string) (string, error) {
	return func(ctx context.Context, id string) (string, error) {
		ps, err := cat.ListProjects(ctx)
		if err != nil {
			return "", err
		}
		for _, p := range ps {
			if p.ID == id {
				return p.Name, nil
			}
		}
		return "", fmt.Errorf("project %s: %w", id, services.ErrProjectNotFound)
	}
}

// loopbackURL is the API's https URL on loopback for a listener at addr (an unspecified
// host becomes 127.0.0.1), for processes berthd starts on its own machine.
func loopbackURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "https://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "https://" + net.JoinHostPort(host, port)
}

// bindingKinds tells the backup routes which bindings a service has (name to
// kind), from the core's bindings; nil (no corestore plugin) leaves none.
func bindingKinds(binds *bindings.Manager) api.BindingKinds {
	if binds == nil {
		return nil
	}
	return api.BindingKindsFunc(func(ctx context.Context, projectID, service string) (map[string]abibackups.Kind, error) {
		list, err := binds.List(ctx, projectID, service)
		if err != nil {
			return nil, err
		}
		kinds := make(map[string]abibackups.Kind, len(list))
		for _, b := range list {
			kinds[b.Name] = abibackups.Kind(b.Kind)
		}
		return kinds, nil
	})
}
