// Package plugin launches and supervises plugin processes for berthd and the
// agent: catalog and checksum, go-plugin handshake and version negotiation,
// logs, health, deadlines, relaunch with backoff, quarantine and orphan reaping.
//
// A handle ([*Driver] from LaunchDriver, [*Provider] from LaunchProvider) owns
// one plugin process at a time (docs/plugins.md section 2):
//
//  1. Before every launch the binary's SHA-256 is checked against
//     Config.SHA256, and a process left by a previous host (recorded in
//     Config.PidDir) is killed when its pid and process start time both match.
//  2. The plugin's stderr log lines are re-emitted through Config.Logger with
//     the attribute plugin=<Config.Name>; its Health stream is watched. A
//     plugin that reports unhealthy without a break for longer than
//     Config.UnhealthyWindow (30 s) is killed and relaunched like a crash, and
//     counts toward quarantine; a plugin without a Health stream (gRPC
//     Unimplemented, or a stream that ended) is undetected, never healthy.
//  3. A process that exits unexpectedly is relaunched after 1 s, doubling to
//     30 s while it keeps failing; after CrashLimit crashes within
//     CrashWindow (5 in 10 minutes) it is quarantined and not relaunched.
//  4. Every call runs under a deadline (the caller's, or CallTimeout); calls
//     fail with an error wrapping ErrUnavailable while the process is down,
//     ErrQuarantined once quarantined.
//  5. A response that breaks the contract is refused as "this is a bug in
//     plugin X"; a provider whose Apply differs from its Plan is marked
//     degraded.
package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
)

// ErrUnavailable is returned (wrapped) by every call on a handle while its
// plugin process is down or being relaunched, by calls in flight when the
// process exits, and by every call after Close. It is retryable unless the
// error also matches ErrQuarantined or the handle was closed.
var ErrUnavailable = errors.New("berth: plugin unavailable")

// ErrQuarantined is returned (wrapped, together with ErrUnavailable) by every
// call on a handle whose plugin crashed CrashLimit times within CrashWindow.
// Not retryable: an operator must fix the plugin and restart the host.
var ErrQuarantined = errors.New("berth: plugin quarantined after repeated crashes")

// ErrChecksum is returned (wrapped) by LaunchDriver and LaunchProvider when
// the binary at Config.Path does not hash to Config.SHA256.
var ErrChecksum = errors.New("berth: plugin checksum mismatch")

// Defaults of [Config].
const (
	DefaultMinBackoff  = time.Second      // wait before the first relaunch
	DefaultMaxBackoff  = 30 * time.Second // cap of the doubling wait
	DefaultCrashLimit  = 5                // crashes within DefaultCrashWindow that quarantine
	DefaultCrashWindow = 10 * time.Minute
	DefaultCallTimeout = 30 * time.Second // deadline of a call whose ctx has none
	// DefaultUnhealthyWindow is how long a plugin may report unhealthy
	// without a break before it is restarted.
	DefaultUnhealthyWindow = 30 * time.Second
	stableAfter            = time.Minute // a process up this long resets the backoff
)

// Config says which plugin binary to launch and how. Zero values of the
// optional fields mean the defaults above.
type Config struct {
	// Name identifies the plugin in logs, errors and the pid file, e.g.
	// "process". Required; a DNS label.
	Name string
	// Path is the plugin binary. Required.
	Path string
	// SHA256 is the hex SHA-256 of the binary, checked before every launch
	// (relaunches included). Empty skips the check: use a [Catalog] entry or
	// [PinEntry] to get one.
	SHA256 string
	// Args are passed to the binary after its name.
	Args []string
	// Env is added to the host's environment for the plugin process; a
	// variable set here wins over the host's.
	Env []string
	// PluginConfig is the plugin's configuration from its catalog entry (a
	// JSON object), given to a provider's ValidateConfig and Configure after
	// every launch. nil means {}.
	PluginConfig json.RawMessage
	// PidDir is where the handle records the pid and start time of its
	// process (<Name>.pid), so that the next host start reaps a process its
	// predecessor left behind. Empty disables the record and the reaping.
	PidDir string
	// ReattachPath, when set, lets the plugin process outlive this handle and
	// the host process (docs/plugins.md section 2.8): the process is started
	// in its own process group, a record of it (pid, start time, address,
	// negotiated version, SHA-256 of the binary it runs, arguments) is written
	// here (0600, atomically) after every launch, the first launch of a new
	// handle reconnects to the recorded process instead of starting one when
	// it is alive, runs a binary hashing to SHA256 and was started with the
	// same Path and Args, and [Provider.Detach] leaves it running. A recorded
	// process that fails any of these checks is killed and a new one is
	// launched. Empty: the process lives and dies with the handle.
	ReattachPath string
	// Logger receives the handle's logs and the plugin's; nil discards them.
	Logger *slog.Logger
	// CallTimeout bounds every call whose ctx has no deadline; zero means
	// DefaultCallTimeout. Stop calls get their stop timeout on top.
	CallTimeout time.Duration
	// MinBackoff and MaxBackoff bound the relaunch wait; zero means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// CrashLimit crashes (unexpected exits and failed relaunches) within
	// CrashWindow quarantine the plugin; zero means the defaults, a negative
	// CrashLimit never quarantines.
	CrashLimit  int
	CrashWindow time.Duration
	// UnhealthyWindow is how long the plugin may report unhealthy on its
	// Health stream without a break (every report since the first unhealthy
	// one unhealthy) before the handle kills the process and relaunches it
	// through the crash path: the same backoff, and the restart counts as a
	// crash toward CrashLimit. It is measured on Now and checked at least
	// every second (every UnhealthyWindow/10 when that is shorter). Zero means
	// DefaultUnhealthyWindow; negative never restarts an unhealthy plugin.
	// Undetected is not unhealthy and never restarts (docs/plugins.md section 2).
	UnhealthyWindow time.Duration
	// Now is the clock of the crash window, the unhealthy window and the
	// backoff reset; nil means time.Now. Tests give a manual clock
	// (internal/clocktest). Relaunch waits use real timers.
	Now func() time.Time
}

// State is where a handle's plugin process is in its life.
type State string

// Handle states, as listed by GET /api/v1/plugins.
const (
	StateRunning     State = "running"     // a process is up and answering
	StateRestarting  State = "restarting"  // the process exited; a relaunch is pending
	StateQuarantined State = "quarantined" // crashed too often; no more relaunches
	StateClosed      State = "closed"      // Close was called
)

// Status is a snapshot of a handle, for operators (GET /api/v1/plugins,
// `berth plugins`).
type Status struct {
	Name       string         `json:"name"`
	Kind       pluginapi.Kind `json:"kind"`
	Path       string         `json:"path"`
	Version    string         `json:"version,omitempty"`     // from Describe
	APIVersion int            `json:"api_version,omitempty"` // negotiated
	State      State          `json:"state"`
	PID        int            `json:"pid,omitempty"` // zero while down
	Launches   int            `json:"launches"`      // successful launches, the first included
	// Crashes is how many crashes fell within the crash window.
	Crashes int `json:"crashes"`
	// Health is the latest report of the plugin's Health stream: healthy,
	// unhealthy, or undetected when the plugin offers no stream (or its
	// stream ended); empty until the first report.
	Health            pluginapi.HealthState `json:"health,omitempty"`
	HealthDescription string                `json:"health_description,omitempty"`
	// UnhealthySince is when the current unbroken run of unhealthy reports
	// began (on Config.Now), nil while the plugin is not unhealthy.
	UnhealthySince *time.Time `json:"unhealthy_since,omitempty"`
	// Degraded reports whether the plugin broke its contract in a way that
	// does not stop it (a provider whose Apply differed from its Plan).
	Degraded       bool   `json:"degraded"`
	DegradedReason string `json:"degraded_reason,omitempty"`
	LastError      string `json:"last_error,omitempty"`
}

// dispensed is what the abi client adapters have in common: Done is closed
// when the plugin process has exited.
type dispensed interface {
	Done() <-chan struct{}
}

// clientPlugin is the host side of go-plugin's glue: it returns the abi
// client adapter over the plugin's connection. The server side is the SDK's.
type clientPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	newClient func(life context.Context, conn grpc.ClientConnInterface) any
}

func (p *clientPlugin) GRPCServer(*goplugin.GRPCBroker, *grpc.Server) error {
	return errors.New("berth: the host side of the glue serves nothing")
}

func (p *clientPlugin) GRPCClient(ctx context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (interface{}, error) {
	return p.newClient(ctx, conn), nil
}

// kindSpec is what differs between plugin kinds for the supervisor.
type kindSpec struct {
	kind      pluginapi.Kind
	cookie    string
	name      string // in go-plugin's plugin set
	versions  []int  // contract versions the host speaks
	newClient func(life context.Context, conn grpc.ClientConnInterface) any
}

// supervisor runs one plugin process at a time and relaunches it.
type supervisor struct {
	cfg      Config
	spec     kindSpec
	log      *slog.Logger
	checksum []byte
	// ready checks a freshly launched plugin (Describe, configuration) and
	// returns its version; an error fails the launch.
	ready func(ctx context.Context, impl any, apiVersion int) (version string, err error)
	// installed, when set, runs after a launched plugin became current,
	// outside mu; an error kills that process (and so causes a relaunch).
	installed func(ctx context.Context, impl any) error
	now       func() time.Time

	life   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	client  *goplugin.Client // mu must be held
	impl    any              // current plugin, nil while down; mu must be held
	status  Status           // mu must be held
	crashes []time.Time      // within the crash window; mu must be held
	// restartCause, when set, is why the host killed the current process
	// itself (an unhealthy window that ran out); supervise records it as the
	// crash's cause. mu must be held.
	restartCause error
	// detached reports whether detach ran: the process was left running on
	// purpose, so close must not remove its records. mu must be held.
	detached bool
}

func newSupervisor(cfg Config, spec kindSpec) (*supervisor, error) {
	if cfg.Name == "" || cfg.Path == "" {
		return nil, errors.New("plugin: Config.Name and Config.Path are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.CrashLimit == 0 {
		cfg.CrashLimit = DefaultCrashLimit
	}
	if cfg.CrashWindow <= 0 {
		cfg.CrashWindow = DefaultCrashWindow
	}
	if cfg.UnhealthyWindow == 0 {
		cfg.UnhealthyWindow = DefaultUnhealthyWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &supervisor{
		cfg:  cfg,
		spec: spec,
		log:  cfg.Logger.With("plugin", cfg.Name),
		now:  cfg.Now,
	}
	s.status = Status{Name: cfg.Name, Kind: spec.kind, Path: cfg.Path, State: StateRestarting}
	if cfg.SHA256 != "" {
		sum, err := hex.DecodeString(cfg.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("plugin %s: SHA256 %q is not a hex SHA-256", cfg.Name, cfg.SHA256)
		}
		s.checksum = sum
	}
	s.life, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// start launches the first process under ctx and starts supervising it.
func (s *supervisor) start(ctx context.Context) error {
	var client *goplugin.Client
	var impl any
	var negotiated int
	var err error
	if s.cfg.ReattachPath != "" {
		client, impl, negotiated, err = s.reattach(ctx)
		if err != nil && !errors.Is(err, errNoRecord) {
			s.log.Warn("could not reattach to the recorded plugin process; launching a new one", "error", err)
		}
	}
	if client == nil {
		if err := s.reapOrphan(); err != nil {
			s.log.Warn("could not reap a plugin process left by a previous host", "error", err)
		}
		client, impl, err = s.launch(ctx)
		if err != nil {
			s.cancel()
			return err
		}
		negotiated = client.NegotiatedVersion()
	}
	if !s.install(client, impl, negotiated) {
		return fmt.Errorf("launch plugin %s: closed: %w", s.cfg.Name, ErrUnavailable)
	}
	s.wg.Add(1)
	go s.supervise(impl.(dispensed), s.now())
	return nil
}

// install makes a launched plugin current, starts watching its health and
// runs the installed hook. It reports false, after killing the process, when
// the handle was closed.
func (s *supervisor) install(client *goplugin.Client, impl any, negotiated int) bool {
	s.mu.Lock()
	if s.life.Err() != nil {
		s.mu.Unlock()
		client.Kill()
		return false
	}
	s.client, s.impl = client, impl
	s.status.Launches++
	s.status.State = StateRunning
	s.status.PID = pidOf(client)
	s.status.APIVersion = negotiated
	s.mu.Unlock()
	s.writePidFile(pidOf(client))
	s.writeReattach(client, negotiated)
	s.wg.Add(1)
	go s.watchHealth(impl)
	if s.installed != nil {
		ctx, cancel := context.WithTimeout(s.life, s.cfg.CallTimeout)
		defer cancel()
		if err := s.installed(ctx, impl); err != nil {
			s.log.Error("plugin failed after launch; restarting it", "error", err)
			s.setError(err)
			client.Kill()
		}
	}
	return true
}

// watchHealth follows the plugin's Health stream until the process exits or
// the handle closes, and restarts a plugin that stays unhealthy for longer
// than the unhealthy window. A plugin without the stream is undetected: the
// host cannot tell, so it claims nothing.
func (s *supervisor) watchHealth(impl any) {
	defer s.wg.Done()
	hr, ok := impl.(pluginapi.HealthReporter)
	if !ok {
		s.setHealth(impl, pluginapi.HealthReport{State: pluginapi.Undetected, Description: "the plugin offers no health stream"})
		return
	}
	ch, err := hr.Health(s.life)
	if err != nil {
		s.setHealth(impl, pluginapi.HealthReport{State: pluginapi.Undetected, Description: "no health stream: " + err.Error()})
		return
	}
	var tick <-chan time.Time
	if s.cfg.UnhealthyWindow > 0 {
		t := time.NewTicker(max(min(s.cfg.UnhealthyWindow/10, time.Second), 10*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				select {
				case <-impl.(dispensed).Done(): // the process exited: supervise takes over
				default:
					// A plugin whose Health is Unimplemented ends the stream before any
					// report: it offers none, which is not "healthy".
					s.setHealth(impl, pluginapi.HealthReport{State: pluginapi.Undetected, Description: "the plugin offers no health stream (Health unimplemented or its stream ended)"})
				}
				return
			}
			s.setHealth(impl, r)
		case <-tick:
		}
		s.checkUnhealthy(impl)
	}
}

func (s *supervisor) setHealth(impl any, r pluginapi.HealthReport) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.impl != impl {
		return
	}
	if s.status.Health != r.State || s.status.HealthDescription != r.Description {
		s.log.Info("plugin health", "health", string(r.State), "description", r.Description)
	}
	switch {
	case r.State != pluginapi.Unhealthy:
		s.status.UnhealthySince = nil
	case s.status.UnhealthySince == nil:
		now := s.now()
		s.status.UnhealthySince = &now
	}
	s.status.Health, s.status.HealthDescription = r.State, r.Description
}

// checkUnhealthy kills impl's process when it has been unhealthy for longer
// than the unhealthy window, with the cause recorded for supervise, which
// relaunches it as after a crash. Killing is idempotent: a second check while
// the process dies finds the cause already set.
func (s *supervisor) checkUnhealthy(impl any) {
	s.mu.Lock()
	since := s.status.UnhealthySince
	if s.impl != impl || since == nil || s.restartCause != nil || s.cfg.UnhealthyWindow <= 0 ||
		s.now().Sub(*since) <= s.cfg.UnhealthyWindow {
		s.mu.Unlock()
		return
	}
	s.restartCause = fmt.Errorf("unhealthy for longer than %s since %s: %s", s.cfg.UnhealthyWindow, since.UTC().Format(time.RFC3339), s.status.HealthDescription)
	client := s.client
	s.mu.Unlock()
	s.log.Error("plugin unhealthy for longer than its window; restarting it", "window", s.cfg.UnhealthyWindow, "since", *since)
	client.Kill() // supervise sees the exit and relaunches
}

func (s *supervisor) setError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.LastError = err.Error()
}

// degrade marks the plugin degraded, logging why.
func (s *supervisor) degrade(reason string, attrs ...any) {
	s.log.Error("plugin degraded: "+reason+" (this is a bug in plugin "+s.cfg.Name+")", attrs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Degraded, s.status.DegradedReason = true, reason
}

// launch starts one plugin process, negotiates, dispenses and readies it.
func (s *supervisor) launch(ctx context.Context) (*goplugin.Client, any, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("launch plugin %s: %w", s.cfg.Name, err)
	}
	if s.checksum != nil {
		// Checked here as well as by go-plugin so the error names the cause.
		if err := checkSum(s.cfg.Path, s.checksum); err != nil {
			return nil, nil, fmt.Errorf("launch plugin %s: %w", s.cfg.Name, err)
		}
	}
	sets := map[int]goplugin.PluginSet{}
	for _, v := range s.spec.versions {
		sets[v] = goplugin.PluginSet{s.spec.name: &clientPlugin{newClient: s.spec.newClient}}
	}
	cmd := exec.Command(s.cfg.Path, s.cfg.Args...)
	cmd.Env = append(os.Environ(), s.cfg.Env...)
	if s.cfg.ReattachPath != "" {
		// Its own process group: a signal to the host's group (a terminal's
		// Ctrl-C, a service manager stopping the host) does not reach it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cc := &goplugin.ClientConfig{
		HandshakeConfig:  goplugin.HandshakeConfig{MagicCookieKey: pluginapi.MagicCookieKey, MagicCookieValue: s.spec.cookie},
		VersionedPlugins: sets,
		Cmd:              cmd,
		SkipHostEnv:      true, // cmd.Env already holds it, with Config.Env winning
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Managed:          false,
		Logger:           newHclogAdapter(s.log),
		SyncStdout:       &lineLogger{l: s.log, stream: "stdout"},
		SyncStderr:       &lineLogger{l: s.log, stream: "stderr"},
	}
	tail := &StderrTail{}
	cc.Stderr = tail
	if dl, ok := ctx.Deadline(); ok {
		cc.StartTimeout = time.Until(dl)
	}
	if s.checksum != nil {
		cc.SecureConfig = &goplugin.SecureConfig{Checksum: s.checksum, Hash: sha256.New()}
	}
	client := goplugin.NewClient(cc)
	fail := func(what string, err error) (*goplugin.Client, any, error) {
		client.Kill()
		return nil, nil, fmt.Errorf("launch plugin %s: %s: %w", s.cfg.Name, what, err)
	}
	rpc, err := client.Client()
	if err != nil {
		// Kill waits for go-plugin's goroutines, among them the one that
		// waited for the process, so ProcessState is set once it returns.
		client.Kill()
		le := &LaunchError{Binary: s.cfg.Path, Args: s.cfg.Args, Stderr: tail.Lines(), Err: err}
		if ps := cmd.ProcessState; ps != nil {
			le.Exit = ps.String()
		}
		return fail("start", le)
	}
	raw, err := rpc.Dispense(s.spec.name)
	if err != nil {
		return fail("dispense", err)
	}
	if _, ok := raw.(dispensed); !ok {
		return fail("dispense", fmt.Errorf("unexpected client type %T", raw))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	version, err := s.ready(rctx, raw, client.NegotiatedVersion())
	if err != nil {
		return fail("first calls", err)
	}
	s.mu.Lock()
	s.status.Version = version
	s.mu.Unlock()
	s.log.Info("plugin launched", "pid", pidOf(client), "api_version", client.NegotiatedVersion(), "version", version)
	return client, raw, nil
}

func pidOf(c *goplugin.Client) int {
	if rc := c.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// crashed records a crash and reports whether the plugin is now quarantined.
func (s *supervisor) crashed(cause error) bool {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.crashes[:0]
	for _, t := range s.crashes {
		if now.Sub(t) < s.cfg.CrashWindow {
			keep = append(keep, t)
		}
	}
	s.crashes = append(keep, now)
	s.status.Crashes = len(s.crashes)
	if cause != nil {
		s.status.LastError = cause.Error()
	}
	if s.cfg.CrashLimit > 0 && len(s.crashes) >= s.cfg.CrashLimit {
		s.status.State = StateQuarantined
		return true
	}
	s.status.State = StateRestarting
	return false
}

// supervise waits for the current process to exit and relaunches it with
// backoff until Close or quarantine.
func (s *supervisor) supervise(cur dispensed, launchedAt time.Time) {
	defer s.wg.Done()
	backoff := s.cfg.MinBackoff
	for {
		select {
		case <-s.life.Done():
			return
		case <-cur.Done():
		}
		s.mu.Lock()
		dead := s.client
		s.client, s.impl = nil, nil
		s.status.PID = 0
		s.status.Health, s.status.HealthDescription, s.status.UnhealthySince = "", "", nil
		cause := s.restartCause
		s.restartCause = nil
		s.mu.Unlock()
		dead.Kill() // reaps and cleans up; the process is already gone
		if s.now().Sub(launchedAt) >= stableAfter {
			backoff = s.cfg.MinBackoff
		}
		if cause == nil {
			cause = errors.New("plugin process exited unexpectedly")
		}
		if s.crashed(cause) {
			s.quarantine()
			return
		}
		s.log.Warn("plugin process ended; relaunching", "cause", cause.Error(), "after", backoff)

		for {
			t := time.NewTimer(backoff)
			select {
			case <-s.life.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, s.cfg.MaxBackoff)
			ctx, cancel := context.WithTimeout(s.life, time.Minute)
			if err := s.reapOrphan(); err != nil {
				s.log.Warn("could not reap the previous plugin process", "error", err)
			}
			client, impl, err := s.launch(ctx)
			cancel()
			if err != nil {
				s.log.Error("plugin relaunch failed", "error", err, "retry_after", backoff)
				if s.crashed(err) {
					s.quarantine()
					return
				}
				continue
			}
			if !s.install(client, impl, client.NegotiatedVersion()) {
				return
			}
			cur, launchedAt = impl.(dispensed), s.now()
			break
		}
	}
}

func (s *supervisor) quarantine() {
	s.mu.Lock()
	n := len(s.crashes)
	s.mu.Unlock()
	s.log.Error("plugin quarantined: not relaunching it", "crashes", n, "window", s.cfg.CrashWindow)
	s.removePidFile()
	s.removeReattach()
}

// current returns the live plugin client, or an error wrapping ErrUnavailable.
func (s *supervisor) current() (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.life.Err() != nil:
		return nil, fmt.Errorf("plugin %s: closed: %w", s.cfg.Name, ErrUnavailable)
	case s.status.State == StateQuarantined:
		return nil, fmt.Errorf("plugin %s: %w: %w", s.cfg.Name, ErrQuarantined, ErrUnavailable)
	case s.impl == nil:
		return nil, fmt.Errorf("plugin %s: down, relaunch pending: %w", s.cfg.Name, ErrUnavailable)
	}
	return s.impl, nil
}

// callCtx gives ctx the handle's call deadline (plus extra) unless it has one.
func (s *supervisor) callCtx(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.CallTimeout+extra)
}

// callErr adds ErrUnavailable to err when the plugin process exited under the call.
func (s *supervisor) callErr(impl any, err error) error {
	select {
	case <-impl.(dispensed).Done():
		return fmt.Errorf("plugin %s exited during the call: %w: %w", s.cfg.Name, ErrUnavailable, err)
	default:
		return fmt.Errorf("plugin %s: %w", s.cfg.Name, err)
	}
}

// bug reports a plugin output that breaks the contract.
func (s *supervisor) bug(format string, args ...any) error {
	return fmt.Errorf("plugin %s returned an invalid response (this is a bug in plugin %s): %s", s.cfg.Name, s.cfg.Name, fmt.Sprintf(format, args...))
}

// checkVersions refuses a Describe whose versions lack the negotiated one.
func (s *supervisor) checkVersions(name string, versions []int, negotiated int) error {
	if name == "" {
		return s.bug("Describe without a name")
	}
	for _, v := range versions {
		if v == negotiated {
			return nil
		}
	}
	return s.bug("Describe lists API versions %v, not the negotiated %d", versions, negotiated)
}

// Status returns a snapshot of the handle.
func (s *supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// close stops supervision and kills the current process, waiting until it is gone.
func (s *supervisor) close() error {
	s.mu.Lock()
	if s.detached {
		s.mu.Unlock()
		return nil
	}
	s.cancel()
	client := s.client
	s.client, s.impl = nil, nil
	s.status.State, s.status.PID = StateClosed, 0
	s.mu.Unlock()
	if client != nil {
		client.Kill() // graceful shutdown, then SIGKILL after 2 s; waits for the exit
	}
	s.wg.Wait()
	s.removePidFile()
	s.removeReattach()
	return nil
}

// detach stops supervision and closes this host's connection to the current
// process without stopping it, keeping its pid file and reattach record, so
// that the next host reattaches to it. It waits for the handle's goroutines.
func (s *supervisor) detach() {
	s.mu.Lock()
	if s.life.Err() == nil {
		s.detached = true
	}
	s.cancel()
	client := s.client
	s.client, s.impl = nil, nil
	s.status.State, s.status.PID = StateClosed, 0
	s.mu.Unlock()
	if client != nil {
		detachClient(client)
	}
	s.wg.Wait()
}

// checkSum verifies that the file at path hashes to want.
func checkSum(path string, want []byte) error {
	got, err := fileSHA256(path)
	if err != nil {
		return fmt.Errorf("verify checksum: %w", err)
	}
	if string(got) != string(want) {
		return fmt.Errorf("%s has SHA-256 %x, want %x: %w", path, got, want, ErrChecksum)
	}
	return nil
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
