// Package proctest runs real processes for tests and benchmarks in other packages: start one
// with its output in a log file, stop it at cleanup, wait for a condition with a bounded poll,
// wait for a berthd to be ready, and run the test binary again as a crash child a test kills with
// SIGKILL (StartChild). It imports std and sdk/client only.
package proctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopGrace = 15 * time.Second

// Proc is a process a test started. Start registers a cleanup that stops it, so a test never
// leaves it behind; stopping an ended Proc does nothing.
type Proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	log  string // the log file's path
	done chan struct{}
}

// Start runs bin with args, its stdout and stderr appended to logPath (created 0600 if missing),
// and registers a t.Cleanup that calls Stop. It fails t if the log cannot be opened or bin does
// not start.
func Start(t testing.TB, logPath, bin string, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, logPath, exec.Command(bin, args...))
}

// StartCmd is Start for a command the caller prepared (its SysProcAttr or Env, say); it sets
// cmd's Stdout and Stderr to logPath.
func StartCmd(t testing.TB, logPath string, cmd *exec.Cmd) *Proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	p := &Proc{t: t, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(p.Stop)
	return p
}

// Cmd returns the started command; its ProcessState (exit code) is set once Done is closed.
func (p *Proc) Cmd() *exec.Cmd { return p.cmd }

// LogPath returns the path of the file that receives the process's stdout and stderr.
func (p *Proc) LogPath() string { return p.log }

// Done is closed once the process has ended and its log is closed.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process with SIGTERM, then SIGKILL after StopGrace, and returns once it ended.
func (p *Proc) Stop() { p.StopWithin(StopGrace) }

// StopWithin is Stop with grace, the time between SIGTERM and SIGKILL.
func (p *Proc) StopWithin(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.t.Logf("%s did not stop on SIGTERM within %s; killing", p.cmd.Path, grace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill9 sends SIGKILL and returns once the process ended.
func (p *Proc) Kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// KillUnder SIGKILLs every process of this machine, other than the calling one, whose working
// directory is dir or under it, or whose command line names a path under dir, and returns how
// many it signalled. Tests register it as their first cleanup (so it runs last) over the
// directory they gave their processes: workloads outlive the agent and runtime drivers by
// design, and a test must leave nothing behind. Processes it cannot inspect are skipped.
func KillUnder(t testing.TB, dir string) int {
	t.Helper()
	dir = filepath.Clean(dir)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Errorf("list processes: %v", err)
		return 0
	}
	self := os.Getpid()
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if !namesDir(pid, dir) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			t.Logf("killed leftover process %d: %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
			n++
		}
	}
	return n
}

// namesDir reports whether process pid works in dir or names a path under it in its command line.
func namesDir(pid int, dir string) bool {
	p := filepath.Join("/proc", strconv.Itoa(pid))
	if cwd, err := os.Readlink(filepath.Join(p, "cwd")); err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
		return true
	}
	cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
	if err != nil {
		return false
	}
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		if arg == dir || strings.Contains(arg, dir+"/") {
			return true
		}
	}
	return false
}
