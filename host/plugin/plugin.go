// Package plugin launches and supervises plugin processes for berthd and the
// agent: checksum verification, go-plugin handshake, logs, relaunch with backoff.
//
// A handle (*Driver from LaunchDriver, *Gateway from LaunchGateway) owns one
// plugin process at a time. When the process exits unexpectedly the handle
// relaunches it, waiting 1 s before the first attempt and doubling the wait up
// to 30 s while launches keep failing or the process keeps dying within a
// minute; calls made while the plugin is down return an error wrapping
// ErrUnavailable. The plugin's stderr log lines are re-emitted through
// Config.Logger with the attribute plugin=<Config.Name>.
package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
)

// ErrUnavailable is returned (wrapped) by every call on a handle while its
// plugin process is down or being relaunched, by calls in flight when the
// process exits, and by every call after Close. It is retryable: a relaunch
// is under way unless the handle was closed.
var ErrUnavailable = errors.New("berth: plugin unavailable")

// ErrChecksum is returned (wrapped) by LaunchDriver and LaunchGateway when the
// binary at Config.Path does not hash to Config.SHA256.
var ErrChecksum = errors.New("berth: plugin checksum mismatch")

// Relaunch backoff.
const (
	MinBackoff  = time.Second      // wait before the first relaunch
	MaxBackoff  = 30 * time.Second // cap of the doubling wait
	stableAfter = time.Minute      // a process up this long resets the backoff
)

// Config says which plugin binary to launch and how.
type Config struct {
	// Name identifies the plugin in logs and errors, e.g. "process". Required.
	Name string
	// Path is the plugin binary. Required.
	Path string
	// SHA256 is the hex SHA-256 of the binary. When set it is checked before
	// every launch (including relaunches); empty skips the check.
	SHA256 string
	// Args are passed to the binary after its name.
	Args []string
	// Env is added to the host's environment for the plugin process; a
	// variable set here wins over the host's.
	Env []string
	// Logger receives the handle's logs and the plugin's; nil discards them.
	Logger *slog.Logger
}

// dispensed is what the sdk client adapters have in common: Done is closed
// when the plugin process has exited.
type dispensed interface {
	Done() <-chan struct{}
}

// supervisor runs one plugin process at a time and relaunches it.
type supervisor struct {
	cfg       Config
	log       *slog.Logger
	checksum  []byte
	handshake goplugin.HandshakeConfig
	sets      map[int]goplugin.PluginSet
	dispense  string
	// ready checks a freshly launched plugin (and re-sends state); an error
	// fails the launch.
	ready func(ctx context.Context, impl any) error
	// installed, when set, runs after a launched plugin became current,
	// outside mu; an error kills that process (and so causes a relaunch).
	installed func(ctx context.Context, impl any) error

	life   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	client   *goplugin.Client // mu must be held
	impl     any              // current plugin, nil while down; mu must be held
	launches int              // successful launches so far; mu must be held
}

func newSupervisor(cfg Config, handshake goplugin.HandshakeConfig, sets map[int]goplugin.PluginSet, dispense string) (*supervisor, error) {
	if cfg.Name == "" || cfg.Path == "" {
		return nil, errors.New("plugin: Config.Name and Config.Path are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &supervisor{
		cfg:       cfg,
		log:       log.With("plugin", cfg.Name),
		handshake: handshake,
		sets:      sets,
		dispense:  dispense,
	}
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
	client, impl, err := s.launch(ctx)
	if err != nil {
		s.cancel()
		return err
	}
	if !s.install(client, impl) {
		return fmt.Errorf("launch plugin %s: closed: %w", s.cfg.Name, ErrUnavailable)
	}
	s.wg.Add(1)
	go s.supervise(impl.(dispensed), time.Now())
	return nil
}

// install makes a launched plugin current and runs the installed hook. It
// reports false, after killing the process, when the handle was closed.
func (s *supervisor) install(client *goplugin.Client, impl any) bool {
	s.mu.Lock()
	if s.life.Err() != nil {
		s.mu.Unlock()
		client.Kill()
		return false
	}
	s.client, s.impl = client, impl
	s.launches++
	s.mu.Unlock()
	if s.installed != nil {
		ctx, cancel := context.WithTimeout(s.life, time.Minute)
		defer cancel()
		if err := s.installed(ctx, impl); err != nil {
			s.log.Error("plugin failed after launch; restarting it", "error", err)
			client.Kill()
		}
	}
	return true
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
	cmd := exec.Command(s.cfg.Path, s.cfg.Args...)
	cmd.Env = append(os.Environ(), s.cfg.Env...)
	hl := newHclogAdapter(s.log)
	cc := &goplugin.ClientConfig{
		HandshakeConfig:  s.handshake,
		VersionedPlugins: s.sets,
		Cmd:              cmd,
		SkipHostEnv:      true, // cmd.Env already holds it, with Config.Env winning
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Managed:          false,
		Logger:           hl,
		SyncStdout:       &lineLogger{l: s.log, stream: "stdout"},
		SyncStderr:       &lineLogger{l: s.log, stream: "stderr"},
	}
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
		return fail("start", err)
	}
	raw, err := rpc.Dispense(s.dispense)
	if err != nil {
		return fail("dispense", err)
	}
	if _, ok := raw.(dispensed); !ok {
		return fail("dispense", fmt.Errorf("unexpected client type %T", raw))
	}
	if err := s.ready(ctx, raw); err != nil {
		return fail("first calls", err)
	}
	s.log.Info("plugin launched", "pid", pidOf(client), "api_version", client.NegotiatedVersion())
	return client, raw, nil
}

func pidOf(c *goplugin.Client) int {
	if rc := c.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// supervise waits for the current process to exit and relaunches it with
// backoff until Close.
func (s *supervisor) supervise(cur dispensed, launchedAt time.Time) {
	defer s.wg.Done()
	backoff := MinBackoff
	for {
		select {
		case <-s.life.Done():
			return
		case <-cur.Done():
		}
		s.mu.Lock()
		dead := s.client
		s.client, s.impl = nil, nil
		s.mu.Unlock()
		dead.Kill() // reaps and cleans up; the process is already gone
		if time.Since(launchedAt) >= stableAfter {
			backoff = MinBackoff
		}
		s.log.Warn("plugin exited unexpectedly; relaunching", "after", backoff)

		for {
			t := time.NewTimer(backoff)
			select {
			case <-s.life.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, MaxBackoff)
			ctx, cancel := context.WithTimeout(s.life, time.Minute)
			client, impl, err := s.launch(ctx)
			cancel()
			if err != nil {
				s.log.Error("plugin relaunch failed", "error", err, "retry_after", backoff)
				continue
			}
			if !s.install(client, impl) {
				return
			}
			cur, launchedAt = impl.(dispensed), time.Now()
			break
		}
	}
}

// current returns the live plugin client, or an error wrapping ErrUnavailable.
func (s *supervisor) current() (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.Err() != nil {
		return nil, fmt.Errorf("plugin %s: closed: %w", s.cfg.Name, ErrUnavailable)
	}
	if s.impl == nil {
		return nil, fmt.Errorf("plugin %s: down, relaunch pending: %w", s.cfg.Name, ErrUnavailable)
	}
	return s.impl, nil
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

// Launches reports how many times the plugin process was launched successfully.
func (s *supervisor) Launches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launches
}

// PID returns the pid of the current plugin process, or 0 while it is down.
func (s *supervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		return 0
	}
	return pidOf(s.client)
}

// close stops supervision and kills the current process, waiting until it is gone.
func (s *supervisor) close() error {
	s.mu.Lock()
	s.cancel()
	client := s.client
	s.client, s.impl = nil, nil
	s.mu.Unlock()
	s.wg.Wait()
	if client != nil {
		client.Kill() // graceful shutdown, then SIGKILL after 2 s; waits for the exit
	}
	return nil
}

// checkSum verifies that the file at path hashes to want.
func checkSum(path string, want []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("verify checksum: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("verify checksum: %w", err)
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return fmt.Errorf("%s has SHA-256 %x, want %x: %w", path, got, want, ErrChecksum)
	}
	return nil
}
