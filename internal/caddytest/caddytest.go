// Package caddytest starts a real Caddy for tests: `caddy run` with its admin
// API on a loopback port and its config and data directories in a temporary one.
package caddytest

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Version is the Caddy release the tests run (make test installs it).
const Version = "v2.11.9"

// Server is one running Caddy.
type Server struct {
	// Admin is the admin API's address, "127.0.0.1:port".
	Admin string
	cmd   *exec.Cmd
	done  chan struct{}
}

// Binary finds caddy on PATH or in GOPATH/bin and fails the test when it is
// missing.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Find is [Binary] outside a test (TestMain): the path, or an error saying
// how to install it.
func Find() (string, error) {
	if p, err := exec.LookPath("caddy"); err == nil {
		return p, nil
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "caddy")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("caddy is not installed: go install github.com/caddyserver/caddy/v2/cmd/caddy@" + Version + " (make test does)")
}

// StartDir runs the caddy binary bin with its admin API on admin
// ("127.0.0.1:port"), its HOME and XDG directories and its log under dir,
// and waits (at most 30 s) until the admin API answers. The caller stops it.
func StartDir(bin, admin, dir string) (*Server, error) {
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"admin":{"listen":"`+admin+`"}}`), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "caddy.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", cfg)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start caddy: %w", err)
	}
	s := &Server{Admin: admin, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://" + admin + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("caddy exited before its admin API answered (log in %s)", filepath.Join(dir, "caddy.log"))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("caddy's admin API at %s did not answer within 30 s (log in %s)", admin, filepath.Join(dir, "caddy.log"))
		}
	}
}

// Stop ends Caddy (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (s *Server) Stop() {
	if s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}
