// Package images runs Berth's image flow end to end on a containerd node:
// images pushed with crane to berthd's /v2, pulled by the node with its own
// credential, deploy on push, and promotion of reserved release tags.
package images

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/sdk/client"
)

// converge bounds each wait for the cluster to reach a state.
const converge = 120 * time.Second

// bin is the directory of the built binaries (BERTH_BIN_DIR, or built here).
var bin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	bin = os.Getenv(ctrtest.EnvBinDir)
	if bin == "" {
		tmp, err := os.MkdirTemp("", "berth-e2e-images-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		bin = filepath.Join(tmp, "bin")
		cmd := exec.Command("go", "build", "-o", bin+"/", "./cmd/...")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build ./cmd/...: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "."
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// craneBinary finds crane (make test installs it); without it the test fails.
func craneBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("crane"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "crane")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("crane is not installed: go install github.com/google/go-containerregistry/cmd/crane@v0.22.1 (make test does)")
	return ""
}

// cluster is one berthd with one containerd node.
type cluster struct {
	dir, api, gateway, url, fingerprint, token string
	c                                          *client.Client
	crane                                      string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	addr := ctrtest.Address(t)
	ns := ctrtest.Namespace(t, addr) // cleaned up last, once the agent has stopped
	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t), crane: craneBinary(t)}
	t.Cleanup(func() { cl.killGateway(t) })
	t.Cleanup(func() { cl.dumpLogs(t) })
	berthd := proctest.Start(t, filepath.Join(cl.dir, "berthd.log"), filepath.Join(bin, "berthd"),
		"--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api, "--gateway-listen", cl.gateway,
		"--log-level", "debug", "--sweep-floor", "1s")
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	cl.fingerprint, cl.token = d.Fingerprint, d.Token
	var err error
	if cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint)); err != nil {
		t.Fatal(err)
	}
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(cl.dir, "agent"), filepath.Join(cl.dir, "agent.log")
	enroll := proctest.Start(t, agentLog, filepath.Join(bin, "berth-agent"), "enroll", "--server", cl.url,
		"--join-token", jt.Token, "--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	agent := exec.Command(filepath.Join(bin, "berth-agent"), "run", "--data-dir", agentDir, "--driver", "containerd")
	agent.Env = append(os.Environ(), "BERTH_CONTAINERD_ADDRESS="+addr, "BERTH_CONTAINERD_NAMESPACE="+ns)
	proctest.StartCmd(t, agentLog, agent)
	proctest.WaitFor(t, converge, "node connected", func() (bool, string) {
		nodes, err := cl.c.ListNodes(context.Background())
		if err != nil || len(nodes) != 1 {
			return false, fmt.Sprint(nodes, err)
		}
		return nodes[0].Status == "connected", nodes[0].Status
	})
	if _, err := cl.c.PutProject(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	if out, err := cl.run(cl.crane, "auth", "login", cl.api, "-u", "berth", "-p", cl.token); err != nil {
		t.Fatalf("crane auth login: %v\n%s", err, out)
	}
	return cl
}

// killGateway SIGKILLs the gateway berthd leaves running on purpose.
func (cl *cluster) killGateway(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(cl.dir, "berthd", "plugins", "gateway.reattach.json"))
	if err != nil {
		return
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if json.Unmarshal(raw, &rec) != nil || rec.PID <= 0 {
		return
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", rec.PID)); err == nil && strings.Contains(string(cmdline), "berth-plugin-gateway") {
		_ = syscall.Kill(rec.PID, syscall.SIGKILL)
	}
}

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

// run runs a program with the cluster's home (crane keeps its login there).
func (cl *cluster) run(prog string, args ...string) (string, error) {
	cmd := exec.Command(prog, args...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "DOCKER_CONFIG="+filepath.Join(cl.dir, "docker"), "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return strings.TrimSpace(string(out) + stderr.String()), err
	}
	return strings.TrimSpace(string(out)), nil
}

// berth runs the CLI against the cluster.
func (cl *cluster) berth(args ...string) (string, error) {
	return cl.run(filepath.Join(bin, "berth"), append([]string{"--server", cl.url, "--token", cl.token, "--fingerprint", cl.fingerprint}, args...)...)
}

// push builds a busybox image that serves "<version>\n" over HTTP on
// $HOST:$PORT (or, with serve false, exits 3 at once), pushes it with crane
// to default/web:<tag> and returns its digest.
func (cl *cluster) push(t *testing.T, tag, version string, serve bool) string {
	t.Helper()
	script := fmt.Sprintf(`echo %s >/tmp/index.html; exec httpd -f -p "$HOST:$PORT" -h /tmp`, version)
	if !serve {
		script = "echo " + version + " refuses to start >&2; exit 3"
	}
	img := ctrtest.Image(t, ctrtest.Config{Entrypoint: []string{"sh", "-c", script}})
	return cl.pushImage(t, img, tag)
}

func (cl *cluster) pushImage(t *testing.T, img v1.Image, tag string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.tar")
	ref, _ := name.NewTag("default/web:" + tag)
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
	if out, err := cl.run(cl.crane, "push", path, cl.api+"/default/web:"+tag, "--insecure"); err != nil {
		t.Fatalf("crane push %s: %v\n%s", tag, err, out)
	}
	// crane pushes a tarball under its own manifest: ask for the digest.
	d, err := cl.run(cl.crane, "digest", cl.api+"/default/web:"+tag, "--insecure")
	if err != nil || !strings.HasPrefix(d, "sha256:") {
		t.Fatalf("crane digest %s: %v %s", tag, err, d)
	}
	return d
}

// answer is one GET / for web.localhost through the gateway: the body, or
// the status when it is not 200.
func (cl *cluster) answer() string {
	req, _ := http.NewRequest(http.MethodGet, "http://"+cl.gateway+"/", nil)
	req.Host = "web.localhost"
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	return strings.TrimSpace(string(b))
}

// waitServing waits until 10 answers in a row through the gateway say version
// and the service runs digest.
func (cl *cluster) waitServing(t *testing.T, version, digest string) {
	t.Helper()
	proctest.WaitFor(t, converge, "web serves "+version, func() (bool, string) {
		s, err := cl.c.GetService(context.Background(), "default", "web")
		if err != nil {
			return false, err.Error()
		}
		if !strings.HasSuffix(s.Image, "@"+digest) {
			return false, "service image " + s.Image
		}
		for range 10 {
			if got := cl.answer(); got != version {
				return false, "answered " + got
			}
		}
		return true, ""
	})
}

// TestDeployOnPushAndPromoteOnContainerd: a service following default/web:main
// on a containerd node runs the digest crane pushed, pulled from berthd's
// /v2 with the node's credential; a new push to the tag rolls it out; a
// reserved release tag pushed by CI is promoted with --wait; a promotion of
// a release that does not start fails, rolls back, and the previous release
// keeps serving throughout.
func TestDeployOnPushAndPromoteOnContainerd(t *testing.T) {
	cl := newCluster(t)
	ctx := context.Background()
	d1 := cl.push(t, "main", "v1", true)
	replicas := 2
	_, err := cl.c.ApplyService(ctx, "default", "web", client.ServiceSpec{
		Domains: []string{"web.localhost"}, Replicas: &replicas, ProgressDeadlineS: 60, AutoRollback: true,
		Container: client.Container{Runtime: "containerd", Image: "default/web:main", DeployOnPush: true},
	})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	cl.waitServing(t, "v1", d1)

	// Deploy on push: the tag moves, the service follows.
	d2 := cl.push(t, "main", "v2", true)
	cl.waitServing(t, "v2", d2)

	// A reserved release tag, pushed once and promoted.
	if out, err := cl.berth("release", "reserve", "web", "v3.0.0"); err != nil || !strings.Contains(out, "reserved") {
		t.Fatalf("release reserve: %v %s", err, out)
	}
	d3 := cl.push(t, "v3.0.0", "v3", true)
	if out, err := cl.berth("release", "promote", "web", "v3.0.0", "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("release promote --wait: %v\n%s", err, out)
	}
	cl.waitServing(t, "v3", d3)

	// A promotion that cannot start: it fails, is rolled back, and v3 keeps
	// serving while it runs.
	if out, err := cl.berth("release", "reserve", "web", "v4.0.0"); err != nil {
		t.Fatalf("release reserve v4: %v %s", err, out)
	}
	cl.push(t, "v4.0.0", "v4", false)
	stop := make(chan struct{})
	seen := make(chan map[string]int, 1)
	go func() {
		answers := map[string]int{}
		defer func() { seen <- answers }()
		for i := 0; i < 100_000; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			answers[cl.answer()]++
		}
	}()
	out, err := cl.berth("release", "promote", "web", "v4.0.0", "--wait", "--timeout", "4m")
	close(stop)
	answers := <-seen
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("promote --wait of a release that does not start: %v\n%s; want exit 1", err, out)
	}
	cl.waitServing(t, "v3", d3)
	for a, n := range answers {
		if a != "v3" {
			t.Errorf("during the failed promotion %d answers were %q; want every one from v3", n, a)
		}
	}
	if answers["v3"] == 0 {
		t.Errorf("no answer said v3 during the failed promotion: %v", answers)
	}
	t.Logf("answers during the failed promotion: %v", answers)

	// The retention pass is wired: everything here is young, so a dry run
	// lists nothing, and what runs stays pullable.
	if out, err := cl.berth("registry", "gc", "--dry-run"); err != nil || !strings.Contains(out, "would delete 0 objects") {
		t.Fatalf("registry gc --dry-run: %v\n%s", err, out)
	}
}
