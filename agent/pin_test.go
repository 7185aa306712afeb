package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/internal/tlstest"
	"github.com/berthhq/berth/nodeplugins/process"
	"github.com/berthhq/berth/sdk/client"
)

// TestPinMismatchStopsTheAgentAndKeepsWorkloads enrolls a node against a
// TLS core pinned by fingerprint, runs a real workload, then has the core
// come back with another certificate (as a re-created berthd does): Run must
// stop with ErrPinMismatch after a bounded number of dials instead of
// redialling forever, and the workload must still be running.
func TestPinMismatchStopsTheAgentAndKeepsWorkloads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca := tlstest.NewCA(t)
	issue := func() *tls.Certificate {
		l := ca.Issue(t, "127.0.0.1")
		c, err := tls.X509KeyPair(l.Chain, l.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	first := issue()
	var cert atomic.Pointer[tls.Certificate]
	cert.Store(first)
	fc := startFakeCore(t, cert.Load)

	dataDir := filepath.Join(t.TempDir(), "agent")
	var logs syncbuf.Buffer
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dataDir,
		Fingerprint: client.Fingerprint(first.Certificate[0]), Logger: testLogger(&logs)}); err != nil {
		t.Fatal(err)
	}
	drv, err := process.New(process.Config{StateDir: filepath.Join(dataDir, "driver", "process")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	a, err := New(Config{DataDir: dataDir, Driver: drv, Logger: testLogger(&logs),
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		stopRun()
		<-done
	}()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fc.awaitType(ctx, node.TypeHello)
	fc.desire(ctx, 1, node.WorkloadSpec{WorkloadID: "wl_http", Project: "shop", Service: "web", Driver: "process",
		Command: []string{exe}, Env: map[string]string{workloadEnv: "http"}, DesiredStatus: node.DesiredRunning,
		RestartGeneration: 1, HealthCheck: node.HealthCheck{Path: "/", IntervalS: 1}})
	rep := fc.awaitStatus(ctx, "wl_http running", func(r node.StatusReport) bool {
		w, ok := statusOf(r, "wl_http")
		return ok && w.ObservedStatus == node.StatusRunning && w.Health == node.HealthPassing
	})
	w, _ := statusOf(rep, "wl_http")
	pid := workloadPID(t, w.Address)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	// The core comes back with a new certificate and drops the session.
	cert.Store(issue())
	fc.mu.Lock()
	_ = fc.ws.CloseNow()
	fc.mu.Unlock()

	select {
	case err = <-done:
		done <- err // for the deferred wait
	case <-ctx.Done():
		t.Fatalf("Run still redialling against a mismatched certificate; logs:\n%s", logs.String())
	}
	if !errors.Is(err, ErrPinMismatch) || !errors.Is(err, client.ErrFingerprintMismatch) {
		t.Fatalf("Run = %v, want ErrPinMismatch wrapping ErrFingerprintMismatch", err)
	}
	if !strings.Contains(err.Error(), "new join command") {
		t.Errorf("error %q does not say how to start over", err)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("the workload died when the agent stopped on the pin mismatch")
	}
}
