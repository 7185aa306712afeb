// Package s3test starts a real S3 server for tests: versitygw on a POSIX
// directory, with signature checks and intact multipart uploads.
package s3test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthhq/berth/internal/proctest"
)

// Credentials of every server Start runs.
const (
	AccessKey = "berthtest"
	SecretKey = "berthtestsecret"
)

// Server is one running versitygw.
type Server struct {
	Addr string // host:port, plain HTTP
	cmd  *exec.Cmd
}

// Binary finds versitygw on PATH or in GOPATH/bin and fails the test when it
// is missing (make test installs it).
func Binary(t testing.TB) string {
	t.Helper()
	p, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Find is [Binary] for TestMain: the path of versitygw on PATH or in
// GOPATH/bin, or an error that says how to install it.
func Find() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("versitygw is not installed: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 (make test does)")
}

// Start runs versitygw on a fresh temporary directory, waits (at most 30 s)
// until it listens, and stops it when the test ends. Callers that need one
// server for a whole package use [StartDir] from TestMain instead.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartDir(Binary(t), proctest.FreeAddr(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartDir runs the versitygw binary bin on addr over dir and waits (at most
// 30 s) until it listens. The caller stops it.
func StartDir(bin, addr, dir string) (*Server, error) {
	cmd := exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--port", addr, "posix", dir)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Client is a minio client of the server with the test credentials.
func (s *Server) Client(t testing.TB) *minio.Client {
	t.Helper()
	c, err := minio.New(s.Addr, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Bucket creates a bucket and returns its name.
func (s *Server) Bucket(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client(t).MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
	return name
}
