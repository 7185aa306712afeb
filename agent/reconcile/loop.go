// Package reconcile is the node agent's apply loop: it decides, from the newest
// stored desired-state snapshot, what to start, stop and restart, and does it through a runtime driver.
package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/health"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/internal/logseg"
)

// Defaults of [Config].
const (
	DefaultPollInterval = time.Second
	DefaultStopTimeout  = 10 * time.Second
	DefaultLogMaxBytes  = 1 << 20
	maxDeletedReported  = 256
)

// Config configures a Loop. Store, Driver and DataDir are required.
type Config struct {
	Store  *localstore.Store
	Driver runtime.Driver
	// DriverName is Driver's Describe name. Every record of a workload the
	// loop starts names it as the driver that started the workload, whatever
	// the spec's driver says, so that a restarted agent hands the record's
	// handle back to that driver's Recover (docs/plugins.md section 3.3).
	// Empty records the spec's driver.
	DriverName string
	Bundles    BundleSource // where bundles are downloaded from; nil fails every workload that names a bundle
	DataDir    string       // the agent's data directory; bundles/ and workloads/ live under it
	Address    string       // node address workloads bind to when the snapshot names none; empty means 127.0.0.1
	Logger     *slog.Logger // nil means slog.Default()
	// Now returns the current time; nil means time.Now. Backoff decisions use it.
	Now func() time.Time
	// PollInterval is how often the driver is polled for exits; zero means 1 s.
	PollInterval time.Duration
	// StopTimeout is the graceful stop timeout; zero means 10 s.
	StopTimeout time.Duration
	// ShipLogs reports whether a log shipper serves this node: a removed workload's log
	// directory then waits under PendingLogsDir until its segments are shipped, instead of
	// being deleted with the workload (docs/logs.md section 6).
	ShipLogs bool
	// MaxBundleBytes bounds a downloaded bundle; zero means 1 GiB.
	MaxBundleBytes int64
	// MaxExpandedBytes bounds an extracted bundle; zero means the bundle package default (4 GiB).
	MaxExpandedBytes int64
	// OnStatusChange is called (from the loop goroutine) after a pass whose
	// status report differs from the previous one; nil means none.
	OnStatusChange func()
	// Prober runs health checks; nil means a default [health.Prober] the Loop owns.
	Prober *health.Prober
	// Leases gates stateful workloads (docs/node-protocol.md section 6.4);
	// nil starts no stateful workload at all.
	Leases LeaseGate
	// Network attaches container workloads to the node network; nil runs
	// them in the node's own network namespace.
	Network Network
	// Registry is the node's credential for Berth's own registry
	// (docs/registry.md section 9): handed to the driver with every start
	// of an image whose registry host is Registry.Host, and never logged;
	// nil hands none (images are then pulled anonymously).
	Registry *runtime.RegistryCredential
	// WorkloadUser is the host user ("uid", "uid:gid" or a name) process workloads run as when
	// their service names none (docs/node-protocol.md section 6.7): their work directory and
	// volumes are handed over to it before the start. Empty runs them as the agent's own user;
	// cmd/berth-agent sets [DefaultWorkloadUser] when it runs as root.
	WorkloadUser string
}

// LeaseGate is the node's leases as the loop needs them. *lease.Manager
// satisfies it.
type LeaseGate interface {
	// Statuses returns every lease by id and whether the node is failed.
	Statuses() (map[string]lease.Status, bool)
	// Admit is held around the driver's Start of a stateful workload: ok
	// with a release to call after Start, or the reason it may not start.
	Admit(leaseID string, token int64) (release func(), ok bool, reason string)
}

// Loop is the apply loop. Create it with [New], run it with [Loop.Run]; [Loop.Wake]
// and [Loop.Status] are safe to call from other goroutines.
type Loop struct {
	cfg       Config
	log       *slog.Logger
	ownProber bool
	wake      chan struct{}

	mu         sync.Mutex
	deleted    []string // workloads removed, reported as deleted; mu must be held
	lastReport *node.StatusReport
	address    string // node address of the newest snapshot; mu must be held
	// registryHost is the core's registry host of the newest snapshot (node.Spec.RegistryHost);
	// mu must be held.
	registryHost string
	passMu       sync.Mutex
}

// New validates cfg, fills its defaults and returns a Loop.
func New(cfg Config) (*Loop, error) {
	if cfg.Store == nil || cfg.Driver == nil || cfg.DataDir == "" {
		return nil, errors.New("reconcile: Store, Driver and DataDir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.MaxBundleBytes <= 0 {
		cfg.MaxBundleBytes = 1 << 30
	}
	if cfg.Address == "" {
		cfg.Address = "127.0.0.1"
	}
	l := &Loop{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), address: cfg.Address}
	if cfg.Prober == nil {
		l.cfg.Prober = health.New(health.Config{Logger: cfg.Logger, OnChange: func(string, string) { l.Wake() }})
		l.ownProber = true
	}
	return l, nil
}

// Wake asks the loop for a pass soon, e.g. after a new snapshot was stored. It never blocks.
func (l *Loop) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run runs passes until ctx ends: on [Loop.Wake], every PollInterval, and when
// a backoff ends. A failing pass is logged and retried on the next wake. It
// returns ctx's error; workloads keep running.
func (l *Loop) Run(ctx context.Context) error {
	if l.ownProber {
		defer l.cfg.Prober.Close()
	}
	poll := time.NewTicker(l.cfg.PollInterval)
	defer poll.Stop()
	backoff := time.NewTimer(time.Hour)
	backoff.Stop()
	defer backoff.Stop()
	for {
		wakeAt, err := l.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("reconcile pass failed", "error", err)
		}
		if !wakeAt.IsZero() {
			backoff.Reset(max(wakeAt.Sub(l.cfg.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.wake:
		case <-poll.C:
		case <-backoff.C:
		}
	}
}

// Pass runs one reconcile pass against the newest stored snapshot: read
// records and the driver's list, decide, act, update health probes, record
// applied_rev when every action succeeded, and call OnStatusChange when the
// status report changed. It returns when the next pass is due at the latest
// because a backoff ends (zero when none), and the actions' joined errors.
// Passes are serialised.
func (l *Loop) Pass(ctx context.Context) (time.Time, error) {
	l.passMu.Lock()
	defer l.passMu.Unlock()
	snap, err := l.snapshot(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if snap != nil {
		l.mu.Lock()
		if snap.Spec.Network.Address != "" {
			l.address = snap.Spec.Network.Address
		}
		l.registryHost = snap.Spec.RegistryHost
		l.mu.Unlock()
	}
	states, err := l.cfg.Driver.List(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("list driver workloads: %w", err)
	}
	driver := make(map[string]*runtime.WorkloadState, len(states))
	for _, s := range states {
		if s != nil {
			driver[s.WorkloadID] = s
		}
	}
	recs, err := l.records(ctx)
	if err != nil {
		return time.Time{}, err
	}
	now := l.cfg.Now()
	in := Input{Snapshot: snap, Driver: driver, Records: recs, Now: now, NodeFailed: true}
	if l.cfg.Leases != nil {
		in.Leases, in.NodeFailed = l.cfg.Leases.Statuses()
	}
	dec := Decide(in)
	var rev int64
	if snap != nil {
		rev = snap.Rev
	}
	var errs []error
	for _, a := range dec.Actions {
		l.log.Info("reconcile action", "action", string(a.Kind), "workload_id", a.WorkloadID, "reason", a.Reason)
		if err := l.act(ctx, a, driver[a.WorkloadID], recs, now, rev); err != nil {
			errs = append(errs, err)
			l.log.Warn("reconcile action failed", "action", string(a.Kind), "workload_id", a.WorkloadID, "error", err)
		}
	}
	if err := l.syncProbes(ctx); err != nil {
		errs = append(errs, err)
	}
	if snap != nil && len(errs) == 0 {
		// Volumes are purged before the revision is acknowledged: the core reads the removal
		// receipt from it (docs/node-protocol.md section 6.7).
		if err := l.purgeVolumes(snap.Spec); err != nil {
			errs = append(errs, err)
		}
	}
	if snap != nil && len(errs) == 0 {
		if err := l.cfg.Store.SetAppliedRev(ctx, snap.Rev); err != nil {
			errs = append(errs, err)
		}
	}
	rep, err := l.Status(ctx)
	if err != nil {
		errs = append(errs, err)
	} else {
		l.mu.Lock()
		changed := l.lastReport == nil || !reflect.DeepEqual(*l.lastReport, rep)
		l.lastReport = &rep
		l.mu.Unlock()
		if changed && l.cfg.OnStatusChange != nil {
			l.cfg.OnStatusChange()
		}
	}
	// Refresh the wake time: a failed start sets a backoff the decision did not know.
	wake := dec.WakeAt
	if recs2, err := l.records(ctx); err == nil {
		for _, r := range recs2 {
			if (Phase(r.Phase) == PhaseFailed || Phase(r.Phase) == PhaseCrashed) && !r.NextStartAt.IsZero() &&
				(wake.IsZero() || r.NextStartAt.Before(wake)) {
				wake = r.NextStartAt
			}
		}
	}
	return wake, errors.Join(errs...)
}

func (l *Loop) snapshot(ctx context.Context) (*node.DesiredState, error) {
	rev, raw, err := l.cfg.Store.LatestSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, nil
	}
	var d node.DesiredState
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("parse stored snapshot rev %d: %w", rev, err)
	}
	return &d, nil
}

func (l *Loop) records(ctx context.Context) (map[string]localstore.Workload, error) {
	list, err := l.cfg.Store.Workloads(ctx)
	if err != nil {
		return nil, err
	}
	m := make(map[string]localstore.Workload, len(list))
	for _, r := range list {
		m[r.WorkloadID] = r
	}
	return m, nil
}

func (l *Loop) nodeAddress() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.address
}

// act runs a; rev is the desired-state revision the pass decided on, the
// fence of the starts it makes of workloads without a lease.
func (l *Loop) act(ctx context.Context, a Action, st *runtime.WorkloadState, recs map[string]localstore.Workload, now time.Time, rev int64) error {
	switch a.Kind {
	case ActRecord:
		if Phase(a.Record.Phase) == PhaseCrashed {
			l.log.Warn("workload exited unasked", "workload_id", a.WorkloadID,
				"restart_count", a.Record.RestartCount, "next_start_at", a.Record.NextStartAt)
		}
		return l.cfg.Store.PutWorkload(ctx, *a.Record)
	case ActStop:
		if err := l.stop(ctx, a.WorkloadID, a.Record, rev); err != nil {
			return err
		}
		l.cfg.Prober.Remove(a.WorkloadID)
		if a.Record == nil {
			return nil
		}
		r := *a.Record
		if !Phase(r.Phase).Ended() { // a job run stopped at its timeout keeps its final phase
			r.Phase = string(PhaseStopped)
		}
		return l.cfg.Store.PutWorkload(ctx, r)
	case ActRemove:
		return l.remove(ctx, a.WorkloadID, a.Record, rev)
	case ActRestart:
		if err := l.stop(ctx, a.WorkloadID, a.Record, rev); err != nil {
			return err
		}
		return l.start(ctx, a, nil, recs, now, rev)
	case ActStart:
		return l.start(ctx, a, st, recs, now, rev)
	}
	return fmt.Errorf("unknown action %q", a.Kind)
}

// stop stops workload id. rec is its record (nil when it has none) and rev
// the revision of the pass; see [lease.StopMutation] for the mutation fields.
func (l *Loop) stop(ctx context.Context, id string, rec *localstore.Workload, rev int64) error {
	_, err := l.cfg.Driver.Stop(ctx, &runtime.StopRequest{WorkloadID: id, Timeout: l.cfg.StopTimeout,
		Mutation: lease.StopMutation("stop", id, rec, rev)})
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("stop workload %s: %w", id, err)
	}
	return nil
}

func (l *Loop) remove(ctx context.Context, id string, rec *localstore.Workload, rev int64) error {
	if err := l.stop(ctx, id, rec, rev); err != nil {
		return err
	}
	l.cfg.Prober.Remove(id)
	if err := l.detachNetwork(ctx, id, lease.StopMutation("detach", id, rec, rev)); err != nil {
		return err
	}
	if err := KeepPreviousLog(l.cfg.DataDir, id, LogPath(l.cfg.DataDir, id)); err != nil {
		l.log.Warn("could not keep the output of a removed workload", "workload_id", id, "error", err)
	}
	if l.cfg.ShipLogs {
		if err := KeepForShipping(l.cfg.DataDir, id); err != nil {
			l.log.Warn("could not keep a removed workload's unshipped log for shipping", "workload_id", id, "error", err)
		}
	}
	if err := os.RemoveAll(l.workloadDir(id)); err != nil {
		return fmt.Errorf("remove workload %s directory: %w", id, err)
	}
	if err := l.cfg.Store.DeleteWorkload(ctx, id); err != nil {
		return err
	}
	l.mu.Lock()
	l.deleted = append(l.deleted, id)
	if len(l.deleted) > maxDeletedReported {
		l.deleted = l.deleted[len(l.deleted)-maxDeletedReported:]
	}
	l.mu.Unlock()
	return nil
}

func (l *Loop) workloadDir(id string) string { return filepath.Join(l.cfg.DataDir, "workloads", id) }

// LogPath is the log path the agent hands the runtime driver for workload id
// under dataDir.
func LogPath(dataDir, id string) string {
	return filepath.Join(dataDir, "workloads", id, "output.log")
}

// LogDir is where a driver with a log writer keeps the stamped records of
// workload id under dataDir (docs/logs.md section 3).
func LogDir(dataDir, id string) string { return logseg.DirOf(LogPath(dataDir, id)) }

// start brings a.Spec up: record first (so an agent crash mid-start finds it),
// then port, bundle, working directory, and the driver's Start. A failure is
// recorded as phase failed with a backoff and returned.
//
// Each start is one attempt, counted in the record and persisted before the
// driver is called; its idempotency key and fencing token derive from it
// (docs/plugins.md section 3.4). A start interrupted after the driver acted
// but before its result was recorded (the record still says starting and
// the driver reports the workload running) is retried as the same attempt,
// with the same port, key and token, so the driver replays its first answer,
// handle included, instead of acting again.
func (l *Loop) start(ctx context.Context, a Action, st *runtime.WorkloadState, recs map[string]localstore.Workload, now time.Time, rev int64) error {
	spec := a.Spec
	rec := localstore.Workload{WorkloadID: spec.WorkloadID}
	if a.Record != nil {
		rec = *a.Record
	}
	replay := Replays(&rec, st)
	if !replay {
		rec.StartAttempt++
		rec.StartRev = rev
		rec.FenceToken = rev
		if spec.Stateful {
			rec.FenceToken = spec.FencingToken
		}
	}
	rec.Driver = l.cfg.DriverName
	if rec.Driver == "" {
		rec.Driver = spec.Driver
	}
	rec.LeaseID = ""
	if spec.Stateful {
		rec.LeaseID = spec.LeaseID
	}
	rec.SpecHash = SpecHash(spec)
	rec.RestartGeneration = spec.RestartGeneration
	addr := l.nodeAddress()

	used := map[int]bool{}
	for id, r := range recs {
		if id != spec.WorkloadID && r.Port != 0 {
			used[r.Port] = true
		}
	}
	port := rec.Port // a replayed start keeps the port its workload holds
	if !replay {
		var err error
		if port, err = pickPort(addr, rec.Port, used); err != nil {
			return l.failStart(ctx, rec, node.FailureStart, fmt.Errorf("allocate port for workload %s: %w", spec.WorkloadID, err), now)
		}
	}
	rec.Port = port
	rec.Phase = string(PhaseStarting)
	if err := l.cfg.Store.PutWorkload(ctx, rec); err != nil {
		return err
	}

	dir := l.workloadDir(spec.WorkloadID)
	appDir := filepath.Join(dir, "app")
	if !replay { // a replayed start's workload runs in its directory
		if err := l.prepareWorkDir(ctx, spec, dir, appDir); err != nil {
			return l.failStart(ctx, rec, node.FailureImage, err, now)
		}
	}
	if st != nil && !replay {
		// The driver still knows an exited run of this id: clear it first,
		// as the stop of the attempt it belongs to.
		var prev *localstore.Workload
		if a.Record != nil {
			r := *a.Record
			prev = &r
		}
		if err := l.stop(ctx, spec.WorkloadID, prev, rev); err != nil {
			return l.failStart(ctx, rec, node.FailureStart, err, now)
		}
	}
	env, envErr := l.workloadEnv(spec, dir, appDir)
	if envErr != nil {
		return l.failStart(ctx, rec, node.FailureStart, envErr, now)
	}
	secretEnv, secretFiles, pullSecrets, err := openAllSecrets(l.cfg.DataDir, spec)
	if err != nil {
		return l.failStart(ctx, rec, node.FailureStart, err, now)
	}
	defer func() {
		for _, v := range pullSecrets {
			clear(v)
		}
	}()
	secretDir := filepath.Join(dir, "secrets")
	if err := writeSecretFiles(secretDir, secretFiles); err != nil {
		return l.failStart(ctx, rec, node.FailureStart, err, now)
	}
	for _, v := range secretFiles {
		clear(v)
	}
	for k, v := range secretEnv {
		env[k] = string(v)
		clear(v)
	}
	if len(secretFiles) > 0 {
		env[SecretsDirEnv] = secretDir
	}
	startUser := spec.User
	if o, ok, err := l.runAs(spec); err != nil {
		return l.failStart(ctx, rec, node.FailureStart, err, now)
	} else if ok {
		var vols []string
		for _, v := range spec.Volumes {
			vols = append(vols, VolumeDir(l.cfg.DataDir, spec.Project, spec.Service, v.Name))
		}
		if err := l.handOver(o, dir, vols); err != nil {
			return l.failStart(ctx, rec, node.FailureStart, err, now)
		}
		startUser = strconv.Itoa(o.uid) + ":" + strconv.Itoa(o.gid)
	}
	env["PORT"] = strconv.Itoa(port)
	env["HOST"] = addr
	env["BERTH_WORKLOAD_ID"] = spec.WorkloadID
	env["BERTH_SERVICE"] = spec.Service
	env["BERTH_PROJECT"] = spec.Project
	mut := StartMutation(spec, &rec)
	netns, err := l.attachNetwork(ctx, spec, port, env, pluginapi.Mutation{
		IdempotencyKey: pluginapi.CallKey("attach", spec.WorkloadID, rec.StartRev, rec.StartAttempt), FencingToken: uint64(max(rec.StartRev, 0))})
	if err != nil {
		return l.failStart(ctx, rec, node.FailureStart, err, now)
	}
	if spec.Stateful {
		// The lease is checked again under its gate, so that no fence of it
		// runs while this start is in flight (section 6.4).
		release, ok, why := func() (func(), bool, string) {
			if l.cfg.Leases == nil {
				return nil, false, "this agent runs no lease manager"
			}
			return l.cfg.Leases.Admit(spec.LeaseID, spec.FencingToken)
		}()
		if !ok {
			l.log.Info("stateful workload stays stopped", "workload_id", spec.WorkloadID, "lease_id", spec.LeaseID, "reason", why)
			rec.Phase = string(PhaseStopped)
			rec.Message = "waiting for lease: " + why
			return l.cfg.Store.PutWorkload(ctx, rec)
		}
		defer release()
	}
	// A container image shipped as a bundle is handed to the driver as the
	// cached archive (docs/plugins.md section 3, "The containerd driver").
	imageArchive := ""
	if spec.Image != "" && spec.BundleDigest != "" {
		if imageArchive, err = l.ensureBundle(ctx, spec.BundleDigest); err != nil {
			return l.failStart(ctx, rec, node.FailureImage, err, now)
		}
	}
	resp, err := l.cfg.Driver.Start(ctx, &runtime.StartRequest{
		Image:               l.pullRef(spec.Image),
		ImageArchive:        imageArchive,
		RegistryCredentials: l.registryCredentials(spec, imageArchive, pullSecrets),
		User:                startUser,
		MemoryBytes:         spec.MemoryBytes,
		CPUMillis:           spec.CPUMillis,
		WorkloadID:          spec.WorkloadID,
		NetworkNamespace:    netns,
		Command:             slices.Clone(spec.Command),
		Env:                 env,
		WorkDir:             appDir,
		LogPath:             LogPath(l.cfg.DataDir, spec.WorkloadID),
		LogMaxBytes:         DefaultLogMaxBytes,
		Mutation:            mut,
		FenceResource:       StartFence(spec),
	})
	if err != nil {
		kind := node.FailureStart
		if errors.Is(err, errImageUnavailable) {
			// The registry refused the pull or could not be reached: the
			// status says image-unavailable, with the driver's reason.
			kind = node.FailureImage
		}
		return l.failStart(ctx, rec, kind, fmt.Errorf("start workload %s: %w", spec.WorkloadID, err), now)
	}
	rec.Phase = string(PhaseRunning)
	rec.Message = ""
	rec.StartedAt = now
	if resp != nil && resp.State != nil && !resp.State.StartedAt.IsZero() {
		rec.StartedAt = resp.State.StartedAt
	}
	if resp != nil && resp.State != nil {
		rec.DriverHandle = localstore.DriverHandle{Version: resp.State.Handle.Version, Data: resp.State.Handle.Data}
	}
	l.log.Info("workload started", "workload_id", spec.WorkloadID, "port", port, "restart_count", rec.RestartCount)
	return l.cfg.Store.PutWorkload(ctx, rec)
}

// errImageUnavailable matches, by code, a driver's refusal to fetch an image.
var errImageUnavailable = abierrors.New(abierrors.ImageUnavailable, "")

// registryCredentials returns what the driver pulls spec's image with, when
// it is pulled (not imported from a bundle): the node's credential for
// Berth's registry when the image is on that registry's host, else the
// pull secret (as "registry", "user:password") the service holds for the
// image's registry host (docs/registry.md section 9); none otherwise.
func (l *Loop) registryCredentials(spec *node.WorkloadSpec, imageArchive string, pullSecrets map[string][]byte) []runtime.RegistryCredential {
	if spec.Image == "" || imageArchive != "" {
		return nil
	}
	host, _, ok := strings.Cut(l.pullRef(spec.Image), "/")
	if !ok || !strings.ContainsAny(host, ".:") && host != "localhost" {
		host = "docker.io" // a reference without a registry host names Docker Hub
	}
	if c := l.cfg.Registry; c != nil && host == c.Host {
		return []runtime.RegistryCredential{*c}
	}
	if v, ok := pullSecrets[host]; ok {
		user, secret, _ := strings.Cut(string(v), ":")
		return []runtime.RegistryCredential{{Host: host, Username: user, Secret: secret}}
	}
	return nil
}

// pullRef is the reference the driver pulls image from: image itself, except that an image of
// the core's registry (the newest snapshot's node.Spec.RegistryHost) is pulled from the host this
// agent reaches the core through (its registry credential's: the cluster's relay, whose /v2/
// forwards pulls to the core) when the two differ (docs/relay.md section 12). The digest, and so
// what runs, is the same.
func (l *Loop) pullRef(image string) string {
	l.mu.Lock()
	core := l.registryHost
	l.mu.Unlock()
	c := l.cfg.Registry
	if core == "" || c == nil || c.Host == core {
		return image
	}
	if rest, ok := strings.CutPrefix(image, core+"/"); ok {
		return c.Host + "/" + rest
	}
	return image
}

// Replays reports whether a start from record rec, with the driver
// reporting st, retries the record's interrupted attempt rather than making a
// new one: the record says starting, has an attempt, and the driver reports
// the workload running (so the first call got through).
func Replays(rec *localstore.Workload, st *runtime.WorkloadState) bool {
	return rec != nil && Phase(rec.Phase) == PhaseStarting && rec.StartAttempt > 0 &&
		st != nil && st.State == runtime.StateRunning
}

// StartMutation returns the mutation fields of the start of spec as the
// attempt recorded in rec: key [pluginapi.CallKey]("start", id,
// rec.StartRev, rec.StartAttempt) and token rec.FenceToken (the lease's token for a
// stateful workload, fenced by [StartFence]; the attempt's desired-state
// revision otherwise; docs/plugins.md section 3.4).
func StartMutation(spec *node.WorkloadSpec, rec *localstore.Workload) pluginapi.Mutation {
	return pluginapi.Mutation{IdempotencyKey: pluginapi.CallKey("start", spec.WorkloadID, rec.StartRev, rec.StartAttempt),
		FencingToken: uint64(max(rec.FenceToken, 0))}
}

// StartFence is the fence resource of spec's start: its lease for a stateful
// workload, "" (the workload itself) otherwise.
func StartFence(spec *node.WorkloadSpec) string {
	if spec.Stateful && spec.LeaseID != "" {
		return runtime.FenceLease(spec.LeaseID)
	}
	return ""
}

// failStart records a start that failed with cause, as a failure of kind.
func (l *Loop) failStart(ctx context.Context, rec localstore.Workload, kind node.FailureKind, cause error, now time.Time) error {
	r := Fail(rec, kind, cause.Error(), now)
	if err := l.cfg.Store.PutWorkload(ctx, r); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// pickPort returns prev when it is free on addr, else a free port chosen by
// the kernel that no other record holds.
func pickPort(addr string, prev int, used map[int]bool) (int, error) {
	if prev > 0 && !used[prev] {
		if ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(prev))); err == nil {
			_ = ln.Close()
			return prev, nil
		}
	}
	for range 20 {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			return 0, fmt.Errorf("listen on %s: %w", addr, err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !used[p] {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port on %s", addr)
}

// syncProbes probes exactly the workloads whose records say running.
func (l *Loop) syncProbes(ctx context.Context) error {
	snap, err := l.snapshot(ctx)
	if err != nil {
		return err
	}
	recs, err := l.records(ctx)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	if snap != nil {
		addr := l.nodeAddress()
		for _, spec := range snap.Spec.Workloads {
			r, ok := recs[spec.WorkloadID]
			if !ok || Phase(r.Phase) != PhaseRunning || r.Port == 0 || spec.DesiredStatus != node.DesiredRunning {
				continue
			}
			want[spec.WorkloadID] = true
			l.cfg.Prober.Set(spec.WorkloadID, health.TargetFor(net.JoinHostPort(addr, strconv.Itoa(r.Port)), spec.HealthCheck))
		}
	}
	for _, id := range l.cfg.Prober.IDs() {
		if !want[id] {
			l.cfg.Prober.Remove(id)
		}
	}
	return nil
}

// jobOutcome is what the node reports of the job run whose workload record is r
// (docs/jobs.md section 7): its result, attempts, last exit, times and, once it ended, the tail
// of its output.
func (l *Loop) jobOutcome(r localstore.Workload) *node.JobOutcome {
	o := &node.JobOutcome{Result: node.JobRunning, Attempts: int(r.StartAttempt), StartedAt: r.StartedAt}
	switch Phase(r.Phase) {
	case PhaseSucceeded:
		o.Result = node.JobSucceeded
	case PhaseJobFailed:
		o.Result = node.JobFailed
	case PhaseTimedOut:
		o.Result = node.JobTimedOut
	default:
		return o
	}
	o.EndedAt = r.EndedAt
	if f := r.LastFailure; f != nil && f.Kind == node.FailureSignal && o.Result != node.JobSucceeded {
		o.Signal = f.Signal
	} else if o.Result != node.JobTimedOut {
		o.ExitCode = r.LastExitCode
	}
	o.OutputTail = tailOf(filepath.Join(l.workloadDir(r.WorkloadID), "output.log"), node.JobOutputTailBytes)
	return o
}

// tailOf returns the last n bytes of the file at path, cut to start at a line; "" when it
// cannot be read.
func tailOf(path string, n int64) string {
	if dir := logseg.DirOf(path); isDir(dir) {
		return recordsTail(dir, n)
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-n, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	return strings.ToValidUTF8(string(buf), "")
}

// recordsTail is tailOf for a workload whose driver stamps its output into the log directory
// dir (docs/logs.md): the last n bytes of the output as the workload wrote it, cut to start at a
// line; "" when nothing can be read.
func recordsTail(dir string, n int64) string {
	var out []byte
	_, err := logseg.ReadFrom(dir, 1, func(r logseg.Record) error {
		out = append(out, r.Text...)
		if !r.Partial {
			out = append(out, '\n')
		}
		if int64(len(out)) > 2*n {
			out = append(out[:0], out[int64(len(out))-n:]...)
		}
		return nil
	})
	if err != nil && len(out) == 0 {
		return ""
	}
	if int64(len(out)) > n {
		out = out[int64(len(out))-n:]
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			out = out[i+1:]
		}
	}
	return strings.ToValidUTF8(string(out), "")
}

// isDir reports whether path names a directory.
func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// Status returns the node's status report as the loop last observed it:
// applied_rev and one entry per desired workload, plus removed ones as deleted.
// Capacity and Allocated are left for the caller to fill.
func (l *Loop) Status(ctx context.Context) (node.StatusReport, error) {
	var rep node.StatusReport
	applied, err := l.cfg.Store.AppliedRev(ctx)
	if err != nil {
		return rep, err
	}
	rep.AppliedRev = applied
	snap, err := l.snapshot(ctx)
	if err != nil {
		return rep, err
	}
	recs, err := l.records(ctx)
	if err != nil {
		return rep, err
	}
	addr := l.nodeAddress()
	rep.Workloads = []node.WorkloadStatus{}
	inSnap := map[string]bool{}
	if snap != nil {
		for _, spec := range snap.Spec.Workloads {
			inSnap[spec.WorkloadID] = true
			ws := node.WorkloadStatus{WorkloadID: spec.WorkloadID, ObservedStatus: node.StatusCreating, Health: node.HealthUnknown}
			if r, ok := recs[spec.WorkloadID]; ok {
				ws.RestartCount = r.RestartCount
				ws.LastExitCode = r.LastExitCode
				ws.Message = r.Message
				ws.LastFailure = r.LastFailure
				if f := r.LastFailure; f != nil && f.Kind == node.FailureOOM {
					ws.ExitReason = runtime.ExitReasonOOM
				}
				switch Phase(r.Phase) {
				case PhaseRunning:
					ws.ObservedStatus = node.StatusRunning
					ws.Health = l.cfg.Prober.Health(spec.WorkloadID)
					if f := l.cfg.Prober.Failure(spec.WorkloadID); f != nil {
						// A failing probe is the newest failure of a running workload.
						ws.LastFailure = f
					}
					if r.Port != 0 {
						ws.Address = net.JoinHostPort(addr, strconv.Itoa(r.Port))
					}
				case PhaseStarting:
					ws.ObservedStatus = node.StatusStarting
				case PhaseCrashed, PhaseFailed:
					ws.ObservedStatus = node.StatusCrashed
				case PhaseStopped:
					ws.ObservedStatus = node.StatusStopped
					ws.Message = "" // a stateful workload waiting for its lease is no error (section 6.4)
				case PhaseSucceeded, PhaseJobFailed, PhaseTimedOut:
					ws.ObservedStatus = node.StatusStopped
				}
				if spec.Job != nil {
					ws.Job = l.jobOutcome(r)
				}
			} else if spec.DesiredStatus == node.DesiredStopped {
				ws.ObservedStatus = node.StatusStopped
			}
			rep.Workloads = append(rep.Workloads, ws)
		}
	}
	for id, r := range recs {
		if !inSnap[id] {
			rep.Workloads = append(rep.Workloads, node.WorkloadStatus{WorkloadID: id, ObservedStatus: node.StatusStopping,
				Health: node.HealthUnknown, RestartCount: r.RestartCount, LastExitCode: r.LastExitCode})
		}
	}
	l.mu.Lock()
	for _, id := range l.deleted {
		if !inSnap[id] {
			if _, ok := recs[id]; !ok {
				rep.Workloads = append(rep.Workloads, node.WorkloadStatus{WorkloadID: id, ObservedStatus: node.StatusDeleted, Health: node.HealthUnknown})
			}
		}
	}
	l.mu.Unlock()
	slices.SortFunc(rep.Workloads, func(a, b node.WorkloadStatus) int {
		switch {
		case a.WorkloadID < b.WorkloadID:
			return -1
		case a.WorkloadID > b.WorkloadID:
			return 1
		}
		return 0
	})
	return rep, nil
}
