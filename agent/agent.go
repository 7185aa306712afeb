// Package agent is the Berth node agent: enrollment, and the wiring of the
// local store, node session, reconcile loop and health checks around one runtime driver.
package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/agent/metrics"
	"github.com/berthhq/berth/agent/reconcile"
	"github.com/berthhq/berth/agent/session"
	"github.com/berthhq/berth/agent/upgrade"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/client"
)

// ErrRestart is returned by [Agent.Run] when the agent stopped to restart
// itself: its binary was upgraded, or an unconfirmed upgrade was rolled back
// (docs/upgrades.md section 3). The caller releases everything and
// re-executes the binary at the same path.
var ErrRestart = errors.New("berth: the agent stops to restart itself after an upgrade or a rollback")

// ErrRemoved is returned by [Agent.Run] when the node was removed from the
// cluster (docs/node-protocol.md section 10): the core ended the session with
// node_removed, now or before. The agent never dials again from this data
// directory; workloads keep running, and a new enrollment needs a new one.
var ErrRemoved = errors.New("berth: this node was removed from the cluster; enroll it anew with a new data directory to use it again")

// ErrPinMismatch is returned by [Agent.Run] when berthd kept presenting a TLS
// certificate other than the one pinned at enrollment (docs/node-protocol.md
// section 2.2): the core was re-created, its certificate replaced, or
// something sits in the middle. A pin never changes by itself, so the agent
// stops dialling; workloads keep running on the stored snapshot.
var ErrPinMismatch = errors.New("berth: berthd's certificate does not match the fingerprint pinned at enrollment; " +
	"if the core was re-created or its certificate replaced, stop this agent, remove the node (berth node remove ID) " +
	"and enroll again with a new join command into a fresh --data-dir; otherwise something sits between this node and berthd")

// Config configures an Agent. DataDir and Driver are required.
type Config struct {
	DataDir string         // the enrolled data directory
	Driver  runtime.Driver // the runtime driver; the Agent never closes it
	Logger  *slog.Logger   // nil means slog.Default()
	// AgentVersion is reported in hello; empty means the version stamped
	// into this build (internal/version).
	AgentVersion string
	// HTTPClient carries the session and bundle downloads; nil means a client
	// that pins the certificate fingerprint stored at enrollment (or trusts the
	// system CAs when none was given).
	HTTPClient *http.Client
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// PollInterval is how often the driver is polled for exits; zero means 1 s.
	PollInterval time.Duration
	// BackoffMin and BackoffMax bound the session redial backoff; zero means 1 s and 60 s.
	BackoffMin, BackoffMax time.Duration
	// Network attaches container workloads to the node network
	// (docs/plugins.md section 7); nil runs them in the node's network
	// namespace. The caller restores its guard before Run.
	Network reconcile.Network
	// WorkloadUser is [reconcile.Config.WorkloadUser]: the host user process workloads run as
	// when their service names none; empty runs them as the agent's own user.
	WorkloadUser string
	// FenceGrace and FenceForce bound the graceful and the forced stop of a
	// local lease's self-fence; zero means lease.DefaultLocalGrace and
	// lease.DefaultLocalForce. Expiring leases always use M/2 each
	// (docs/node-protocol.md section 8.5).
	FenceGrace, FenceForce time.Duration
	// SelfUpgrade, when not nil, lets the core upgrade this agent's binary
	// in place with agent_upgrade (docs/upgrades.md section 3); nil refuses
	// it with unimplemented.
	SelfUpgrade *SelfUpgrade
	// Resources are the extended resources the operator declares and what the
	// host keeps ([Resources]); the zero value declares and keeps nothing. The
	// node reports [Allocatable] of them in hello and status reports.
	Resources Resources
	// NoLogShipping turns off shipping sealed log segments to berthd (docs/logs.md section 6);
	// a removed workload's log is then deleted with it, apart from what --previous keeps.
	NoLogShipping bool
	// Metrics, when not nil, gets the agent's counters (berth_log_bytes_shipped_total,
	// berth_log_segments_dropped_total); nil counts without exposing them.
	Metrics prometheus.Registerer
}

// SelfUpgrade says which binaries an agent replaces when upgraded.
type SelfUpgrade struct {
	// Path is the absolute path of the running agent binary, resolved
	// before anything could replace it.
	Path string
	// DriverPath, when not empty, is the absolute path of the runtime
	// driver plugin's binary: agent_upgrade of "berth-plugin-<driver>"
	// replaces it, and the agent restarts to relaunch it.
	DriverPath string
	// NetworkPath, when not empty, is the absolute path of the node-network
	// plugin's binary (Config.Network must then name its plugin, see
	// [NetworkDescriber]): agent_upgrade of "berth-plugin-<network>"
	// replaces it, and the agent restarts to relaunch it, whose Setup
	// restores the node network (docs/upgrades.md section 3.5).
	NetworkPath string
	// ConfirmWindow is how long a new version has to be welcomed by the core
	// before it rolls back to the previous binary; zero means
	// upgrade.DefaultConfirmWindow.
	ConfirmWindow time.Duration
}

// NetworkDescriber is the optional interface of a [Config.Network] backed by
// a node-network plugin: Describe returns the plugin's name and version,
// which the agent reports in hello (network_versions) and probe, and under
// which it offers the plugin's in-place upgrade (docs/upgrades.md section
// 3.5). A Network without it is reported as no network plugin.
type NetworkDescriber interface {
	Describe(ctx context.Context) (*network.DescribeResponse, error)
}

// Agent runs one enrolled node. Create it with [New], run it with [Agent.Run],
// release it with [Agent.Close].
type Agent struct {
	cfg      Config
	log      *slog.Logger
	store    *localstore.Store
	id       *localstore.Identity
	key      ed25519.PublicKey
	capacity node.Resources
	closeMu  sync.Mutex
	closed   bool
}

// allocatable is what the node reports it can give to workloads ([Allocatable]).
func (a *Agent) allocatable() *node.Allocatable {
	al := Allocatable(a.cfg.DataDir, a.cfg.Resources)
	return &al
}

// New opens the local store of cfg.DataDir and reads the enrollment. It
// returns an error wrapping [localstore.ErrNotEnrolled] when the directory was
// never enrolled.
func New(cfg Config) (*Agent, error) {
	if cfg.DataDir == "" || cfg.Driver == nil {
		return nil, errors.New("agent: DataDir and Driver are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AgentVersion == "" {
		cfg.AgentVersion = version.Version
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("agent: data directory: %w", err)
	}
	cfg.DataDir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	id, err := store.Identity(ctx)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("agent: data directory %s: %w", dir, err)
	}
	key, err := parseClusterKey(id.ClusterPublicKey)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("agent: stored %w", err)
	}
	if cfg.HTTPClient == nil {
		// Every call to berthd pins the certificate of the join command
		// (docs/node-protocol.md section 2.2).
		pin, _, err := store.Meta(ctx, localstore.MetaServerFingerprint)
		if err == nil {
			cfg.HTTPClient, err = client.PinnedHTTPClient(pin)
		}
		if err != nil {
			_ = store.Close()
			return nil, fmt.Errorf("agent: server pin: %w", err)
		}
	}
	return &Agent{cfg: cfg, log: cfg.Logger, store: store, id: id, key: key, capacity: DetectCapacity()}, nil
}

// registryCredential returns the node's pull credential for Berth's registry
// at the host of the server URL (docs/registry.md section 9): the node
// credential as the secret, pinned to the certificate fingerprint stored at
// enrollment (none: system CAs), plain HTTP only for an http:// server.
func (a *Agent) registryCredential(ctx context.Context) (*runtime.RegistryCredential, error) {
	u, err := url.Parse(a.id.ServerURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: not an absolute URL", a.id.ServerURL)
	}
	pin, _, err := a.store.Meta(ctx, localstore.MetaServerFingerprint)
	if err != nil {
		return nil, fmt.Errorf("server pin: %w", err)
	}
	return &runtime.RegistryCredential{Host: u.Host, Username: "node", Secret: a.id.Credential,
		Fingerprint: pin, PlainHTTP: u.Scheme == "http"}, nil
}

// NodeID returns the enrolled node id.
func (a *Agent) NodeID() string { return a.id.NodeID }

// Close closes the local store. Workloads and the driver are not touched. Idempotent.
func (a *Agent) Close() error {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	return a.store.Close()
}

// Run runs the node until ctx ends:
//
//  1. Describe the driver, Recover every workload whose driver handle the
//     local store holds, and List the driver's workloads: those that
//     survived an agent or driver restart are adopted as they run, never
//     restarted.
//  2. Run the reconcile loop against the newest stored snapshot (it works
//     without a session, section 6.5).
//  3. Keep the node session up; each newly stored snapshot wakes the loop, and
//     each changed status report is sent.
//
// A fatal error from the core stops the session (logged) but not the loop.
// Run returns nil when ctx ends, [ErrRemoved] when the node was removed
// (now or before), and an error wrapping [ErrPinMismatch] (and
// client.ErrFingerprintMismatch) when berthd kept presenting a certificate
// other than the pinned one; workloads keep running in every case.
func (a *Agent) Run(ctx context.Context) error {
	if at, removed, err := a.store.Meta(ctx, localstore.MetaRemovedAt); err != nil {
		return fmt.Errorf("agent: %w", err)
	} else if removed {
		return fmt.Errorf("agent: removed at %s: %w", at, ErrRemoved)
	}
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var stopErr error
	desc, err := a.cfg.Driver.Describe(ctx)
	if err != nil {
		return fmt.Errorf("agent: describe driver: %w", err)
	}
	var netDesc *network.DescribeResponse
	if nd, ok := a.cfg.Network.(NetworkDescriber); ok {
		if netDesc, err = nd.Describe(ctx); err != nil {
			return fmt.Errorf("agent: describe the network plugin: %w", err)
		}
	}
	a.recoverWorkloads(ctx, desc.Name)
	existing, err := a.cfg.Driver.List(ctx)
	if err != nil {
		return fmt.Errorf("agent: list driver workloads: %w", err)
	}
	running := 0
	for _, w := range existing {
		if w != nil && w.State == runtime.StateRunning {
			running++
		}
	}
	a.log.Info("runtime driver ready", "driver", desc.Name, "driver_version", desc.Version,
		"workloads_found", len(existing), "running", running, "node_id", a.id.NodeID)
	if lim := desc.Capabilities.ResourceLimits; lim != runtime.LimitsCgroup2 && lim != runtime.LimitsCgroup1 && lim != runtime.LimitsContainer {
		// Said once per run; the node reports it too (resource_limits), so operators see it.
		a.log.Warn("workload memory and CPU limits are not enforced on this node: workloads run unlimited", "driver", desc.Name, "resource_limits", lim)
	}

	bundleOpts := []client.Option{client.WithToken(a.id.Credential)}
	if a.cfg.HTTPClient != nil {
		bundleOpts = append(bundleOpts, client.WithHTTPClient(a.cfg.HTTPClient))
	}
	bundles, err := client.New(a.id.ServerURL, bundleOpts...)
	if err != nil {
		return fmt.Errorf("agent: bundle client: %w", err)
	}

	var up, pluginUp, netUp *upgrade.Manager
	if su := a.cfg.SelfUpgrade; su != nil {
		up, err = upgrade.New(upgrade.Config{
			Path: su.Path, DataDir: a.cfg.DataDir, Program: "berth-agent", Version: a.cfg.AgentVersion,
			Fetch: bundles.OpenRelease, ConfirmWindow: su.ConfirmWindow, Now: a.cfg.Now,
			Logger: a.log.With("component", "upgrade"),
		})
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		act, err := up.Resume()
		if err != nil {
			a.log.Error("settle the upgrade record", "error", err)
		}
		switch act {
		case upgrade.Restart:
			return ErrRestart
		case upgrade.AwaitConfirm:
			t := time.AfterFunc(up.ConfirmWindow(), func() {
				if _, err := up.RollBack(); err != nil {
					a.log.Error("roll back the unconfirmed upgrade", "error", err)
				}
			})
			defer t.Stop()
		}
		var stop func()
		if su.DriverPath != "" {
			if pluginUp, stop, err = a.pluginUpgrade(su, su.DriverPath, "berth-plugin-"+desc.Name, desc.Version, bundles); err != nil {
				return err
			}
			defer stop()
		}
		if su.NetworkPath != "" && netDesc != nil {
			if netUp, stop, err = a.pluginUpgrade(su, su.NetworkPath, "berth-plugin-"+netDesc.Name, netDesc.Version, bundles); err != nil {
				return err
			}
			defer stop()
		}
	}

	// The metrics ring lives in memory only (docs/node-protocol.md section 5.17).
	ring := metrics.New(metrics.Config{Workloads: workloadStats(a.cfg.Driver), Now: a.cfg.Now})
	var sess *session.Client
	var loop *reconcile.Loop
	// Leases and self-fencing (docs/node-protocol.md section 8): restored
	// before anything starts, so a lease that expired while the agent was
	// down is fenced and nothing stateful starts under it.
	leases, err := lease.New(ctx, lease.Config{
		Store:      a.store,
		Driver:     a.cfg.Driver,
		NodeID:     a.id.NodeID,
		Now:        a.cfg.Now,
		LocalGrace: a.cfg.FenceGrace,
		LocalForce: a.cfg.FenceForce,
		Logger:     a.log.With("component", "lease"),
		Emit: func(ctx context.Context, ev node.Event) error {
			if err := a.bufferEvent(ctx, ev); err != nil {
				return err
			}
			if sess != nil {
				sess.EventsPending()
			}
			return nil
		},
		OnChange: func() {
			if loop != nil {
				loop.Wake()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	observed := make(chan struct{}, 1)
	var shipper *LogShipper
	if !a.cfg.NoLogShipping {
		// The session is made below; the shipper reaches it through this closure.
		shipper = NewLogShipper(a.cfg.DataDir, func(ctx context.Context, m node.LogSegment) (node.LogSegmentAck, error) {
			return sess.ShipLogSegment(ctx, m)
		}, a.log.With("component", "logship"), a.cfg.Metrics)
	}
	registryCred, err := a.registryCredential(ctx)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	loop, err = reconcile.New(reconcile.Config{
		ShipLogs:     !a.cfg.NoLogShipping,
		Registry:     registryCred,
		Network:      a.cfg.Network,
		WorkloadUser: a.cfg.WorkloadUser,
		Leases:       leases,
		Store:        a.store,
		Driver:       a.cfg.Driver,
		DriverName:   desc.Name,
		Bundles:      bundles,
		DataDir:      a.cfg.DataDir,
		Address:      a.id.Address,
		Logger:       a.log.With("component", "reconcile"),
		Now:          a.cfg.Now,
		PollInterval: a.cfg.PollInterval,
		OnStatusChange: func() {
			if shipper != nil {
				shipper.Wake()
			}
			if sess != nil {
				sess.ReportStatus()
			}
			select {
			case observed <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	sess, err = session.New(session.Config{
		ServerURL:    a.id.ServerURL,
		Credential:   a.id.Credential,
		ClusterKey:   a.key,
		Store:        a.store,
		AgentVersion: a.cfg.AgentVersion,
		Hello: func(ctx context.Context) (node.Hello, error) {
			stored, err := a.store.StoredRev(ctx)
			if err != nil {
				return node.Hello{}, err
			}
			applied, err := a.store.AppliedRev(ctx)
			if err != nil {
				return node.Hello{}, err
			}
			dropped, err := a.store.DroppedEvents(ctx)
			if err != nil {
				return node.Hello{}, err
			}
			logSeq, logHash, err := a.store.LogHead(ctx)
			if err != nil {
				return node.Hello{}, err
			}
			h := node.Hello{
				NodeID: a.id.NodeID, AgentVersion: a.cfg.AgentVersion, BootID: bootID(),
				StoredRev: stored, AppliedRev: applied, Capacity: a.capacity, Drivers: []string{desc.Name},
				DriverVersions: map[string]string{desc.Name: desc.Version}, DroppedEvents: dropped,
				LogSeq: logSeq, LogHash: logHash, Leases: leases.Hello(),
				Allocatable: a.allocatable(), ResourceLimits: desc.Capabilities.ResourceLimits,
			}
			if netDesc != nil {
				h.NetworkVersions = map[string]string{netDesc.Name: netDesc.Version}
			}
			return h, nil
		},
		Status: func(ctx context.Context) (node.StatusReport, error) {
			rep, err := loop.Status(ctx)
			rep.Capacity = a.capacity
			rep.DiskFreeGB = diskFreeGB(a.cfg.DataDir)
			rep.Allocatable, rep.ResourceLimits = a.allocatable(), desc.Capabilities.ResourceLimits
			return rep, err
		},
		OnStored: func(int64) { loop.Wake() },
		OnWelcome: func() {
			for _, m := range []*upgrade.Manager{up, pluginUp, netUp} {
				if m != nil {
					if err := m.Confirm(); err != nil {
						a.log.Error("confirm the upgraded version", "error", err)
					}
				}
			}
		},
		Events: a.store,
		Log:    a.store,
		Keys:   a.store,
		Commands: &commands{driver: a.cfg.Driver, ring: ring, now: a.cfg.Now, leases: leases, dataDir: a.cfg.DataDir,
			upgrade: up, plugin: pluginUp, pluginName: "berth-plugin-" + desc.Name,
			network: netDesc, netPlugin: netUp},
		Leases:     leases,
		HTTPClient: a.cfg.HTTPClient,
		Logger:     a.log.With("component", "session"),
		Now:        a.cfg.Now,
		BackoffMin: a.cfg.BackoffMin,
		BackoffMax: a.cfg.BackoffMax,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}

	var restarting atomic.Bool
	for _, m := range []*upgrade.Manager{up, pluginUp, netUp} {
		if m == nil {
			continue
		}
		go func() {
			select {
			case <-ctx.Done():
			case <-m.RestartRequested():
				restarting.Store(true)
				stopAll()
			}
		}()
	}
	var wg sync.WaitGroup
	if shipper != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shipper.Run(ctx)
		}()
	}
	wg.Add(5)
	go func() {
		defer wg.Done()
		_ = leases.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		ring.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		a.watchObserved(ctx, loop, observed, sess)
	}()
	go func() {
		defer wg.Done()
		_ = loop.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		err := sess.Run(ctx)
		var fatal *session.FatalError
		if errors.As(err, &fatal) && fatal.Code == string(berrors.NodeRemoved) {
			// Section 10: stop for good, leave the workloads running.
			if err := a.store.SetMeta(context.WithoutCancel(ctx), localstore.MetaRemovedAt, a.cfg.Now().UTC().Format(time.RFC3339)); err != nil {
				a.log.Error("record the node's removal", "error", err)
			}
			a.log.Error("this node was removed from the cluster; stopping for good, workloads keep running")
			stopErr = ErrRemoved
			stopAll()
			return
		}
		if errors.Is(err, client.ErrFingerprintMismatch) && ctx.Err() == nil {
			a.log.Error("berthd's certificate does not match the pinned fingerprint; stopping, workloads keep running", "error", err)
			stopErr = fmt.Errorf("agent: %w (%w)", ErrPinMismatch, err)
			stopAll()
			return
		}
		if err != nil && ctx.Err() == nil {
			a.log.Error("node session stopped; workloads keep running on the stored snapshot", "error", err)
		}
	}()
	wg.Wait()
	if stopErr != nil {
		return stopErr
	}
	if restarting.Load() {
		return ErrRestart
	}
	return nil
}

// recoverWorkloads gives the loaded driver (Describe name driver) back the
// handle of every workload whose record names it as the driver that started
// it (docs/plugins.md section 3.3), so that a driver that lost its own
// records finds them again. Failures are logged: a workload the driver
// cannot find is started again by the reconcile loop. A handle of another
// driver is not given to this one, which could not read it: the workload
// is reported as not recovered (the log, its status message and a
// workload.unrecovered event), since it may still run under that driver.
func (a *Agent) recoverWorkloads(ctx context.Context, driver string) {
	recs, err := a.store.Workloads(ctx)
	if err != nil {
		a.log.Warn("cannot read workload records to recover them", "error", err)
		return
	}
	for _, r := range recs {
		if r.DriverHandle.Version == 0 {
			continue
		}
		if r.Driver != "" && r.Driver != driver {
			a.reportUnrecovered(ctx, r, driver)
			continue
		}
		st, err := a.cfg.Driver.Recover(ctx, &runtime.RecoverRequest{WorkloadID: r.WorkloadID,
			Handle: runtime.Handle{Version: r.DriverHandle.Version, Data: r.DriverHandle.Data}})
		switch {
		case errors.Is(err, runtime.ErrNotFound):
			a.log.Info("workload not found by its handle; it will be started again", "workload_id", r.WorkloadID)
		case err != nil:
			a.log.Warn("cannot recover workload", "workload_id", r.WorkloadID, "error", err)
		default:
			a.log.Info("workload recovered", "workload_id", r.WorkloadID, "state", st.State, "pid", st.PID)
		}
	}
}

// EventWorkloadUnrecovered is the event of a workload whose stored handle
// belongs to a runtime driver the agent does not run (docs/node-protocol.md
// section 6.3): data workload_id, driver (the one that started it) and
// loaded_driver.
const EventWorkloadUnrecovered = "workload.unrecovered"

// reportUnrecovered reports that the handle of r, started by another driver
// than the loaded one, is not recovered: logged, written as the record's
// message (its status until it is started again) and buffered as an event.
func (a *Agent) reportUnrecovered(ctx context.Context, r localstore.Workload, loaded string) {
	a.log.Error("workload was started by a runtime driver this agent does not run: its handle is not recovered, "+
		"and it may still be running under that driver", "workload_id", r.WorkloadID, "driver", r.Driver, "loaded_driver", loaded)
	r.Message = fmt.Sprintf("not recovered: started by runtime driver %q, which this agent does not run (it runs %q); "+
		"it may still be running under %q", r.Driver, loaded, r.Driver)
	if err := a.store.PutWorkload(ctx, r); err != nil {
		a.log.Warn("record the unrecovered workload", "workload_id", r.WorkloadID, "error", err)
	}
	ev := newEvent(a.id.NodeID, observedChange{Type: EventWorkloadUnrecovered, WorkloadID: r.WorkloadID,
		Data: map[string]any{"workload_id": r.WorkloadID, "driver": r.Driver, "loaded_driver": loaded}}, a.cfg.Now())
	if err := a.bufferEvent(ctx, ev); err != nil {
		a.log.Warn("buffer event", "type", ev.Type, "workload_id", r.WorkloadID, "error", err)
	}
}

// watchObserved turns observed changes into buffered events (app.down,
// app.up, workload.crashed; docs/node-protocol.md sections 5.4 and 6.3) and
// asks the session to flush them. It runs with or without a session: events
// of a disconnected node wait in the local store (section 6.5).
func (a *Agent) watchObserved(ctx context.Context, loop *reconcile.Loop, changed <-chan struct{}, sess *session.Client) {
	prev := map[string]node.WorkloadStatus{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		rep, err := loop.Status(ctx)
		if err != nil {
			continue
		}
		found := false
		for _, ch := range diffObserved(prev, rep.Workloads) {
			if err := a.bufferEvent(ctx, newEvent(a.id.NodeID, ch, a.cfg.Now())); err != nil {
				a.log.Warn("buffer event", "type", ch.Type, "workload_id", ch.WorkloadID, "error", err)
				continue
			}
			found = true
		}
		prev = make(map[string]node.WorkloadStatus, len(rep.Workloads))
		for _, w := range rep.Workloads {
			prev[w.WorkloadID] = w
		}
		if found {
			sess.EventsPending()
		}
	}
}

// pluginUpgrade makes the upgrade manager of the node plugin binary at path
// (docs/upgrades.md section 3.5), running version, and settles its record:
// it returns ErrRestart when the record asks for a restart (a rollback was
// done), and otherwise the manager with the stop of its confirm-window
// timer (a no-op when no upgrade awaits confirmation).
func (a *Agent) pluginUpgrade(su *SelfUpgrade, path, program, version string, bundles *client.Client) (*upgrade.Manager, func(), error) {
	m, err := upgrade.New(upgrade.Config{
		Path: path, DataDir: a.cfg.DataDir, Program: program, Version: version,
		Fetch: bundles.OpenRelease, ConfirmWindow: su.ConfirmWindow, Now: a.cfg.Now,
		Logger: a.log.With("component", "upgrade", "program", program),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	act, err := m.Resume()
	if err != nil {
		a.log.Error("settle the plugin's upgrade record", "program", program, "error", err)
	}
	switch act {
	case upgrade.Restart:
		return nil, nil, ErrRestart
	case upgrade.AwaitConfirm:
		t := time.AfterFunc(m.ConfirmWindow(), func() {
			if _, err := m.RollBack(); err != nil {
				a.log.Error("roll back the unconfirmed plugin upgrade", "program", program, "error", err)
			}
		})
		return m, func() { t.Stop() }, nil
	}
	return m, func() {}, nil
}
