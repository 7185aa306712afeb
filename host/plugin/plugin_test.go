package plugin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/sdk/runtime"
)

// binDir holds the plugin binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-plugin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-o", dir+"/",
		"github.com/berthhq/berth/cmd/berth-plugin-process",
		"github.com/berthhq/berth/cmd/berth-plugin-gateway")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build plugins: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t *testing.T) (*slog.Logger, *syncBuffer) {
	t.Helper()
	buf := &syncBuffer{}
	l := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host log:\n%s", buf.String())
		}
	})
	return l, buf
}

// waitFor waits until cond holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

func launchDriver(t *testing.T, logger *slog.Logger) *plugin.Driver {
	t.Helper()
	path := filepath.Join(binDir, "berth-plugin-process")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := plugin.LaunchDriver(ctx, plugin.Config{
		Name:   "process",
		Path:   path,
		SHA256: sha256File(t, path),
		Args:   []string{"--state-dir", filepath.Join(t.TempDir(), "state")},
		Logger: logger,
	})
	if err != nil {
		t.Fatalf("LaunchDriver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestDriverRelaunchKeepsWorkload(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	d := launchDriver(t, logger)
	ctx := context.Background()

	desc, err := d.Describe(ctx)
	if err != nil || desc.Name != "process" || !desc.Capabilities.OutlivesDriver {
		t.Fatalf("Describe = %+v, %v", desc, err)
	}
	work := t.TempDir()
	r, err := d.Start(ctx, &runtime.StartRequest{
		WorkloadID: "wl_sleep",
		Command:    []string{"sleep", "300"},
		Env:        map[string]string{"PATH": os.Getenv("PATH")},
		WorkDir:    work,
		LogPath:    filepath.Join(work, "out.log"),
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	wpid := r.State.PID
	t.Cleanup(func() { _ = syscall.Kill(-wpid, syscall.SIGKILL) })
	if r.State.State != runtime.StateRunning || !processAlive(wpid) {
		t.Fatalf("Start state = %+v", r.State)
	}
	// The plugin's own log lines come back through the host logger.
	waitFor(t, 10*time.Second, "plugin log line re-emitted", func() bool {
		return strings.Contains(logs.String(), `msg="started workload"`) && strings.Contains(logs.String(), "plugin=process")
	})

	ppid := d.PID()
	if err := syscall.Kill(ppid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill plugin %d: %v", ppid, err)
	}
	waitFor(t, 10*time.Second, "calls refused while the plugin is down", func() bool {
		_, err := d.List(ctx)
		return errors.Is(err, plugin.ErrUnavailable)
	})
	if !processAlive(wpid) {
		t.Fatalf("workload %d died with its driver", wpid)
	}
	waitFor(t, 20*time.Second, "plugin relaunched", func() bool { return d.Launches() == 2 && d.PID() != 0 })
	if d.PID() == ppid {
		t.Fatalf("relaunched plugin has the old pid %d", ppid)
	}

	list, err := d.List(ctx)
	if err != nil {
		t.Fatalf("List after relaunch: %v", err)
	}
	if len(list) != 1 || list[0].WorkloadID != "wl_sleep" || list[0].State != runtime.StateRunning || list[0].PID != wpid {
		t.Fatalf("List after relaunch = %+v", list)
	}
	if !processAlive(wpid) {
		t.Fatalf("workload %d not running after relaunch", wpid)
	}

	stop, err := d.Stop(ctx, &runtime.StopRequest{WorkloadID: "wl_sleep", Timeout: 5 * time.Second})
	if err != nil || stop.State.State != runtime.StateExited {
		t.Fatalf("Stop = %+v, %v", stop, err)
	}
	if _, err := d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: "wl_sleep"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Inspect after Stop err = %v, want ErrNotFound across the wire", err)
	}

	cur := d.PID()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if processAlive(cur) {
		t.Fatalf("plugin process %d still alive after Close", cur)
	}
	if _, err := d.List(ctx); !errors.Is(err, plugin.ErrUnavailable) {
		t.Fatalf("List after Close err = %v, want ErrUnavailable", err)
	}
}

func TestChecksumMismatch(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	_, err := plugin.LaunchDriver(context.Background(), plugin.Config{
		Name:   "process",
		Path:   filepath.Join(binDir, "berth-plugin-process"),
		SHA256: strings.Repeat("00", 32),
		Args:   []string{"--state-dir", t.TempDir()},
		Logger: logger,
	})
	if !errors.Is(err, plugin.ErrChecksum) {
		t.Fatalf("LaunchDriver with a wrong checksum err = %v, want ErrChecksum", err)
	}
}

func TestWrongKindFailsHandshake(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A gateway binary is not a runtime driver.
	_, err := plugin.LaunchDriver(ctx, plugin.Config{
		Name:   "gateway",
		Path:   filepath.Join(binDir, "berth-plugin-gateway"),
		Args:   []string{"--listen", "127.0.0.1:0"},
		Logger: logger,
	})
	if err == nil {
		t.Fatal("LaunchDriver of a gateway binary succeeded")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func get(addr, host string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestGatewayRelaunchResendsTable(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(upstream.Close)

	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := plugin.LaunchGateway(ctx, plugin.Config{
		Name:   "gateway",
		Path:   filepath.Join(binDir, "berth-plugin-gateway"),
		Args:   []string{"--listen", addr},
		Logger: logger,
	})
	if err != nil {
		t.Fatalf("LaunchGateway: %v", err)
	}
	t.Cleanup(func() { g.Close() })

	desc, err := g.Describe(ctx)
	if err != nil || desc.Name != "gateway" {
		t.Fatalf("Describe = %+v, %v", desc, err)
	}
	table := routes.Table{Revision: 1, Routes: []routes.Route{{
		Hostname: "app.test", Project: "prj_1", Service: "web",
		Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: strings.TrimPrefix(upstream.URL, "http://"), Healthy: true}},
	}}}
	if err := g.SetRoutes(ctx, table); err != nil {
		t.Fatalf("SetRoutes: %v", err)
	}
	if code, body, err := get(addr, "app.test"); err != nil || code != http.StatusOK || body != "hello from upstream" {
		t.Fatalf("GET through the gateway = %d %q, %v", code, body, err)
	}

	old := g.PID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "gateway relaunched", func() bool { return g.Launches() == 2 && g.PID() != 0 })
	// The relaunched process got the table again without a new SetRoutes.
	waitFor(t, 10*time.Second, "route served after relaunch", func() bool {
		code, body, err := get(addr, "app.test")
		return err == nil && code == http.StatusOK && body == "hello from upstream"
	})

	cur := g.PID()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if processAlive(cur) {
		t.Fatalf("gateway process %d still alive after Close", cur)
	}
}

func TestGatewayListenFailure(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = plugin.LaunchGateway(ctx, plugin.Config{
		Name:   "gateway",
		Path:   filepath.Join(binDir, "berth-plugin-gateway"),
		Args:   []string{"--listen", ln.Addr().String()},
		Logger: logger,
	})
	if err == nil {
		t.Fatal("LaunchGateway on a busy port succeeded")
	}
	waitFor(t, 5*time.Second, "listen error in the host log", func() bool {
		return strings.Contains(logs.String(), "cannot listen on "+ln.Addr().String())
	})
}
