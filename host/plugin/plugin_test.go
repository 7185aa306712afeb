package plugin_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/syncbuf"

	"github.com/berthhq/berth/internal/proctest"
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
		"github.com/berthhq/berth/cmd/berth-plugin-gateway",
		"github.com/berthhq/berth/examples/provider-lying",
		"github.com/berthhq/berth/host/plugin/testdata/provider-health")
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

func testLogger(t *testing.T) (*slog.Logger, *syncbuf.Buffer) {
	t.Helper()
	buf := &syncbuf.Buffer{}
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

func freeAddr(t *testing.T) string { t.Helper(); return proctest.FreeAddr(t) }

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

func applyTable(ctx context.Context, p *plugin.Provider, table routes.Table) error {
	raw, err := json.Marshal(table)
	if err != nil {
		return err
	}
	_, err = p.PlanAndApply(ctx, abiprovider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw},
		pluginapi.Mutation{IdempotencyKey: fmt.Sprintf("routes-%d", table.Revision), FencingToken: uint64(table.Revision)})
	return err
}

func TestGatewayRelaunchReappliesTable(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(upstream.Close)

	addr := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := plugin.LaunchProvider(ctx, plugin.Config{
		Name:       "gateway",
		Path:       filepath.Join(binDir, "berth-plugin-gateway"),
		Args:       []string{"--listen", addr},
		Logger:     logger,
		MinBackoff: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("LaunchProvider: %v", err)
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
	if err := applyTable(ctx, g, table); err != nil {
		t.Fatalf("apply table: %v", err)
	}
	if code, body, err := get(addr, "app.test"); err != nil || code != http.StatusOK || body != "hello from upstream" {
		t.Fatalf("GET through the gateway = %d %q, %v", code, body, err)
	}
	waitFor(t, 10*time.Second, "health reported", func() bool { return g.Status().Health == pluginapi.Healthy })

	old := g.PID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "gateway relaunched", func() bool { return g.Launches() == 2 && g.PID() != 0 })
	// The relaunched process got the table again without a new Apply.
	waitFor(t, 10*time.Second, "route served after relaunch", func() bool {
		code, body, err := get(addr, "app.test")
		return err == nil && code == http.StatusOK && body == "hello from upstream"
	})
	if st := g.Status(); st.Crashes != 1 || st.State != plugin.StateRunning || st.Degraded {
		t.Fatalf("Status after one crash = %+v", st)
	}

	cur := g.PID()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if processAlive(cur) {
		t.Fatalf("gateway process %d still alive after Close", cur)
	}
}

func TestQuarantineAfterRepeatedCrashes(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := plugin.LaunchProvider(ctx, plugin.Config{
		Name:       "gateway",
		Path:       filepath.Join(binDir, "berth-plugin-gateway"),
		Args:       []string{"--listen", "127.0.0.1:0"},
		Logger:     logger,
		MinBackoff: 5 * time.Millisecond,
		MaxBackoff: 10 * time.Millisecond,
		CrashLimit: 3,
	})
	if err != nil {
		t.Fatalf("LaunchProvider: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	for i := 1; i <= 3; i++ {
		waitFor(t, 20*time.Second, "plugin up", func() bool { return g.PID() != 0 && g.Launches() == i })
		if err := syscall.Kill(g.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "quarantined", func() bool { return g.Status().State == plugin.StateQuarantined })
	if _, err := g.Describe(ctx); !errors.Is(err, plugin.ErrQuarantined) || !errors.Is(err, plugin.ErrUnavailable) {
		t.Fatalf("call on a quarantined plugin err = %v, want ErrQuarantined", err)
	}
	if st := g.Status(); st.Launches != 3 || st.Crashes != 3 || st.PID != 0 {
		t.Fatalf("Status = %+v", st)
	}
}

func TestOrphanReapedByPidAndStartTime(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	pidDir := t.TempDir()
	// A plugin process left by a "previous host": started, recorded, never closed.
	orphan := exec.Command("sleep", "300")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = orphan.Process.Kill(); _ = orphan.Wait() })
	exited := make(chan struct{})
	go func() { _ = orphan.Wait(); close(exited) }()
	writePidRecord(t, pidDir, "process", orphan.Process.Pid, 0)

	// A record whose pid is alive but started at another time (a reused
	// pid) must be left alone.
	bystander := exec.Command("sleep", "300")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bystander.Process.Kill(); _ = bystander.Wait() })
	writePidRecord(t, pidDir, "other", bystander.Process.Pid, 1)

	path := filepath.Join(binDir, "berth-plugin-process")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := plugin.LaunchDriver(ctx, plugin.Config{
		Name: "process", Path: path, SHA256: sha256File(t, path), PidDir: pidDir, Logger: logger,
		Args: []string{"--state-dir", t.TempDir()},
	})
	if err != nil {
		t.Fatalf("LaunchDriver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the recorded orphan was not killed")
	}
	raw, err := os.ReadFile(filepath.Join(pidDir, "process.pid"))
	if err != nil || !strings.Contains(string(raw), fmt.Sprintf(`"pid":%d`, d.PID())) {
		t.Fatalf("pid file after launch = %s, %v; want the new process %d", raw, err, d.PID())
	}
	// The "other" record names a live process with another start time.
	g, err := plugin.LaunchProvider(ctx, plugin.Config{
		Name: "other", Path: filepath.Join(binDir, "berth-plugin-gateway"), PidDir: pidDir, Logger: logger,
		Args: []string{"--listen", "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatalf("LaunchProvider: %v", err)
	}
	g.Close()
	if !processAlive(bystander.Process.Pid) {
		t.Fatal("a process whose start time differs from the record was killed")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pidDir, "process.pid")); !os.IsNotExist(err) {
		t.Fatalf("pid file left after Close: %v", err)
	}
}

// writePidRecord writes a handle's pid file for pid, with its real start
// time plus skew.
func writePidRecord(t *testing.T, dir, name string, pid int, skew uint64) {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"pid":%d,"start_ticks":%d,"path":"x"}`, pid, ticks+skew)
	if err := os.WriteFile(filepath.Join(dir, name+".pid"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCatalog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := plugin.LoadCatalog(dir); !errors.Is(err, plugin.ErrNoCatalog) {
		t.Fatalf("LoadCatalog of an empty directory err = %v, want ErrNoCatalog", err)
	}
	sum := strings.Repeat("ab", 32)
	write := func(body string) {
		if err := os.WriteFile(filepath.Join(dir, plugin.CatalogFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"plugins":[{"name":"gateway","kind":"provider","path":"bin/gw","sha256":"` + sum + `","config":{"a":1}}]}`)
	c, err := plugin.LoadCatalog(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := c.Lookup("gateway")
	if !ok || e.Path != filepath.Join(dir, "bin/gw") || e.SHA256 != sum || string(e.Config) != `{"a":1}` {
		t.Fatalf("entry = %+v, %v", e, ok)
	}
	if _, err := plugin.ResolveDriver(dir, "gateway"); err == nil {
		t.Fatal("a provider resolved as a driver")
	}
	for _, bad := range []string{
		`{"plugins":[{"name":"Gateway","kind":"provider","path":"x","sha256":"` + sum + `"}]}`,
		`{"plugins":[{"name":"gw","kind":"thing","path":"x","sha256":"` + sum + `"}]}`,
		`{"plugins":[{"name":"gw","kind":"provider","path":"x","sha256":"00"}]}`,
		`{"plugins":[{"name":"gw","kind":"provider","path":"x","sha256":"` + sum + `"},{"name":"gw","kind":"provider","path":"y","sha256":"` + sum + `"}]}`,
	} {
		write(bad)
		if _, err := plugin.LoadCatalog(dir); err == nil {
			t.Errorf("catalog %s accepted", bad)
		}
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
	_, err = plugin.LaunchProvider(ctx, plugin.Config{
		Name:   "gateway",
		Path:   filepath.Join(binDir, "berth-plugin-gateway"),
		Args:   []string{"--listen", ln.Addr().String()},
		Logger: logger,
	})
	if err == nil {
		t.Fatal("LaunchProvider on a busy port succeeded")
	}
	waitFor(t, 5*time.Second, "listen error in the host log", func() bool {
		return strings.Contains(logs.String(), "cannot listen on "+ln.Addr().String())
	})
}

// TestLaunchErrorCarriesStderr: a plugin that exits at start is reported
// with its own message and exit status, not go-plugin's guess.
func TestLaunchErrorCarriesStderr(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = plugin.LaunchProvider(ctx, plugin.Config{
		Name:   "gateway",
		Path:   filepath.Join(binDir, "berth-plugin-gateway"),
		Args:   []string{"--listen", ln.Addr().String()},
		Logger: logger,
	})
	var le *plugin.LaunchError
	if !errors.As(err, &le) {
		t.Fatalf("LaunchProvider on a busy port: %v; want a *plugin.LaunchError", err)
	}
	if !strings.HasPrefix(le.Exit, "exit status ") {
		t.Errorf("Exit = %q, want the process's exit status", le.Exit)
	}
	if !strings.Contains(err.Error(), "cannot listen on "+ln.Addr().String()) {
		t.Errorf("the error does not carry the plugin's stderr: %v", err)
	}
	if strings.Contains(err.Error(), "architecture") || strings.Contains(err.Error(), "Unrecognized remote plugin message") {
		t.Errorf("the error repeats go-plugin's guess: %v", err)
	}
}
