// Package ferrettest starts FerretDB as a separate process for tests: a real
// MongoDB-wire server (SQLite or PostgreSQL backend) that a test can hand to
// code as an ordinary MongoDB URI, unlike berthd's in-process embedded store.
//
// FerretDB v1 lacks some server commands (createUser among them): tests that
// depend on one name it.
package ferrettest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
)

// Package is the import path of the command Build compiles.
const Package = "github.com/berthhq/berth/internal/ferrettest/ferretdb"

// Server is one running FerretDB process.
type Server struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	done chan struct{}
}

// Build compiles the FerretDB test command into dir and returns its path.
// It runs the go command, so it needs the module's source (tests have it).
func Build(dir string) (string, error) {
	out := filepath.Join(dir, "ferretdb-test")
	cmd := exec.Command("go", "build", "-o", out, Package)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", Package, err, b)
	}
	return out, nil
}

// Start builds the command, runs it over SQLite files in a temporary
// directory on a free loopback port, and stops it when the test ends.
// Packages that share one server use [Build] and [StartSQLite] or
// [StartPostgres] from TestMain.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := StartSQLite(bin, proctest.FreeAddr(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartSQLite runs bin on addr with its SQLite files in dir and waits (at most
// 30 s) until it listens. The caller stops it.
func StartSQLite(bin, addr, dir string) (*Server, error) {
	return start(exec.Command(bin, "-listen", addr, "-sqlite", dir), addr)
}

// StartPostgres runs bin on addr over the PostgreSQL database at pgURL (which
// must exist) and waits (at most 30 s) until it listens. The caller stops it.
func StartPostgres(bin, addr, pgURL string) (*Server, error) {
	return start(exec.Command(bin, "-listen", addr, "-postgres", pgURL), addr)
}

func start(cmd *exec.Cmd, addr string) (*Server, error) {
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		select {
		case <-s.done:
			return nil, errors.New("ferretdb exited while starting (its log is on stderr)")
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("ferretdb did not listen on %s within 30 s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URI is the server's MongoDB URI.
func (s *Server) URI() string { return "mongodb://" + s.Addr + "/" }

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
// Safe to call twice.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}
