// Package e2e runs Berth end to end with real processes: berthd (embedded store,
// gateway plugin), berth-agent with the process driver plugin, the CLI, and
// real HTTP through the gateway.
package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// env holds what TestMain built: the binaries and the example bundles.
var env struct {
	bin        string // directory of berthd, berth, berth-agent, berth-plugin-*
	helloDir   string
	httpbinDir string
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

// e2eParallel is how many tests of this package run at once unless
// -parallel says otherwise: each waits on its own processes far more than it
// computes, so more than GOMAXPROCS of them share two cores well.
const e2eParallel = 3

func testMain(m *testing.M) int {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", strconv.Itoa(e2eParallel)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	tmp, err := os.MkdirTemp("", "berth-e2e-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env.bin = os.Getenv("BERTH_BIN_DIR")
	if env.bin == "" {
		env.bin = filepath.Join(tmp, "bin")
		if err := goBuild(root, env.bin+"/", "./cmd/..."); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	env.helloDir = filepath.Join(tmp, "hello")
	env.httpbinDir = filepath.Join(tmp, "httpbin")
	if err := goBuild(root, filepath.Join(env.helloDir, "hello"), "./examples/apps/hello"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := goBuild(root, filepath.Join(env.httpbinDir, "go-httpbin"), "github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func goBuild(root, out string, pkgs ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, b)
	}
	return nil
}

// start runs env.bin/name with args, its output appended to logPath; it is stopped at cleanup.
func start(t *testing.T, logPath string, name string, args ...string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, logPath, filepath.Join(env.bin, name), args...)
}

// waitFor is proctest.WaitFor: it polls cond every 100 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	proctest.WaitFor(t, timeout, what, cond)
}

// cluster is one berthd and its clients.
type cluster struct {
	dir, api, gateway string
	url               string // https://<api>
	fingerprint       string // berthd's certificate pin, from DATA/server-fingerprint
	berthd            *proctest.Proc
	token             string
	c                 *client.Client
	hc                *http.Client // pinned to fingerprint
	extra             []string     // berthd flags after the defaults (later flags win)
	// data is berthd's data directory; empty means DIR/berthd.
	data string
}

// dataDir is berthd's data directory.
func (cl *cluster) dataDir() string {
	if cl.data != "" {
		return cl.data
	}
	return filepath.Join(cl.dir, "berthd")
}

func startBerthd(t *testing.T, cl *cluster) {
	t.Helper()
	args := []string{"--data-dir", cl.dataDir(), "--listen", cl.api, "--gateway-listen", cl.gateway, "--log-level", "debug",
		"--runner-transport",
		// Passes at least 1 s apart instead of the default 5 s: these tests check what the
		// passes do, not their schedule (core/slots tests the schedule, make run uses the
		// defaults), and every rollout step takes a pass.
		"--sweep-floor", "1s"}
	cl.berthd = start(t, filepath.Join(cl.dir, "berthd.log"), "berthd", append(args, cl.extra...)...)
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, cl.berthd, cl.dataDir(), cl.url, 60*time.Second)
	cl.fingerprint, cl.token, cl.hc = d.Fingerprint, d.Token, d.HTTP
	var err error
	cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint))
	if err != nil {
		t.Fatal(err)
	}
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterAt(t, proctest.FreeAddr(t))
}

// newClusterAt is newCluster with berthd's API listening on api (host:port).
func newClusterAt(t *testing.T, api string) *cluster {
	t.Helper()
	cl := &cluster{dir: t.TempDir(), api: api, gateway: proctest.FreeAddr(t)}
	// Registered first, so it runs last: workloads outlive the agent and the
	// gateway outlives berthd by design, and a test must leave no process
	// behind.
	t.Cleanup(func() { cl.killWorkloads(t); cl.killGateway(t); proctest.KillUnder(t, cl.dir) })
	startBerthd(t, cl)
	t.Cleanup(func() { cl.dumpLogs(t) })
	return cl
}

// dumpLogs logs the tails of berthd's and the agent's logs when t failed.
func (cl *cluster) dumpLogs(t *testing.T) {
	if !t.Failed() {
		return
	}
	for _, f := range []string{"berthd.log", "agent.log"} {
		b, _ := os.ReadFile(filepath.Join(cl.dir, f))
		if len(b) > 20000 {
			b = b[len(b)-20000:]
		}
		t.Logf("---- %s (tail) ----\n%s", f, b)
	}
}

// cli runs the berth CLI against the cluster and returns its stdout.
func (cl *cluster) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.bin, "berth"), append([]string{"--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("berth %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

func (cl *cluster) pushBundle(t *testing.T, dir, name string) string {
	t.Helper()
	var buf bytes.Buffer
	digest, _, err := bundle.Create(context.Background(), dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.c.PushBundle(context.Background(), "default", name, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if b.Digest != digest {
		t.Fatalf("pushed digest %s, computed %s", b.Digest, digest)
	}
	return digest
}

// get sends a request through the gateway for host.
func (cl *cluster) get(host, path string) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+cl.gateway+path, nil)
	req.Host = host
	hc := &http.Client{Timeout: 10 * time.Second}
	return hc.Do(req)
}

// workloadPIDs maps workload id to the pids of this cluster's processes (their
// working directory is under the cluster's directory) whose environment names it.
func (cl *cluster) workloadPIDs(t *testing.T) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, cl.dir+"/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(raw, []byte{0}) {
			if id, ok := bytes.CutPrefix(kv, []byte("BERTH_WORKLOAD_ID=")); ok {
				out[string(id)] = append(out[string(id)], pid)
			}
		}
	}
	return out
}

// killWorkloads SIGKILLs every process of this cluster's workloads.
func (cl *cluster) killWorkloads(t *testing.T) {
	for id, pids := range cl.workloadPIDs(t) {
		for _, pid := range pids {
			t.Logf("killing leftover workload %s (pid %d)", id, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
