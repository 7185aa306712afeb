// Package edge runs the edge end to end with real processes: berthd whose
// gateway is the Caddy adapter driving a real Caddy, an agent with the
// process driver, and real HTTP through Caddy (docs/plugins.md section 5.7,
// docs/routes.md).
package edge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/caddytest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// env holds what TestMain prepared: the binaries, the hello bundle, Caddy.
var env struct {
	bin      string // berthd, berth, berth-agent and the caddy, process, dns and gateway plugins
	helloDir string
	caddy    *caddytest.Server
}

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "berth-edge-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	build := func(out string, pkgs ...string) error {
		cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %v: %w\n%s", pkgs, err, b)
		}
		return nil
	}
	env.bin = os.Getenv("BERTH_BIN_DIR")
	if env.bin == "" {
		env.bin = filepath.Join(tmp, "bin")
		if err := build(env.bin+"/", "./cmd/berthd", "./cmd/berth-agent", "./cmd/berth-plugin-caddy", "./cmd/berth-plugin-process",
			"./cmd/berth", "./cmd/berth-plugin-dns", "./cmd/berth-plugin-gateway"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	env.helloDir = filepath.Join(tmp, "hello")
	if err := build(filepath.Join(env.helloDir, "hello"), "./examples/apps/hello"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	bin, err := caddytest.Find()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	caddyDir := filepath.Join(tmp, "caddy")
	if err := os.MkdirAll(caddyDir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env.caddy, err = caddytest.StartDir(bin, freeAddr(), caddyDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.caddy.Stop()
	return m.Run()
}

func freeAddr() string {
	addr, err := proctest.ReserveAddr()
	if err != nil {
		return "127.0.0.1:0"
	}
	return addr
}

// killWorkloads SIGKILLs the processes whose working directory is under dir
// and whose environment names a workload: workloads outlive the agent on
// purpose, and a test leaves no process behind.
func killWorkloads(t *testing.T, dir string) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(raw, []byte("BERTH_WORKLOAD_ID=")) {
			t.Logf("killing leftover workload pid %d", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestCaddyGatewayServesBerthsRoutes: berthd configured through plugins.json
// with the Caddy adapter as its gateway routes a service through the real
// Caddy; another service cannot take a hostname the first holds (409 naming
// the holder) and `berth routes` shows the table; deleting the service
// withdraws its hostname from Caddy, which then answers 404 no_route.
func TestCaddyGatewayServesBerthsRoutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	gatewayAddr, api := proctest.FreeAddr(t), proctest.FreeAddr(t)

	// A plugin directory whose catalog names the adapter as the gateway.
	pdir := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(env.bin, "berth-plugin-caddy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "berth-plugin-caddy"), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	catalog := fmt.Sprintf(`{"plugins": [{"name": "gateway", "kind": "provider", "path": "berth-plugin-caddy", "sha256": %q, "args": ["--admin", %q]}]}`,
		hex.EncodeToString(sum[:]), env.caddy.Admin)
	if err := os.WriteFile(filepath.Join(pdir, "plugins.json"), []byte(catalog), 0o600); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "berthd")
	berthd := proctest.Start(t, filepath.Join(dir, "berthd.log"), filepath.Join(env.bin, "berthd"), "--data-dir", data, "--listen", api,
		"--gateway-listen", gatewayAddr, "--plugin-dir", pdir, "--sweep-floor", "1s")
	proctest.LogTailsOnFailure(t, dir, "berthd.log", "agent.log")
	url := "https://" + api
	d := proctest.WaitBerthdReady(t, berthd, data, url, 2*time.Minute)
	c, err := client.New(url, client.WithToken(d.Token), client.WithFingerprint(d.Fingerprint))
	if err != nil {
		t.Fatal(err)
	}

	// One node with the process driver.
	jt, err := c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(dir, "agent"), filepath.Join(dir, "agent.log")
	enroll := proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "enroll", "--server", url, "--join-token", jt.Token,
		"--fingerprint", d.Fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	// Registered before the agent starts, so it runs after the agent stopped.
	t.Cleanup(func() { killWorkloads(t, dir) })
	proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", agentDir)
	digest := pushHello(t, c)
	one := 1
	spec := client.ServiceSpec{Bundle: digest, Command: []string{"./hello"}, Domains: []string{"shop.localhost"}, Replicas: &one,
		HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}
	if _, err := c.ApplyService(ctx, "default", "shop", spec); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 3*time.Minute, "shop.localhost answered through caddy", func() (bool, string) {
		code, _, body := get(gatewayAddr, "shop.localhost")
		return code == 200 && strings.Contains(body, "from "), fmt.Sprintf("%d %q", code, body)
	})

	// Another service cannot take the hostname shop holds.
	other := spec
	other.Domains = []string{"other.localhost", "shop.localhost"}
	_, err = c.ApplyService(ctx, "default", "other", other)
	if !client.IsCode(err, "already_exists") || !strings.Contains(err.Error(), "default/shop") {
		t.Fatalf("a second service applying shop.localhost: %v, want already_exists naming default/shop", err)
	}
	st, err := c.Routes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Table.Routes) != 1 || st.Table.Routes[0].Hostname != "shop.localhost" || len(st.Table.Excluded) != 0 {
		t.Fatalf("routes %+v excluded %+v", st.Table.Routes, st.Table.Excluded)
	}

	// Deleting the service withdraws its hostname from Caddy.
	if err := c.DeleteService(ctx, "default", "shop", nil); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 2*time.Minute, "shop.localhost withdrawn from caddy", func() (bool, string) {
		code, h, body := get(gatewayAddr, "shop.localhost")
		return code == 404 && h.Get("X-Berth-Gateway") == "no-route", fmt.Sprintf("%d %q", code, body)
	})
}

func pushHello(t *testing.T, c *client.Client) string {
	t.Helper()
	var buf bytes.Buffer
	digest, _, err := bundle.Create(context.Background(), env.helloDir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := c.PushBundle(context.Background(), "default", "hello", &buf)
	if err != nil {
		t.Fatalf("push the hello bundle: %v", err)
	}
	if pushed.Digest != digest {
		t.Fatalf("pushed digest %s, computed %s", pushed.Digest, digest)
	}
	return pushed.Digest
}

func get(addr, host string) (int, http.Header, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	req.Host = host
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header, string(body)
}
