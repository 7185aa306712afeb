package reconcile

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/nodeplugins/nftables"
	"github.com/berthhq/berth/sdk/client"
)

// bundleBytes stands for the core's GET /api/v1/bundles/{digest}: it serves
// one bundle from memory.
type bundleBytes struct {
	digest string
	data   []byte
}

func (b bundleBytes) DownloadBundle(_ context.Context, digest string, w io.Writer) error {
	if digest != b.digest {
		return fmt.Errorf("no bundle %s", digest)
	}
	_, err := w.Write(b.data)
	return err
}

// imageBundle returns a busybox image as a bundle (gzipped OCI image layout
// tar, as `berth image push` uploads it) and the image digest.
func imageBundle(t *testing.T) (bundleBytes, string) {
	t.Helper()
	path, image := ctrtest.Archive(t, ctrtest.Image(t, ctrtest.Config{}))
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(raw)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return bundleBytes{digest: "sha256:" + hex.EncodeToString(sum[:]), data: buf.Bytes()}, image
}

// containerdPlugin launches the built containerd driver plugin as the agent
// does, on the test's own containerd namespace; Close leaves tasks running.
func containerdPlugin(t *testing.T, addr, ns, dataDir string) *plugin.Driver {
	t.Helper()
	bin := filepath.Join(os.Getenv(ctrtest.EnvBinDir), "berth-plugin-containerd")
	if os.Getenv(ctrtest.EnvBinDir) == "" {
		bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-containerd")
	}
	entry, err := plugin.ResolveDriver(filepath.Dir(bin), "containerd")
	if err != nil {
		t.Fatal(err)
	}
	d, err := plugin.LaunchDriver(t.Context(), entry.Apply(plugin.Config{
		Args:   []string{"--state-dir", filepath.Join(dataDir, "driver", "containerd"), "--address", addr, "--namespace", ns},
		PidDir: filepath.Join(dataDir, "plugins"),
	}))
	if err != nil {
		t.Fatalf("launch the containerd driver: %v", err)
	}
	return d
}

// containerHarness is a reconcile loop on the containerd driver plugin.
type containerHarness struct {
	*harness
	addr, ns string
	bundles  bundleBytes
	image    string
	drv      *plugin.Driver
}

func newContainerHarness(t *testing.T) *containerHarness {
	t.Helper()
	addr := ctrtest.Address(t)
	h := &containerHarness{harness: newHarness(t), addr: addr, ns: ctrtest.Namespace(t, addr)}
	h.bundles, h.image = imageBundle(t)
	h.drv = containerdPlugin(t, addr, h.ns, h.dir)
	t.Cleanup(func() { _ = h.drv.Close() })
	return h
}

func (h *containerHarness) loop() *Loop {
	h.t.Helper()
	l, err := New(Config{Store: h.store, Driver: h.drv, Bundles: h.bundles, DataDir: h.dir, Now: h.clk.Now})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(l.cfg.Prober.Close)
	return l
}

func (h *containerHarness) spec(id string, cmd ...string) node.WorkloadSpec {
	return node.WorkloadSpec{WorkloadID: id, ProjectID: "prj_1", Project: "shop", ServiceID: "svc_1", Service: "web",
		Driver: "containerd", BundleDigest: h.bundles.digest, Image: h.image, Command: cmd,
		DesiredStatus: node.DesiredRunning, MemoryBytes: 64 << 20}
}

func (h *containerHarness) inspect(id string) *runtime.WorkloadState {
	h.t.Helper()
	st, err := h.drv.Inspect(h.t.Context(), &runtime.InspectRequest{WorkloadID: id})
	if err != nil {
		h.t.Fatalf("Inspect %s: %v", id, err)
	}
	return st
}

// TestContainerCrashRestartsWithBackoff: a container that exits is recorded
// crashed with its exit code, stays down for the backoff, and is started
// again (a new task) once the backoff has passed.
func TestContainerCrashRestartsWithBackoff(t *testing.T) {
	t.Parallel()
	h := newContainerHarness(t)
	l := h.loop()
	h.desire(h.spec("wl_crashy", "sh", "-c", "echo up; sleep 1; exit 3"))
	if err := h.pass(l); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	first := h.inspect("wl_crashy")
	if first.State != runtime.StateRunning {
		t.Fatalf("after the first pass: %+v; want running", first)
	}
	deadline := time.Now().Add(20 * time.Second)
	for h.inspect("wl_crashy").State != runtime.StateExited {
		if time.Now().After(deadline) {
			t.Fatal("the workload did not exit within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := h.pass(l); err != nil {
		t.Fatalf("pass after the exit: %v", err)
	}
	rec, _ := h.record("wl_crashy")
	if Phase(rec.Phase) != PhaseCrashed || rec.LastExitCode == nil || *rec.LastExitCode != 3 || rec.RestartCount != 1 || !rec.NextStartAt.After(h.clk.Now()) {
		t.Fatalf("record after the crash = %+v; want crashed, exit 3, one restart pending", rec)
	}
	// Within the backoff nothing starts.
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if st := h.inspect("wl_crashy"); st.State != runtime.StateExited || st.PID != first.PID {
		t.Fatalf("during the backoff: %+v; want the exited task left alone", st)
	}
	h.clk.Set(rec.NextStartAt)
	if err := h.pass(l); err != nil {
		t.Fatalf("pass after the backoff: %v", err)
	}
	again := h.inspect("wl_crashy")
	if again.State != runtime.StateRunning || again.PID == first.PID {
		t.Fatalf("after the backoff: %+v; want a new running task", again)
	}
	if rec, _ := h.record("wl_crashy"); Phase(rec.Phase) != PhaseRunning {
		t.Errorf("record after the restart = %+v; want running", rec)
	}
}

// TestContainerSurvivesAgentRestart: the agent and its driver plugin stop
// and start again; the new driver recovers the task from the stored handle
// and the loop adopts it without restarting it.
func TestContainerSurvivesAgentRestart(t *testing.T) {
	t.Parallel()
	h := newContainerHarness(t)
	l := h.loop()
	h.desire(h.spec("wl_keep", "sleep", "300"))
	if err := h.pass(l); err != nil {
		t.Fatalf("pass: %v", err)
	}
	before := h.inspect("wl_keep")
	rec, _ := h.record("wl_keep")
	if before.State != runtime.StateRunning || rec.DriverHandle.Version == 0 {
		t.Fatalf("before the restart: %+v, record %+v", before, rec)
	}

	// The agent goes away: its driver plugin exits, the task keeps running.
	if err := h.drv.Close(); err != nil {
		t.Fatal(err)
	}
	l.cfg.Prober.Close()
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := localstore.Open(context.Background(), filepath.Join(h.dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h.store = st
	h.drv = containerdPlugin(t, h.addr, h.ns, h.dir)
	t.Cleanup(func() { _ = h.drv.Close() })

	// What the agent does at start: Recover every stored handle, then run passes.
	rec, _ = h.record("wl_keep")
	got, err := h.drv.Recover(t.Context(), &runtime.RecoverRequest{WorkloadID: "wl_keep",
		Handle: runtime.Handle{Version: rec.DriverHandle.Version, Data: rec.DriverHandle.Data}})
	if err != nil || got.State != runtime.StateRunning || got.PID != before.PID {
		t.Fatalf("Recover after the restart = %+v, %v; want pid %d running", got, err, before.PID)
	}
	l2 := h.loop()
	for range 3 {
		if err := h.pass(l2); err != nil {
			t.Fatalf("pass after the restart: %v", err)
		}
	}
	after := h.inspect("wl_keep")
	if after.PID != before.PID || !after.StartedAt.Equal(before.StartedAt) || after.State != runtime.StateRunning {
		t.Errorf("after the restart: %+v; want the same task as %+v", after, before)
	}
	if rec, _ := h.record("wl_keep"); Phase(rec.Phase) != PhaseRunning || rec.RestartCount != 0 {
		t.Errorf("record after the restart = %+v; want running, never restarted", rec)
	}
}

// nftNetwork adapts the nftables network as cmd/berth-agent does.
type nftNetwork struct{ n *nftables.Network }

func (a nftNetwork) Attach(ctx context.Context, id, group string, port int, _ pluginapi.Mutation) (string, error) {
	at, err := a.n.Attach(ctx, nftables.AttachRequest{WorkloadID: id, Group: group,
		Ports: []nftables.Port{{HostPort: uint16(port), ContainerPort: uint16(port)}}})
	return at.NetNSPath(), err
}

func (a nftNetwork) Detach(ctx context.Context, id string, _ pluginapi.Mutation) error {
	return a.n.Detach(ctx, id)
}

// TestContainerOnNodeNetwork: with the node network, a container gets its own
// namespace and answers on the node's address and its port (published), and
// removing it removes its namespace.
func TestContainerOnNodeNetwork(t *testing.T) {
	t.Parallel()
	h := newContainerHarness(t)
	var b [2]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	nw, err := nftables.New(nftables.Config{Subnet: netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", b[0])),
		Bridge: "bl" + tag, TablePrefix: "bl" + tag, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nw.Teardown(context.Background()); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	if err := nw.Guard(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := nw.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{Store: h.store, Driver: h.drv, Bundles: h.bundles, DataDir: h.dir, Now: h.clk.Now, Network: nftNetwork{nw},
		StopTimeout: time.Second}) // httpd, process 1 of its container, ignores SIGTERM
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cfg.Prober.Close)
	h.desire(h.spec("wl_net", "sh", "-c", `echo "from $BERTH_WORKLOAD_ID" >/tmp/index.html; exec httpd -f -p "$HOST:$PORT" -h /tmp`))
	if err := h.pass(l); err != nil {
		t.Fatalf("pass: %v", err)
	}
	rec, _ := h.record("wl_net")
	atts := nw.Attachments()
	if len(atts) != 1 || atts[0].Group != "prj_1" {
		t.Fatalf("attachments = %+v; want wl_net in group prj_1", atts)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", rec.Port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := strings.TrimSpace(string(body)); got != "from wl_net" {
				t.Fatalf("GET %s = %q", url, got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.desire()
	if err := h.pass(l); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if _, err := os.Stat(atts[0].NetNSPath()); !os.IsNotExist(err) {
		t.Errorf("the workload's namespace is left after its removal (%v)", err)
	}
	if got := nw.Attachments(); len(got) != 0 {
		t.Errorf("attachments after removal = %+v", got)
	}
}

// TestContainerPullsWithTheNodeCredential: a container image named by
// digest on the node's registry is pulled by the driver plugin with the
// node's credential over TLS pinned to the registry's certificate. While the
// registry refuses the digest (as berthd's refuses one outside the node's
// desired state) the workload fails as image-unavailable with the
// registry's reason; once it is allowed, the next attempt runs it. The
// credential reaches neither the local store nor the driver's records.
func TestContainerPullsWithTheNodeCredential(t *testing.T) {
	t.Parallel()
	h := newContainerHarness(t)
	const secret = "brn_node-credential-of-the-test"
	reg := ggcrregistry.New()
	var allowed atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p, ok := r.BasicAuth(); !ok || p != secret {
			w.Header().Set("WWW-Authenticate", `Basic realm="berth"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodPut && r.Method != http.MethodPost && r.Method != http.MethodPatch &&
			strings.Contains(r.URL.Path, "/manifests/") && !allowed.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"errors":[{"code":"DENIED","message":"a node pulls only the digests of its desired state"}]}`)
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
		remote.WithAuth(&authn.Basic{Username: "ci", Password: secret})); err != nil {
		t.Fatalf("push: %v", err)
	}
	dg, _ := img.Digest()
	l, err := New(Config{Store: h.store, Driver: h.drv, DataDir: h.dir, Now: h.clk.Now,
		Registry: &runtime.RegistryCredential{Host: host, Username: "node", Secret: secret, Fingerprint: client.Fingerprint(srv.Certificate().Raw)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cfg.Prober.Close)
	spec := h.spec("wl_pulled")
	spec.BundleDigest, spec.Image = "", host+"/shop/web@"+dg.String()
	h.desire(spec)
	_ = h.pass(l) // the start fails; the record says why
	rec, _ := h.record("wl_pulled")
	if rec.LastFailure == nil || rec.LastFailure.Kind != node.FailureImage || !strings.Contains(rec.LastFailure.Message, "403") {
		t.Fatalf("record after a refused pull = %+v (failure %+v); want an image failure naming the 403", rec, rec.LastFailure)
	}
	allowed.Store(true)
	h.clk.Set(rec.NextStartAt)
	if err := h.pass(l); err != nil {
		t.Fatalf("pass once the digest is allowed: %v", err)
	}
	if st := h.inspect("wl_pulled"); st.State != runtime.StateRunning {
		t.Fatalf("after the allowed pull: %+v; want running", st)
	}
	err = filepath.WalkDir(h.dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err == nil && bytes.Contains(raw, []byte(secret)) {
			t.Errorf("%s holds the node credential", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
