package reconcile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
)

// fakeDriver stands for a runtime driver plugin (nodeplugins/process behind
// host/plugin). Nil func fields are no-ops.
type fakeDriver struct {
	DescribeFunc func(ctx context.Context) (*runtime.DescribeResponse, error)
	StartFunc    func(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error)
	StopFunc     func(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error)
	InspectFunc  func(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error)
	ListFunc     func(ctx context.Context) ([]*runtime.WorkloadState, error)
	RecoverFunc  func(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error)
}

var _ runtime.Driver = (*fakeDriver)(nil)

func (f *fakeDriver) Describe(ctx context.Context) (*runtime.DescribeResponse, error) {
	if f.DescribeFunc == nil {
		return &runtime.DescribeResponse{Name: "process"}, nil
	}
	return f.DescribeFunc(ctx)
}

func (f *fakeDriver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	if f.StartFunc == nil {
		return &runtime.StartResponse{}, nil
	}
	return f.StartFunc(ctx, req)
}

func (f *fakeDriver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	if f.StopFunc == nil {
		return &runtime.StopResponse{}, nil
	}
	return f.StopFunc(ctx, req)
}

func (f *fakeDriver) Inspect(ctx context.Context, req *runtime.InspectRequest) (*runtime.WorkloadState, error) {
	if f.InspectFunc == nil {
		return nil, runtime.ErrNotFound
	}
	return f.InspectFunc(ctx, req)
}

func (f *fakeDriver) List(ctx context.Context) ([]*runtime.WorkloadState, error) {
	if f.ListFunc == nil {
		return nil, nil
	}
	return f.ListFunc(ctx)
}

func (f *fakeDriver) Recover(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error) {
	if f.RecoverFunc == nil {
		return nil, runtime.ErrNotFound
	}
	return f.RecoverFunc(ctx, req)
}

// memDriver keeps workload states in memory behind a fakeDriver and records calls.
type memDriver struct {
	mu     sync.Mutex
	states map[string]*runtime.WorkloadState
	starts []*runtime.StartRequest
	stops  []string
	now    func() time.Time
}

func newMemDriver(now func() time.Time) (*memDriver, *fakeDriver) {
	m := &memDriver{states: map[string]*runtime.WorkloadState{}, now: now}
	return m, &fakeDriver{
		StartFunc: func(_ context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.starts = append(m.starts, req)
			st := &runtime.WorkloadState{WorkloadID: req.WorkloadID, State: runtime.StateRunning, PID: 100 + len(m.starts), StartedAt: m.now()}
			m.states[req.WorkloadID] = st
			c := *st
			return &runtime.StartResponse{State: &c}, nil
		},
		StopFunc: func(_ context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.stops = append(m.stops, req.WorkloadID)
			if _, ok := m.states[req.WorkloadID]; !ok {
				return nil, runtime.ErrNotFound
			}
			delete(m.states, req.WorkloadID)
			return &runtime.StopResponse{}, nil
		},
		ListFunc: func(context.Context) ([]*runtime.WorkloadState, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			var out []*runtime.WorkloadState
			for _, s := range m.states {
				c := *s
				out = append(out, &c)
			}
			return out, nil
		},
	}
}

func (m *memDriver) exit(id string, code int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.states[id]; ok {
		s.State, s.ExitCode, s.ExitedAt = runtime.StateExited, code, m.now()
	}
}

func (m *memDriver) counts() (starts, stops int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.starts), len(m.stops)
}

func (m *memDriver) lastStart() *runtime.StartRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.starts[len(m.starts)-1]
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

type harness struct {
	t     *testing.T
	dir   string
	store *localstore.Store
	clk   *clock
	mem   *memDriver
	drv   *fakeDriver
	rev   int64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := localstore.Open(context.Background(), filepath.Join(dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	clk := &clock{t: t0}
	mem, drv := newMemDriver(clk.Now)
	return &harness{t: t, dir: dir, store: st, clk: clk, mem: mem, drv: drv}
}

func (h *harness) loop(bundles BundleSource) *Loop {
	h.t.Helper()
	l, err := New(Config{Store: h.store, Driver: h.drv, Bundles: bundles, DataDir: h.dir, Now: h.clk.Now})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(l.cfg.Prober.Close)
	return l
}

func (h *harness) desire(specs ...node.WorkloadSpec) {
	h.t.Helper()
	h.rev++
	raw, err := json.Marshal(node.DesiredState{Rev: h.rev, Spec: node.Spec{Workloads: specs}})
	if err != nil {
		h.t.Fatal(err)
	}
	if ok, err := h.store.StoreSnapshot(context.Background(), h.rev, raw, h.clk.Now()); err != nil || !ok {
		h.t.Fatalf("store snapshot: %v %v", ok, err)
	}
}

// desireSpec stores a snapshot of the whole node spec sp as the next revision.
func (h *harness) desireSpec(sp node.Spec) {
	h.t.Helper()
	h.rev++
	raw, err := json.Marshal(node.DesiredState{Rev: h.rev, Spec: sp})
	if err != nil {
		h.t.Fatal(err)
	}
	if ok, err := h.store.StoreSnapshot(context.Background(), h.rev, raw, h.clk.Now()); err != nil || !ok {
		h.t.Fatalf("store snapshot: %v %v", ok, err)
	}
}

func (h *harness) pass(l *Loop) error {
	h.t.Helper()
	_, err := l.Pass(context.Background())
	return err
}

func (h *harness) record(id string) (localstore.Workload, bool) {
	h.t.Helper()
	recs, err := h.store.Workloads(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, r := range recs {
		if r.WorkloadID == id {
			return r, true
		}
	}
	return localstore.Workload{}, false
}

func (h *harness) status(l *Loop, id string) node.WorkloadStatus {
	h.t.Helper()
	rep, err := l.Status(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, w := range rep.Workloads {
		if w.WorkloadID == id {
			return w
		}
	}
	h.t.Fatalf("no status for %s in %+v", id, rep)
	return node.WorkloadStatus{}
}

func TestStartThenRemoveUndesired(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l := h.loop(nil)
	s := spec("wl_a", func(s *node.WorkloadSpec) {
		s.Env = map[string]string{"GREETING": "hi"}
		s.Service, s.Project = "web", "shop"
	})
	h.desire(s)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	req := h.mem.lastStart()
	rec, ok := h.record("wl_a")
	if !ok || Phase(rec.Phase) != PhaseRunning || rec.Port == 0 {
		t.Fatalf("record = %+v %v", rec, ok)
	}
	wantEnv := map[string]string{"GREETING": "hi", "PORT": itoa(rec.Port), "HOST": "127.0.0.1",
		"BERTH_WORKLOAD_ID": "wl_a", "BERTH_SERVICE": "web", "BERTH_PROJECT": "shop",
		"PATH": DefaultPath, "HOME": filepath.Join(h.dir, "workloads", "wl_a", "app"), "TMPDIR": filepath.Join(h.dir, "workloads", "wl_a", "tmp"),
		"BERTH_APP_DIR": filepath.Join(h.dir, "apps", "shop", "web")}
	if !mapsEqual(req.Env, wantEnv) {
		t.Errorf("env = %v, want %v", req.Env, wantEnv)
	}
	if req.WorkDir != filepath.Join(h.dir, "workloads", "wl_a", "app") || req.LogPath != filepath.Join(h.dir, "workloads", "wl_a", "output.log") || req.LogMaxBytes != 1<<20 {
		t.Errorf("start request = %+v", req)
	}
	if fi, err := os.Stat(req.WorkDir); err != nil || !fi.IsDir() {
		t.Errorf("work dir: %v", err)
	}
	if applied, _ := h.store.AppliedRev(context.Background()); applied != h.rev {
		t.Errorf("applied_rev = %d, want %d", applied, h.rev)
	}
	if st := h.status(l, "wl_a"); st.ObservedStatus != node.StatusRunning || st.Address != "127.0.0.1:"+itoa(rec.Port) {
		t.Errorf("status = %+v", st)
	}
	// A second pass changes nothing.
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if starts, stops := h.mem.counts(); starts != 1 || stops != 0 {
		t.Fatalf("starts, stops = %d, %d after an idle pass", starts, stops)
	}

	h.desire()
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if _, stops := h.mem.counts(); stops != 1 {
		t.Fatalf("stops = %d, want 1", stops)
	}
	if _, ok := h.record("wl_a"); ok {
		t.Error("record of removed workload kept")
	}
	if _, err := os.Stat(filepath.Join(h.dir, "workloads", "wl_a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workload dir kept: %v", err)
	}
	if st := h.status(l, "wl_a"); st.ObservedStatus != node.StatusDeleted {
		t.Errorf("status after removal = %+v, want deleted", st)
	}
}

func TestCrashRestartsWithBackoff(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l := h.loop(nil)
	h.desire(spec("wl_a"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	port := func() int { r, _ := h.record("wl_a"); return r.Port }()
	h.mem.exit("wl_a", 2)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	rec, _ := h.record("wl_a")
	if Phase(rec.Phase) != PhaseCrashed || rec.RestartCount != 1 || rec.LastExitCode == nil || *rec.LastExitCode != 2 {
		t.Fatalf("after crash record = %+v", rec)
	}
	if st := h.status(l, "wl_a"); st.ObservedStatus != node.StatusCrashed || st.RestartCount != 1 {
		t.Errorf("status = %+v", st)
	}
	h.clk.Set(t0.Add(999 * time.Millisecond))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if starts, _ := h.mem.counts(); starts != 1 {
		t.Fatalf("restarted inside the backoff: %d starts", starts)
	}
	h.clk.Set(t0.Add(time.Second))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if starts, _ := h.mem.counts(); starts != 2 {
		t.Fatalf("starts = %d after the backoff, want 2", starts)
	}
	rec, _ = h.record("wl_a")
	if Phase(rec.Phase) != PhaseRunning || rec.Port != port || rec.RestartCount != 1 {
		t.Fatalf("after restart record = %+v (port was %d)", rec, port)
	}
	// Second crash: 2 s.
	h.mem.exit("wl_a", 1)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	rec, _ = h.record("wl_a")
	if rec.RestartCount != 2 || !rec.NextStartAt.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("second crash record = %+v", rec)
	}
	// Ten minutes of running resets the backoff.
	h.clk.Set(t0.Add(3 * time.Second))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	h.clk.Set(t0.Add(3*time.Second + BackoffReset))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	rec, _ = h.record("wl_a")
	if rec.BackoffStep != 0 || rec.RestartCount != 2 {
		t.Fatalf("after 10 min running record = %+v", rec)
	}
}

func TestAdoptionAfterAgentRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l := h.loop(nil)
	h.desire(spec("wl_a"), spec("wl_b"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	// A new loop over the same store and driver is an agent restart.
	l2 := h.loop(nil)
	if err := h.pass(l2); err != nil {
		t.Fatal(err)
	}
	if starts, stops := h.mem.counts(); starts != 2 || stops != 0 {
		t.Fatalf("after restart starts, stops = %d, %d; want 2, 0", starts, stops)
	}
	if st := h.status(l2, "wl_b"); st.ObservedStatus != node.StatusRunning {
		t.Fatalf("adopted status = %+v", st)
	}
}

func TestNoSnapshotLeavesAdoptedWorkloadsAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.mem.states["wl_x"] = running("wl_x")
	l := h.loop(nil)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if starts, stops := h.mem.counts(); starts != 0 || stops != 0 {
		t.Fatalf("starts, stops = %d, %d without a snapshot", starts, stops)
	}
}

func TestRestartGenerationRestarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	l := h.loop(nil)
	h.desire(spec("wl_a"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	h.desire(spec("wl_a", func(s *node.WorkloadSpec) { s.RestartGeneration = 2 }))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if starts, stops := h.mem.counts(); starts != 2 || stops != 1 {
		t.Fatalf("starts, stops = %d, %d; want 2, 1", starts, stops)
	}
	if rec, _ := h.record("wl_a"); rec.RestartCount != 0 || rec.RestartGeneration != 2 {
		t.Fatalf("record = %+v", rec)
	}
}

// bundleServer stands for GET /api/v1/bundles/{digest} of berthd.
type bundleServer struct {
	mu    sync.Mutex
	blobs map[string][]byte
	calls int
}

func (b *bundleServer) DownloadBundle(_ context.Context, digest string, w io.Writer) error {
	b.mu.Lock()
	b.calls++
	data, ok := b.blobs[digest]
	b.mu.Unlock()
	if !ok {
		return errors.New("bundle_not_found")
	}
	_, err := w.Write(data)
	return err
}

func tarGz(t *testing.T, files map[string]string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), "sha256:" + hex.EncodeToString(sum[:])
}

func TestBundleDownloadedVerifiedAndCached(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	data, digest := tarGz(t, map[string]string{"app.sh": "#!/bin/sh\n"})
	src := &bundleServer{blobs: map[string][]byte{digest: data}}
	l := h.loop(src)
	withBundle := func(id string) node.WorkloadSpec {
		return spec(id, func(s *node.WorkloadSpec) { s.BundleDigest = digest })
	}
	h.desire(withBundle("wl_a"), withBundle("wl_b"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if src.calls != 1 {
		t.Errorf("downloads = %d, want 1 (cached by digest)", src.calls)
	}
	for _, id := range []string{"wl_a", "wl_b"} {
		if b, err := os.ReadFile(filepath.Join(h.dir, "workloads", id, "app", "app.sh")); err != nil || string(b) != "#!/bin/sh\n" {
			t.Errorf("%s app.sh = %q %v", id, b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(h.dir, "bundles", strings.TrimPrefix(digest, "sha256:")+".tar.gz")); err != nil {
		t.Errorf("cached archive: %v", err)
	}
}

func TestBundleDigestMismatchIsReportedNeverExtracted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	_, digest := tarGz(t, map[string]string{"app.sh": "good"})
	evil, _ := tarGz(t, map[string]string{"app.sh": "evil"})
	l := h.loop(&bundleServer{blobs: map[string][]byte{digest: evil}})
	h.desire(spec("wl_a", func(s *node.WorkloadSpec) { s.BundleDigest = digest }))
	err := h.pass(l)
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("pass error = %v, want ErrDigestMismatch", err)
	}
	if starts, _ := h.mem.counts(); starts != 0 {
		t.Fatal("started a workload with a mismatched bundle")
	}
	st := h.status(l, "wl_a")
	if st.ObservedStatus != node.StatusCrashed || !strings.Contains(st.Message, "does not match its digest") {
		t.Errorf("status = %+v", st)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "workloads", "wl_a", "app", "app.sh")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mismatched bundle was extracted: %v", err)
	}
	if applied, _ := h.store.AppliedRev(context.Background()); applied != 0 {
		t.Errorf("applied_rev = %d after a failed start, want 0", applied)
	}
}

func TestRunWakesOnNewSnapshot(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	changed := make(chan struct{}, 16)
	l, err := New(Config{Store: h.store, Driver: h.drv, DataDir: h.dir, Now: h.clk.Now, PollInterval: time.Hour,
		OnStatusChange: func() { changed <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	<-changed // first pass: empty report
	h.desire(spec("wl_a"))
	l.Wake()
	for {
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("no start after Wake")
		}
		if starts, _ := h.mem.counts(); starts == 1 {
			break
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func itoa(i int) string { return strconv.Itoa(i) }
