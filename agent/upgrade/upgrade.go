// Package upgrade replaces the running agent binary with a release the core
// offers and rolls it back when the new one does not come up
// (docs/upgrades.md section 3): stage beside it, verify, swap by rename,
// restart, confirm or roll back.
package upgrade

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	berrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/internal/version"
)

// MarkerFile is the upgrade record of the agent binary in the agent's data
// directory; a node plugin's is [MarkerName] of its program. It exists from
// just before the swap until the new binary is confirmed (the core welcomed
// the agent after the restart) or the old one is back.
const MarkerFile = "upgrade.json"

// MarkerName is the name of program's upgrade record in the data directory:
// [MarkerFile] for berth-agent, "upgrade-<program>.json" for a plugin.
func MarkerName(program string) string {
	if program == "berth-agent" {
		return MarkerFile
	}
	return "upgrade-" + program + ".json"
}

// Defaults of [Config].
const (
	DefaultConfirmWindow = 60 * time.Second
	DefaultMaxBytes      = 512 << 20
	trialTimeout         = 15 * time.Second
)

// Marker states.
const (
	StateSwapped    = "swapped"     // the new binary is in place (or about to be) and unconfirmed
	StateRolledBack = "rolled_back" // the previous binary is back in place
)

// Marker is the content of [MarkerFile].
type Marker struct {
	Program string    `json:"program"` // e.g. "berth-agent"
	Path    string    `json:"path"`    // the binary replaced
	From    string    `json:"from"`    // version before the upgrade
	To      string    `json:"to"`      // version being installed
	SHA256  string    `json:"sha256"`  // of the new binary
	State   string    `json:"state"`   // StateSwapped or StateRolledBack
	Starts  int       `json:"starts"`  // starts of the new version so far
	At      time.Time `json:"at"`      // when the swap began
}

// Config configures a [Manager]. Path, DataDir, Program, Version and Fetch
// are required.
type Config struct {
	// Path is the absolute path of the running binary, resolved at start
	// (before any swap); the swap replaces it and keeps Path+".prev".
	Path string
	// DataDir holds the upgrade record ([MarkerName]).
	DataDir string
	// Program is the name the binary prints first for --version
	// ("berth-agent", "berth-plugin-process").
	Program string
	// Version is the running version: internal/version.Version for the
	// agent, the Describe answer for a plugin.
	Version string
	// Fetch opens the release whose SHA-256 is sum (GET /api/v1/releases/{sum}).
	Fetch func(ctx context.Context, sum string) (io.ReadCloser, error)
	// ConfirmWindow is how long a new binary has to be welcomed by the core
	// before it rolls back; zero means DefaultConfirmWindow.
	ConfirmWindow time.Duration
	// MaxBytes bounds a release file; zero means DefaultMaxBytes.
	MaxBytes int64
	// RestartGrace is how long after a successful swap the restart is
	// requested, so the command's answer reaches the core first; zero means
	// 500 ms.
	RestartGrace time.Duration
	Logger       *slog.Logger     // nil means slog.Default()
	Now          func() time.Time // nil means time.Now
}

// Manager runs upgrades of one binary. Create it with [New]; it is safe for
// concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	busy     bool // an upgrade is staging; mu must be held
	pending  bool // this process is an unconfirmed new version; mu must be held
	restart  chan struct{}
	restartO sync.Once
}

// New validates cfg and fills its defaults.
func New(cfg Config) (*Manager, error) {
	if cfg.Path == "" || !filepath.IsAbs(cfg.Path) || cfg.DataDir == "" || cfg.Program == "" || cfg.Version == "" || cfg.Fetch == nil {
		return nil, errors.New("upgrade: an absolute Path, DataDir, Program, Version and Fetch are required")
	}
	if cfg.ConfirmWindow <= 0 {
		cfg.ConfirmWindow = DefaultConfirmWindow
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.RestartGrace <= 0 {
		cfg.RestartGrace = 500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg, log: cfg.Logger, restart: make(chan struct{})}, nil
}

// RestartRequested is closed when the process should restart itself: after a
// swap, or after a rollback. The caller stops cleanly and re-executes Path.
func (m *Manager) RestartRequested() <-chan struct{} { return m.restart }

func (m *Manager) requestRestart(after time.Duration) {
	time.AfterFunc(after, func() { m.restartO.Do(func() { close(m.restart) }) })
}

// ConfirmWindow is the configured window of an unconfirmed new version.
func (m *Manager) ConfirmWindow() time.Duration { return m.cfg.ConfirmWindow }

func (m *Manager) markerPath() string {
	return filepath.Join(m.cfg.DataDir, MarkerName(m.cfg.Program))
}

// inPlace reports whether the binary at Path is the one mk installs.
func (m *Manager) inPlace(mk *Marker) bool {
	sum, _, err := hashFile(m.cfg.Path)
	return err == nil && sum == mk.SHA256
}

func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func (m *Manager) readMarker() (*Marker, error) {
	raw, err := securefile.ReadFile(m.markerPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read upgrade record: %w", err)
	}
	var mk Marker
	if err := json.Unmarshal(raw, &mk); err != nil {
		return nil, fmt.Errorf("upgrade record %s: %w", m.markerPath(), err)
	}
	return &mk, nil
}

func (m *Manager) writeMarker(mk *Marker) error {
	raw, err := json.Marshal(mk)
	if err != nil {
		return err
	}
	if err := securefile.WriteFile(m.markerPath(), raw); err != nil {
		return fmt.Errorf("write upgrade record: %w", err)
	}
	return nil
}

func (m *Manager) removeMarker() error {
	if err := os.Remove(m.markerPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove upgrade record: %w", err)
	}
	return syncDir(m.cfg.DataDir)
}

func errorResult(code berrors.Code, msg string) node.CommandResult {
	return node.CommandResult{Status: "error", Detail: msg, Error: &node.ErrorBody{Code: string(code), Message: msg}}
}

// Upgrade serves agent_upgrade (docs/upgrades.md section 3.2):
//
//  1. refuse a target older than the running version unless req.Force
//     (agent_downgrade); answer ok "unchanged" for the running version;
//  2. take the release of this OS and architecture (release_not_found);
//  3. download it beside Path into a new temporary file, checking size and
//     SHA-256 as it streams (digest_mismatch: the file is removed, nothing
//     else is touched); fsync;
//  4. run it with --version: it must print Program and the target version
//     (upgrade_failed otherwise, nothing replaced);
//  5. keep the running binary as Path+".prev" (hard link, renamed into place);
//  6. write the upgrade record, then rename the new file over Path and
//     fsync the directory: Path is at every instant a complete binary;
//  7. answer ok and request a restart after RestartGrace.
//
// One upgrade runs at a time (upgrade_in_progress), including an
// unconfirmed one from before a restart.
func (m *Manager) Upgrade(ctx context.Context, req node.AgentUpgrade) node.CommandResult {
	cmp, err := version.Compare(req.Version, m.cfg.Version)
	if err != nil {
		return errorResult(berrors.ValidationFailed, "agent_upgrade: "+err.Error())
	}
	switch {
	case cmp == 0:
		return node.CommandResult{Status: "ok", Detail: "unchanged: already running " + m.cfg.Version}
	case cmp < 0 && !req.Force:
		return errorResult(berrors.AgentDowngrade, fmt.Sprintf("%s %s is older than the running %s; pass force to downgrade", m.cfg.Program, req.Version, m.cfg.Version))
	}
	var rel *node.ReleaseFile
	for i, f := range req.Releases {
		if f.Name == m.cfg.Program && f.OS == goruntime.GOOS && f.Arch == goruntime.GOARCH {
			if c, err := version.Compare(f.Version, req.Version); err == nil && c == 0 {
				rel = &req.Releases[i]
				break
			}
		}
	}
	if rel == nil {
		return errorResult(berrors.ReleaseNotFound, fmt.Sprintf("no %s %s release for %s/%s was offered", m.cfg.Program, req.Version, goruntime.GOOS, goruntime.GOARCH))
	}
	if !validSum(rel.SHA256) || rel.Size <= 0 || rel.Size > m.cfg.MaxBytes {
		return errorResult(berrors.ValidationFailed, fmt.Sprintf("release %s: want a 64-hex sha256 and a size of 1 to %d bytes", rel.SHA256, m.cfg.MaxBytes))
	}
	m.mu.Lock()
	if m.busy || m.pending {
		m.mu.Unlock()
		return errorResult(berrors.UpgradeInProgress, "an upgrade of this agent is already running or awaiting confirmation")
	}
	m.busy = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.busy = false
		m.mu.Unlock()
	}()
	if mk, err := m.readMarker(); err != nil {
		return errorResult(berrors.Internal, err.Error())
	} else if mk != nil {
		return errorResult(berrors.UpgradeInProgress, fmt.Sprintf("an upgrade to %s is recorded and not settled", mk.To))
	}

	staged, res := m.stage(ctx, rel)
	if staged == "" {
		return res
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.Remove(staged)
		}
	}()
	if err := m.trial(ctx, staged, req.Version); err != nil {
		return errorResult(berrors.UpgradeFailed, err.Error())
	}
	if err := m.keepPrevious(); err != nil {
		return errorResult(berrors.Internal, err.Error())
	}
	mk := &Marker{Program: m.cfg.Program, Path: m.cfg.Path, From: m.cfg.Version, To: req.Version, SHA256: rel.SHA256,
		State: StateSwapped, At: m.cfg.Now().UTC()}
	if err := m.writeMarker(mk); err != nil {
		return errorResult(berrors.Internal, err.Error())
	}
	if err := os.Rename(staged, m.cfg.Path); err != nil {
		_ = m.removeMarker()
		return errorResult(berrors.Internal, fmt.Sprintf("swap in the new binary: %v", err))
	}
	keep = true
	if err := syncDir(filepath.Dir(m.cfg.Path)); err != nil {
		m.log.Warn("fsync the binary's directory after the swap", "error", err)
	}
	m.log.Info("new binary in place; restarting", "program", m.cfg.Program, "from", m.cfg.Version, "to", req.Version, "sha256", rel.SHA256)
	m.requestRestart(m.cfg.RestartGrace)
	return node.CommandResult{Status: "ok", Detail: fmt.Sprintf("staged %s %s; restarting", m.cfg.Program, req.Version)}
}

// stage downloads rel into a new file beside Path and returns its name, or
// "" and the refusal.
func (m *Manager) stage(ctx context.Context, rel *node.ReleaseFile) (string, node.CommandResult) {
	dir, base := filepath.Split(m.cfg.Path)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	staged := filepath.Join(dir, "."+base+".staged-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(staged, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o700)
	if err != nil {
		return "", errorResult(berrors.Internal, fmt.Sprintf("create staging file: %v", err))
	}
	fail := func(code berrors.Code, msg string) (string, node.CommandResult) {
		_ = f.Close()
		_ = os.Remove(staged)
		return "", errorResult(code, msg)
	}
	body, err := m.cfg.Fetch(ctx, rel.SHA256)
	if err != nil {
		code := berrors.CodeOf(err)
		if code == "" || code == berrors.Internal {
			code = berrors.Unavailable
		}
		return fail(code, fmt.Sprintf("fetch release %s: %v", rel.SHA256, err))
	}
	defer body.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, rel.Size+1))
	if err != nil {
		return fail(berrors.Unavailable, fmt.Sprintf("download release %s: %v", rel.SHA256, err))
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != rel.Size || sum != rel.SHA256 {
		return fail(berrors.DigestMismatch, fmt.Sprintf("release %s: got %d bytes with sha256 %s, want %d bytes; nothing was replaced", rel.SHA256, n, sum, rel.Size))
	}
	if err := f.Sync(); err != nil {
		return fail(berrors.Internal, fmt.Sprintf("fsync staged release: %v", err))
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(staged)
		return "", errorResult(berrors.Internal, fmt.Sprintf("close staged release: %v", err))
	}
	return staged, node.CommandResult{}
}

// trial runs the staged binary with --version and checks what it says.
func (m *Manager) trial(ctx context.Context, path, want string) error {
	ctx, cancel := context.WithTimeout(ctx, trialTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the staged binary does not run (%s --version): %w; nothing was replaced", m.cfg.Program, err)
	}
	fields := strings.Fields(string(bytes.SplitN(out, []byte("\n"), 2)[0]))
	if len(fields) < 2 || fields[0] != m.cfg.Program {
		return fmt.Errorf("the staged binary is not %s (it prints %q); nothing was replaced", m.cfg.Program, strings.TrimSpace(string(out)))
	}
	if c, err := version.Compare(fields[1], want); err != nil || c != 0 {
		return fmt.Errorf("the staged binary reports version %q, not %s; nothing was replaced", fields[1], want)
	}
	return nil
}

// keepPrevious makes Path+".prev" the running binary, atomically.
func (m *Manager) keepPrevious() error {
	prev := m.cfg.Path + ".prev"
	tmp := prev + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(m.cfg.Path, tmp); err != nil {
		if err := copyFile(m.cfg.Path, tmp); err != nil {
			return fmt.Errorf("keep the previous binary: %w", err)
		}
	}
	if err := os.Rename(tmp, prev); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("keep the previous binary: %w", err)
	}
	return syncDir(filepath.Dir(prev))
}

// restorePrevious puts Path+".prev" back over Path, atomically, keeping
// the .prev file.
func (m *Manager) restorePrevious() error {
	prev := m.cfg.Path + ".prev"
	tmp := m.cfg.Path + ".rollback.tmp"
	_ = os.Remove(tmp)
	if err := os.Link(prev, tmp); err != nil {
		if err := copyFile(prev, tmp); err != nil {
			return fmt.Errorf("roll back to %s: %w", prev, err)
		}
	}
	if err := os.Rename(tmp, m.cfg.Path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("roll back to %s: %w", prev, err)
	}
	return syncDir(filepath.Dir(m.cfg.Path))
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		_ = os.Remove(dst)
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		_ = os.Remove(dst)
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func validSum(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
