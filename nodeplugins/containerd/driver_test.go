package containerd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/nodeplugins/containerd"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runtime"
)

// fixture is one test's driver on its own containerd namespace, with a
// busybox image archive.
type fixture struct {
	addr, ns, stateDir string
	archive, digest    string
	d                  *containerd.Driver
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	addr := ctrtest.Address(t)
	f := &fixture{addr: addr, ns: ctrtest.Namespace(t, addr), stateDir: t.TempDir()}
	f.archive, f.digest = ctrtest.Archive(t, ctrtest.Image(t, ctrtest.Config{Cmd: []string{"sleep", "300"}}))
	f.d = f.open(t)
	return f
}

func (f *fixture) open(t *testing.T) *containerd.Driver {
	t.Helper()
	d, err := containerd.New(t.Context(), containerd.Config{Address: f.addr, Namespace: f.ns, StateDir: f.stateDir})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func (f *fixture) req(t *testing.T, id string, cmd ...string) *runtime.StartRequest {
	dir := t.TempDir()
	return &runtime.StartRequest{WorkloadID: id, Command: cmd, Image: f.digest, ImageArchive: f.archive,
		LogPath: filepath.Join(dir, "output.log"), Mutation: runtime.Mutation{IdempotencyKey: "start-" + id + "-" + dir}}
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 50 ms until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s (last error: %v)", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConformance(t *testing.T) {
	addr := ctrtest.Address(t)
	archive, dg := ctrtest.Archive(t, ctrtest.Image(t, ctrtest.Config{}))
	prepare := func(req *runtime.StartRequest) { req.Image, req.ImageArchive = dg, archive }
	cmd := []string{"/bin/sh", "-c", "echo " + conformance.Marker + "; trap 'exit 0' TERM; while :; do sleep 1; done"}
	t.Run("in-process", func(t *testing.T) {
		ns := ctrtest.Namespace(t, addr)
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			Factory: func(dir string) (runtime.Driver, error) {
				return containerd.New(t.Context(), containerd.Config{Address: addr, Namespace: ns, StateDir: dir})
			},
			Command: cmd, Env: map[string]string{"PATH": "/bin"}, Prepare: prepare,
		})
	})
	t.Run("binary", func(t *testing.T) {
		ns := ctrtest.Namespace(t, addr)
		bin := filepath.Join(os.Getenv(ctrtest.EnvBinDir), "berth-plugin-containerd")
		if os.Getenv(ctrtest.EnvBinDir) == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-containerd")
		}
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			Binary: bin,
			Args: func(dir string) []string {
				return []string{"--state-dir", dir, "--address", addr, "--namespace", ns}
			},
			Command: cmd, Env: map[string]string{"PATH": "/bin"}, Prepare: prepare,
		})
	})
}

func TestStartLogsStatsStop(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.req(t, "wl_logs", "sh", "-c", `echo "hello $GREETING from $(pwd) as $(id -u):$(id -g)"; trap 'echo bye; exit 0' TERM; while :; do sleep 1; done`)
	req.Env = map[string]string{"GREETING": "berth"}
	req.Cwd = "/tmp"
	req.User = "65534:65534"
	r, err := f.d.Start(ctx(t), req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if r.State.State != runtime.StateRunning || r.State.PID <= 0 {
		t.Fatalf("Start state = %+v; want running with a pid", r.State)
	}
	want := "hello berth from /tmp as 65534:65534"
	waitFor(t, "the greeting in the log file", func() (bool, error) {
		b, err := os.ReadFile(req.LogPath)
		return bytes.Contains(b, []byte(want)), err
	})
	var buf bytes.Buffer
	if err := f.d.Logs(ctx(t), &runtime.LogsRequest{WorkloadID: "wl_logs"}, &buf); err != nil || !strings.Contains(buf.String(), want) {
		t.Errorf("Logs = %q, %v; want %q", buf.String(), err, want)
	}
	st, err := f.d.Stats(ctx(t), &runtime.StatsRequest{WorkloadID: "wl_logs"})
	if err != nil || st.MemoryBytes <= 0 {
		t.Errorf("Stats = %+v, %v; want memory > 0", st, err)
	}
	stop, err := f.d.Stop(ctx(t), &runtime.StopRequest{WorkloadID: "wl_logs", Timeout: 20 * time.Second, Mutation: runtime.Mutation{IdempotencyKey: "stop-logs"}})
	if err != nil {
		t.Fatalf("graceful Stop: %v", err)
	}
	if stop.State.State != runtime.StateExited || stop.State.ExitCode != 0 {
		t.Errorf("graceful Stop = %+v; want exited 0 (the trap ran)", stop.State)
	}
	if b, _ := os.ReadFile(req.LogPath); !bytes.Contains(b, []byte("bye")) {
		t.Errorf("the workload's TERM trap did not run; log: %q", b)
	}
	if _, err := f.d.Inspect(ctx(t), &runtime.InspectRequest{WorkloadID: "wl_logs"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect after Stop: %v; want not found", err)
	}
}

func TestForcedStopAndCrash(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.d.Start(ctx(t), f.req(t, "wl_forced", "sleep", "300")); err != nil {
		t.Fatalf("Start: %v", err)
	}
	stop, err := f.d.Stop(ctx(t), &runtime.StopRequest{WorkloadID: "wl_forced", Mode: runtime.StopForced, Mutation: runtime.Mutation{IdempotencyKey: "stop-forced"}})
	if err != nil || stop.State.ExitCode != 137 {
		t.Errorf("forced Stop = %+v, %v; want exit 137 (SIGKILL)", stop.State, err)
	}

	if _, err := f.d.Start(ctx(t), f.req(t, "wl_crash", "sh", "-c", "echo going; exit 3")); err != nil {
		t.Fatalf("Start: %v", err)
	}
	var last *runtime.WorkloadState
	waitFor(t, "the crashed workload reported exited", func() (bool, error) {
		st, err := f.d.Inspect(ctx(t), &runtime.InspectRequest{WorkloadID: "wl_crash"})
		last = st
		return err == nil && st.State == runtime.StateExited, err
	})
	if last.ExitCode != 3 || last.ExitedAt.IsZero() {
		t.Errorf("crashed workload = %+v; want exit code 3 and an exit time", last)
	}
	// A Start of an exited workload replaces it (this is the agent's restart).
	r, err := f.d.Start(ctx(t), f.req(t, "wl_crash", "sleep", "300"))
	if err != nil || r.State.State != runtime.StateRunning {
		t.Fatalf("restart of the crashed workload = %+v, %v; want running", r, err)
	}
}

// TestRecoverAfterDriverRestart: the task keeps running while no driver runs,
// and a new driver (fresh state directory: only the handle is left) finds it
// with the same pid.
func TestRecoverAfterDriverRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := f.d.Start(ctx(t), f.req(t, "wl_recover", "sleep", "300"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := f.d.Close(); err != nil {
		t.Fatal(err)
	}
	f.stateDir = t.TempDir()
	d2 := f.open(t)
	got, err := d2.Recover(ctx(t), &runtime.RecoverRequest{WorkloadID: "wl_recover", Handle: r.State.Handle})
	if err != nil || got.State != runtime.StateRunning || got.PID != r.State.PID || !got.StartedAt.Equal(r.State.StartedAt) {
		t.Fatalf("Recover = %+v, %v; want the same running task (pid %d)", got, err, r.State.PID)
	}
	list, err := d2.List(ctx(t))
	if err != nil || len(list) != 1 || list[0].PID != r.State.PID {
		t.Errorf("List after restart = %v, %v", list, err)
	}
	other := r.State.Handle
	other.Data = bytes.Replace(other.Data, []byte(f.ns), []byte("elsewhere"), 1)
	if _, err := d2.Recover(ctx(t), &runtime.RecoverRequest{WorkloadID: "wl_recover", Handle: other}); err == nil {
		t.Errorf("Recover of a handle of another namespace succeeded")
	}
}

// TestMemoryLimit reads the limit from the task's cgroup and shows it
// enforced: a process allocating past it is killed.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const limit = 32 << 20
	req := f.req(t, "wl_mem", "sleep", "300")
	req.MemoryBytes = limit
	req.CPUMillis = 500
	r, err := f.d.Start(ctx(t), req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	got, err := cgroupMemoryLimit(r.State.PID)
	if err != nil {
		t.Fatalf("read the cgroup's memory limit: %v", err)
	}
	if got != limit {
		t.Errorf("cgroup memory limit = %d; want %d", got, limit)
	}
	// dd allocates a 64 MiB buffer: twice the limit.
	hog := f.req(t, "wl_hog", "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4")
	hog.MemoryBytes = limit
	if _, err := f.d.Start(ctx(t), hog); err != nil {
		t.Fatalf("Start: %v", err)
	}
	var last *runtime.WorkloadState
	waitFor(t, "the memory hog to end", func() (bool, error) {
		st, err := f.d.Inspect(ctx(t), &runtime.InspectRequest{WorkloadID: "wl_hog"})
		last = st
		return err == nil && st.State == runtime.StateExited, err
	})
	if last.ExitCode != 137 {
		t.Errorf("memory hog exited %d; want 137 (killed by the OOM killer)", last.ExitCode)
	}
}

// cgroupMemoryLimit reads the memory limit of pid's cgroup (v1 or v2).
func cgroupMemoryLimit(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
		case strings.Contains(","+parts[1]+",", ",memory,"):
			file = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		default:
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var v int64
		if _, err := fmt.Sscan(string(b), &v); err == nil {
			return v, nil
		}
	}
	return 0, fmt.Errorf("no memory cgroup limit found for pid %d in %q", pid, raw)
}

// TestPullFromRegistry pulls by digest from a registry on loopback.
func TestPullFromRegistry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	img := ctrtest.Image(t, ctrtest.Config{Cmd: []string{"sleep", "300"}})
	tag, err := name.NewTag(strings.TrimPrefix(srv.URL, "http://") + "/test/busybox:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	dg, _ := img.Digest()
	ref := tag.Context().Name() + "@" + dg.String()
	req := f.req(t, "wl_pull")
	req.Image, req.ImageArchive = ref, ""
	r, err := f.d.Start(ctx(t), req)
	if err != nil || r.State.State != runtime.StateRunning {
		t.Fatalf("Start from the registry = %+v, %v", r, err)
	}
	req = f.req(t, "wl_tag")
	req.Image, req.ImageArchive = tag.String(), ""
	if _, err := f.d.Start(ctx(t), req); !errors.Is(err, containerd.ErrInvalidRequest) {
		t.Errorf("Start of an image by tag: %v; want a refusal (images are pinned by digest)", err)
	}
}

func TestRefusesDocker(t *testing.T) {
	t.Parallel()
	addr := ctrtest.Address(t)
	_, err := containerd.New(t.Context(), containerd.Config{Address: addr, Namespace: "moby", StateDir: t.TempDir()})
	if !errors.Is(err, containerd.ErrDockerSocket) {
		t.Errorf("New on Docker's namespace: %v; want ErrDockerSocket", err)
	}
	_, err = containerd.New(t.Context(), containerd.Config{Address: "/run/docker/containerd/containerd.sock", StateDir: t.TempDir()})
	if !errors.Is(err, containerd.ErrDockerSocket) {
		t.Errorf("New on Docker's socket path: %v; want ErrDockerSocket", err)
	}
}

// TestPullWithRegistryCredential pulls by digest from a registry behind
// HTTPS and Basic authentication, as a node pulls from berthd's /v2: without
// the credential, with a wrong one, or with it but another certificate pin,
// the start fails with image_unavailable and the registry's answer; with both it runs, and
// the secret is in none of the driver's records.
func TestPullWithRegistryCredential(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const user, secret = "node", "brn_pull-secret-for-the-test"
	reg := registry.New()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != secret {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	img := ctrtest.Image(t, ctrtest.Config{Cmd: []string{"sleep", "300"}})
	tag, err := name.NewTag(host + "/shop/web:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, remote.WithTransport(srv.Client().Transport),
		remote.WithAuth(&authn.Basic{Username: user, Password: secret})); err != nil {
		t.Fatalf("push: %v", err)
	}
	dg, _ := img.Digest()
	ref := tag.Context().Name() + "@" + dg.String()
	pin := client.Fingerprint(srv.Certificate().Raw)
	start := func(id string, creds ...runtime.RegistryCredential) (*runtime.StartResponse, error) {
		req := f.req(t, id)
		req.Image, req.ImageArchive, req.RegistryCredentials = ref, "", creds
		return f.d.Start(ctx(t), req)
	}
	unavailable := abierrors.New(abierrors.ImageUnavailable, "")
	if _, err := start("wl_anon"); !errors.Is(err, unavailable) {
		t.Errorf("Start without a credential: %v; want image_unavailable", err)
	}
	if _, err := start("wl_wrong", runtime.RegistryCredential{Host: host, Username: user, Secret: "brn_wrong", Fingerprint: pin}); !errors.Is(err, unavailable) || !strings.Contains(err.Error(), "401") {
		t.Errorf("Start with a wrong secret: %v; want image_unavailable naming the 401", err)
	}
	other := "sha256:" + strings.Repeat("ab", 32)
	if _, err := start("wl_pin", runtime.RegistryCredential{Host: host, Username: user, Secret: secret, Fingerprint: other}); !errors.Is(err, unavailable) || !strings.Contains(err.Error(), "fingerprint") {
		t.Errorf("Start with another pin: %v; want image_unavailable naming the fingerprint", err)
	}
	r, err := start("wl_pull", runtime.RegistryCredential{Host: host, Username: user, Secret: secret, Fingerprint: pin})
	if err != nil || r.State.State != runtime.StateRunning {
		t.Fatalf("Start with the credential = %+v, %v", r, err)
	}
	if strings.Contains(fmt.Sprint(runtime.RegistryCredential{Secret: secret}), secret) {
		t.Error("a credential prints its secret")
	}
	err = filepath.WalkDir(f.stateDir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err == nil && bytes.Contains(raw, []byte(secret)) {
			t.Errorf("%s holds the registry secret", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
