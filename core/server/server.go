// Package server wires berthd: the store, identity, the API, node sessions,
// the reconciler and the gateway plugin, and runs them until shutdown.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
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
	Sweep slots.SweepConfig
	// LogRetention is how long and how much shipped workload log every project keeps
	// (docs/logs.md section 8); the zero value means logs.DefaultRetention.
	LogRetention logs.Retention
	// LogSweepInterval is the period of the log retention sweep; zero means 10 minutes.
	LogSweepInterval time.Duration
	Logger           *slog.Logger
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
	// HetznerConfig is a JSON file (owner-only) holding the Hetzner provider plugin's
	// configuration, its API token as token, token_file or token_secret_ref (docs/machines.md
	// section 5); empty runs no machine provider and refuses machine creates.
	HetznerConfig string
	// MachineJoinTimeout bounds how long a machine create waits for its node to enroll; zero
	// means 15 min.
	MachineJoinTimeout time.Duration
	// ResourceDriftInterval is how often each declared resource is read to find drift when its
	// type declares no interval (docs/resources.md section 4); zero means 5 minutes.
	ResourceDriftInterval time.Duration
}

// resourceWorkInterval is how often berthd's resource worker looks for due resource operations
// and runs a drift pass.
const resourceWorkInterval = time.Second

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
// order: stop accepting requests, end sessions, stop the background loops, let
// go of the gateway (which keeps serving its last route table for the next start
// to reattach: docs/plugins.md), close the store. Each part is built by a
// constructor of its own (setup.go); Run only starts and stops them.
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
	var closers closeStack
	defer closers.close()
	b, err := openBase(ctx, &cfg, ln, &closers)
	if err != nil {
		return err
	}
	st, err := openState(ctx, cfg, b, &closers)
	if err != nil {
		return err
	}
	pl, err := startParts(ctx, cfg, b, st, &closers)
	if err != nil {
		return err
	}
	ctl, err := newControl(ctx, cfg, b, st, pl, &closers)
	if err != nil {
		return err
	}
	front, err := newFront(ctx, cfg, b, st, pl, ctl, &closers)
	if err != nil {
		return err
	}

	// The platform tasks (docs/jobs.md section 10) run through one loop that records each pass.
	logSweep := cmp.Or(cfg.LogSweepInterval, 10*time.Minute)
	loops := []func(context.Context){ctl.rec.Run, ctl.jobs.Run, pl.orch.run, st.clog.Run, front.follows.Run,
		func(ctx context.Context) {
			ctl.platform.Every(ctx, "idempotency.expiry", api.DefaultIdempotencySweepInterval, time.Minute, front.api.IdempotencySweepPass)
		},
		func(ctx context.Context) {
			ctl.platform.Every(ctx, "registry.gc", registry.GCPeriod, registry.GCFirstPass, front.gc.Pass)
		},
		func(ctx context.Context) {
			ctl.platform.Every(ctx, "logs.retention", logSweep, logSweep, func(ctx context.Context) (time.Duration, error) {
				return st.logs.SweepPass(ctx, logSweep)
			})
		}}
	if front.binds != nil {
		loops = append(loops,
			func(ctx context.Context) { front.binds.Run(ctx, bindingWorkInterval) },
			func(ctx context.Context) {
				ctl.platform.Every(ctx, "backups.schedule", backups.TickInterval, backups.TickInterval, func(ctx context.Context) (time.Duration, error) {
					return front.backups.SchedulePass(ctx, st.cat, log)
				})
			})
	}
	loops = append(loops, func(ctx context.Context) { front.res.Run(ctx, resourceWorkInterval) })
	if pl.dns != nil {
		loops = append(loops, pl.dns.sync.Run)
	}
	if len(pl.machineProviders) > 0 {
		loops = append(loops, pl.machines.Run)
	}
	lctx, stopLoops := context.WithCancel(ctx)
	var running sync.WaitGroup
	for _, loop := range loops {
		running.Go(func() { loop(lctx) })
	}
	defer func() { stopLoops(); running.Wait() }()

	serveErr := make(chan error, 1)
	go func() { serveErr <- front.srv.ServeTLS(ln, "", "") }()
	log.Info("berthd ready", "api", cfg.PublicURL+"/api/v1", "gateway", cfg.GatewayListen, "data_dir", cfg.DataDir, "embedded_store", b.st.Embedded(), "cluster_id", b.clusterID)
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
		return fmt.Errorf("api server: %w", err)
	}
	log.Info("berthd shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctl.sessions.Close()
	if err := front.srv.Shutdown(sctx); err != nil {
		log.Warn("api shutdown", "err", err)
	}
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
