// Package pgtest starts a real PostgreSQL server for tests: Debian's
// PostgreSQL 15 (initdb into a fresh directory, postgres on a loopback port,
// password authentication), run as the postgres user when the test runs as
// root, and stopped by the caller.
package pgtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
)

// Major is the PostgreSQL major version the tests run (make test installs
// Debian's postgresql-15).
const Major = 15

// Superuser is the name of the server's superuser.
const Superuser = "postgres"

// Server is one running PostgreSQL server.
type Server struct {
	Host     string // 127.0.0.1
	Port     int
	Password string // the superuser's password
	Dir      string // data directory (removed by Stop)
	BinDir   string // where postgres, pg_dump and pg_restore live
	cmd      *exec.Cmd
	done     chan struct{}
}

// BinDir returns the directory of PostgreSQL's server programs, or an error
// that says how to install them.
func BinDir() (string, error) {
	dir := fmt.Sprintf("/usr/lib/postgresql/%d/bin", Major)
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
		return dir, nil
	}
	return "", fmt.Errorf("PostgreSQL %d is not installed (%s/postgres missing): apt-get install -y postgresql-%d (make test does)", Major, dir, Major)
}

// Start runs a fresh server on a free loopback port and stops it when the
// test ends; it fails the test when PostgreSQL is not installed. Packages that
// share one server start it from TestMain with [StartDir].
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(proctest.FreeAddr(t))
	p, _ := strconv.Atoi(port)
	s, err := StartDir(bin, p, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartDir initialises a data directory (under dir, or a new temporary
// directory when dir is empty), starts postgres from binDir on 127.0.0.1:port
// and waits (at most 60 s) until it accepts connections. The caller stops it.
func StartDir(binDir string, port int, dir string) (*Server, error) {
	var err error
	if dir == "" {
		// Not t.TempDir: its parents are 0700 and root's, which the
		// postgres user cannot traverse.
		if dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	pw := randomHex(16)
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	pwFile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		return nil, err
	}
	if cred != nil {
		for _, p := range []string{dir, data, pwFile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	initdb := exec.Command(filepath.Join(binDir, "initdb"), "-D", data, "-U", Superuser,
		"--auth=scram-sha-256", "--pwfile="+pwFile, "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	_ = os.Remove(pwFile)
	cmd := exec.Command(filepath.Join(binDir, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-h", "127.0.0.1", "-k", dir, "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "synchronous_commit=off", "-c", "max_connections=200")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	s := &Server{Host: "127.0.0.1", Port: port, Password: pw, Dir: dir, BinDir: binDir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := exec.Command(filepath.Join(binDir, "pg_isready"), "-h", s.Host, "-p", strconv.Itoa(port), "-t", "2")
		if ready.Run() == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			s.Stop()
			return nil, fmt.Errorf("postgres exited while starting: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, errors.New("postgres did not accept connections within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// URL is a libpq connection URL of database db as the superuser, without
// TLS (postgres://postgres:PASSWORD@127.0.0.1:PORT/db?sslmode=disable).
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(Superuser, s.Password), Host: s.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Stop shuts the server down (fast shutdown, then a kill after 20 s) and
// removes its directory. Safe to call twice.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.done:
			case <-time.After(20 * time.Second):
				_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
				<-s.done
			}
		}
	}
	if s.Dir != "" && strings.Contains(filepath.Base(s.Dir), "pgtest-") {
		_ = os.RemoveAll(s.Dir)
	}
}

// runAs is the credential postgres runs with: the postgres user when this
// process is root (initdb refuses root), else nil (the current user).
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the postgres user (apt-get install -y postgresql-%d creates it): %w", Major, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
