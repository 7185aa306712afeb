package upgrade

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Action is what the process does after [Manager.Resume].
type Action int

// Actions of [Manager.Resume].
const (
	// Continue: run normally; nothing is awaited.
	Continue Action = iota
	// AwaitConfirm: this process is a new version not yet confirmed; call
	// [Manager.Confirm] once the core welcomes it, or
	// [Manager.RollBack] when ConfirmWindow passes first.
	AwaitConfirm
	// Restart: the previous binary was put back; stop and re-execute Path.
	Restart
)

// Resume settles the upgrade record at process start, before anything else
// uses the data directory (docs/upgrades.md section 3.3):
//
//   - no record: Continue;
//   - a record whose new binary is at Path (by SHA-256), first start:
//     count the start and AwaitConfirm;
//   - the same, started again without having been confirmed (the new
//     binary died, or was killed, before the core welcomed it): restore
//     Path+".prev" and Restart;
//   - a record whose new binary is not at Path (the swap never happened,
//     or was rolled back): remove it and Continue.
//
// Leftover staging files beside Path are removed. Errors come from the
// file system; the caller should log them and Continue.
func (m *Manager) Resume() (Action, error) {
	m.removeStaged()
	mk, err := m.readMarker()
	if err != nil || mk == nil {
		return Continue, err
	}
	if mk.Path != m.cfg.Path || mk.Program != m.cfg.Program {
		m.log.Warn("upgrade record is about another binary; removing it", "path", mk.Path, "program", mk.Program)
		return Continue, m.removeMarker()
	}
	if mk.State == StateSwapped && m.inPlace(mk) {
		mk.Starts++
		if mk.Starts > 1 {
			m.log.Error("the new version started before and was never confirmed; rolling back", "from", mk.From, "to", mk.To, "starts", mk.Starts)
			return m.rollBackLocked(mk)
		}
		if err := m.writeMarker(mk); err != nil {
			return Continue, err
		}
		m.mu.Lock()
		m.pending = true
		m.mu.Unlock()
		m.log.Info("running a new version; waiting for the core to welcome it", "from", mk.From, "to", mk.To, "window", m.cfg.ConfirmWindow.String())
		return AwaitConfirm, nil
	}
	switch mk.State {
	case StateRolledBack:
		m.log.Warn("upgrade rolled back: the new version did not come up", "from", mk.From, "to", mk.To, "running", m.cfg.Version)
	default:
		m.log.Warn("upgrade did not complete; running the previous binary", "from", mk.From, "to", mk.To, "running", m.cfg.Version)
	}
	return Continue, m.removeMarker()
}

// Confirm ends an AwaitConfirm: the new version stays and the record is
// removed. Idempotent; a no-op when nothing is awaited.
func (m *Manager) Confirm() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pending {
		return nil
	}
	m.pending = false
	mk, err := m.readMarker()
	if err != nil || mk == nil {
		return err
	}
	m.log.Info("new version confirmed", "from", mk.From, "to", mk.To)
	return m.removeMarker()
}

// Pending reports whether this process is an unconfirmed new version.
func (m *Manager) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending
}

// RollBack ends an AwaitConfirm whose window passed: Path+".prev" is put
// back, the record says rolled_back, and a restart is requested. A no-op
// (Continue) when nothing is awaited.
func (m *Manager) RollBack() (Action, error) {
	m.mu.Lock()
	if !m.pending {
		m.mu.Unlock()
		return Continue, nil
	}
	m.pending = false
	m.mu.Unlock()
	mk, err := m.readMarker()
	if err != nil || mk == nil {
		return Continue, err
	}
	m.log.Error("the new version was not welcomed by the core within the window; rolling back", "from", mk.From, "to", mk.To, "window", m.cfg.ConfirmWindow.String())
	act, err := m.rollBackLocked(mk)
	if act == Restart {
		m.requestRestart(0)
	}
	return act, err
}

func (m *Manager) rollBackLocked(mk *Marker) (Action, error) {
	if err := m.restorePrevious(); err != nil {
		// Without the previous binary the new one is all there is: keep it.
		_ = m.removeMarker()
		return Continue, fmt.Errorf("cannot roll back, keeping %s: %w", mk.To, err)
	}
	mk.State = StateRolledBack
	if err := m.writeMarker(mk); err != nil {
		return Restart, err
	}
	return Restart, nil
}

// RollBackUnconfirmed puts Path+".prev" back when program's upgrade record
// says its new binary is at path and unconfirmed: the caller could not even
// start it (a node plugin that does not launch). It reports whether it rolled
// back; the caller then starts the previous binary.
func RollBackUnconfirmed(dataDir, program, path string, log *slog.Logger) (bool, error) {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{cfg: Config{Path: path, DataDir: dataDir, Program: program}, log: log, restart: make(chan struct{})}
	mk, err := m.readMarker()
	if err != nil || mk == nil || mk.State != StateSwapped || !m.inPlace(mk) {
		return false, err
	}
	log.Error("the new version does not start; rolling back", "program", program, "from", mk.From, "to", mk.To)
	act, err := m.rollBackLocked(mk)
	return act == Restart, err
}

// removeStaged deletes staging files a killed upgrade left beside Path.
func (m *Manager) removeStaged() {
	dir, base := filepath.Split(m.cfg.Path)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "."+base+".staged-") || n == base+".prev.tmp" || n == base+".rollback.tmp" {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				m.log.Warn("remove a leftover staging file", "file", n, "error", err)
			}
		}
	}
}
