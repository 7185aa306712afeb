package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// reapWait bounds the wait for a killed leftover process to be gone.
const reapWait = 5 * time.Second

// pidRecord is what a handle writes to Config.PidDir/<Name>.pid about its
// current process: enough to find it again and to tell it from a process
// that got the same pid later.
type pidRecord struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"` // /proc/<pid>/stat field 22
	Path       string `json:"path"`
}

func (s *supervisor) pidPath() string { return filepath.Join(s.cfg.PidDir, s.cfg.Name+".pid") }

// writePidFile records pid; failures are logged, never fatal.
func (s *supervisor) writePidFile(pid int) {
	if s.cfg.PidDir == "" || pid <= 0 {
		return
	}
	ticks, err := startTicks(pid)
	if err != nil {
		s.log.Warn("cannot read the plugin's start time; it will not be reaped after a host crash", "error", err)
		return
	}
	raw, _ := json.Marshal(pidRecord{PID: pid, StartTicks: ticks, Path: s.cfg.Path}) // plain struct
	if err := os.MkdirAll(s.cfg.PidDir, 0o700); err != nil {
		s.log.Warn("cannot record the plugin's pid", "error", err)
		return
	}
	tmp := s.pidPath() + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		s.log.Warn("cannot record the plugin's pid", "error", err)
		return
	}
	if err := os.Rename(tmp, s.pidPath()); err != nil {
		s.log.Warn("cannot record the plugin's pid", "error", err)
	}
}

func (s *supervisor) removePidFile() {
	if s.cfg.PidDir == "" {
		return
	}
	if err := os.Remove(s.pidPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot remove the plugin's pid file", "error", err)
	}
}

// reapOrphan kills the process recorded in the pid file when it is still the
// same process: same pid and same start time. A pid reused by another process
// has another start time and is left alone. It waits (up to 5 s) until the
// process is gone, so it no longer holds a port or the state directory.
func (s *supervisor) reapOrphan() error {
	if s.cfg.PidDir == "" {
		return nil
	}
	raw, err := os.ReadFile(s.pidPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pid file: %w", err)
	}
	var rec pidRecord
	if err := json.Unmarshal(raw, &rec); err != nil || rec.PID <= 0 {
		s.removePidFile()
		return fmt.Errorf("pid file %s is corrupt; removed it", s.pidPath())
	}
	if rec.PID == os.Getpid() {
		s.removePidFile()
		return nil
	}
	ticks, err := startTicks(rec.PID)
	if err != nil || ticks != rec.StartTicks {
		// Gone, or the pid now belongs to another process.
		s.removePidFile()
		return nil
	}
	s.log.Warn("killing a plugin process left by a previous host", "pid", rec.PID)
	if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill orphan %d: %w", rec.PID, err)
	}
	if err := waitGone(rec.PID, rec.StartTicks, reapWait); err != nil {
		return err
	}
	s.removePidFile()
	return nil
}

// waitGone waits until pid (started at ticks) has exited or is a zombie, for at
// most timeout.
func waitGone(pid int, ticks uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := waitGoneCtx(ctx, pid, ticks); err != nil {
		return fmt.Errorf("orphan %d still alive %s after SIGKILL", pid, timeout)
	}
	return nil
}

// sameProcessAlive reports whether pid is a live, non-zombie process started at ticks.
func sameProcessAlive(pid int, ticks uint64) bool {
	st, t, err := procStat(pid)
	return err == nil && t == ticks && st != 'Z' && st != 'X'
}

// startTicks returns the start time of pid in clock ticks since boot.
func startTicks(pid int) (uint64, error) {
	_, t, err := procStat(pid)
	return t, err
}

// procStat reads the state (field 3) and start time (field 22) of
// /proc/<pid>/stat.
func procStat(pid int) (byte, uint64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat start time: %w", pid, err)
	}
	return f[0][0], t, nil
}
