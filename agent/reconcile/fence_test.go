package reconcile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/lease"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/nodeplugins/fake"
)

// recordingDriver passes every call to a real driver (nodeplugins/fake)
// and keeps the Start and Stop requests it saw. afterStart, when set, runs
// after the driver's Start returned and may replace its error.
type recordingDriver struct {
	runtime.Driver
	mu         sync.Mutex
	starts     []runtime.StartRequest
	stops      []runtime.StopRequest
	afterStart func(req *runtime.StartRequest, resp *runtime.StartResponse, err error) error
}

func (d *recordingDriver) Start(ctx context.Context, req *runtime.StartRequest) (*runtime.StartResponse, error) {
	d.mu.Lock()
	d.starts = append(d.starts, *req)
	hook := d.afterStart
	d.mu.Unlock()
	resp, err := d.Driver.Start(ctx, req)
	if hook != nil {
		err = hook(req, resp, err)
	}
	return resp, err
}

func (d *recordingDriver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	d.mu.Lock()
	d.stops = append(d.stops, *req)
	d.mu.Unlock()
	return d.Driver.Stop(ctx, req)
}

func (d *recordingDriver) calls() (starts []runtime.StartRequest, stops []runtime.StopRequest) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]runtime.StartRequest(nil), d.starts...), append([]runtime.StopRequest(nil), d.stops...)
}

// heldLeases is a lease gate holding every lease in held with its token.
type heldLeases map[string]int64

func (h heldLeases) Statuses() (map[string]lease.Status, bool) {
	out := map[string]lease.Status{}
	for id, tok := range h {
		out[id] = lease.Status{State: node.LeaseHeld, Token: tok, Startable: true}
	}
	return out, false
}

func (h heldLeases) Admit(leaseID string, token int64) (func(), bool, string) {
	if tok, ok := h[leaseID]; ok && tok == token {
		return func() {}, true, ""
	}
	return nil, false, "not held"
}

// fenceHarness is an agent's store and loop over the real fake driver.
type fenceHarness struct {
	*harness
	driverDir string
	fake      *fake.Driver
	rec       *recordingDriver
	leases    heldLeases
}

func newFenceHarness(t *testing.T) *fenceHarness {
	t.Helper()
	h := &fenceHarness{harness: newHarness(t), leases: heldLeases{}}
	h.driverDir = filepath.Join(h.dir, "driver")
	h.openDriver()
	return h
}

// openDriver starts (again) the fake driver on its state directory.
func (h *fenceHarness) openDriver() {
	h.t.Helper()
	d, err := fake.New(fake.Config{StateDir: h.driverDir})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = d.Close() })
	h.fake = d
	h.rec = &recordingDriver{Driver: d}
}

func (h *fenceHarness) newLoop() *Loop {
	h.t.Helper()
	l, err := New(Config{Store: h.store, Driver: h.rec, DataDir: h.dir, Now: h.clk.Now, Leases: h.leases})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(l.cfg.Prober.Close)
	return l
}

// driverLines returns the fake driver's log lines of event for workload id.
func (h *fenceHarness) driverLines(event, id string) []string {
	h.t.Helper()
	raw, err := os.ReadFile(filepath.Join(h.driverDir, fake.LogFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		h.t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[1] == event && f[2] == id {
			out = append(out, line)
		}
	}
	return out
}

// TestDriverCallsCarryFenceAndDerivedKeys: a stateful workload's start
// carries its lease's fencing token with the lease as fence resource, a
// portable one the desired-state revision; keys are derived from workload,
// attempt and verb, and a stop carries the token its start was sent with
// (docs/plugins.md section 3.4).
func TestDriverCallsCarryFenceAndDerivedKeys(t *testing.T) {
	t.Parallel()
	h := newFenceHarness(t)
	h.leases["lse_a"] = 7
	l := h.newLoop()
	h.desire(spec("wl_p"), spec("wl_s", stateful(7)))
	h.desire(spec("wl_p"), spec("wl_s", stateful(7))) // rev 2: the fence of this pass
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	starts, _ := h.rec.calls()
	got := map[string]runtime.StartRequest{}
	for _, s := range starts {
		got[s.WorkloadID] = s
	}
	want := map[string]struct {
		key, fence string
		token      uint64
	}{
		"wl_p": {"start/wl_p/2.1", "", 2},
		"wl_s": {"start/wl_s/2.1", "lease/lse_a", 7},
	}
	for id, w := range want {
		s, ok := got[id]
		if !ok {
			t.Fatalf("no start of %s; starts %+v", id, starts)
		}
		if s.IdempotencyKey != w.key || s.FenceResource != w.fence || s.FencingToken != w.token {
			t.Errorf("start of %s: key %q fence %q token %d; want %q %q %d", id, s.IdempotencyKey, s.FenceResource, s.FencingToken, w.key, w.fence, w.token)
		}
	}

	// Desired stopped, then running again: the stop is of attempt 1 with
	// its token; the new start is attempt 2, really started (not replayed).
	stoppedP := spec("wl_p", func(s *node.WorkloadSpec) { s.DesiredStatus = node.DesiredStopped })
	h.desire(stoppedP, spec("wl_s", stateful(7)))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	_, stops := h.rec.calls()
	if len(stops) != 1 || stops[0].WorkloadID != "wl_p" || stops[0].IdempotencyKey != "stop/wl_p/2.1" || stops[0].FencingToken != 2 {
		t.Fatalf("stops = %+v; want one of wl_p with key stop/wl_p/2.1, token 2", stops)
	}
	h.desire(spec("wl_p"), spec("wl_s", stateful(7)))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	starts, _ = h.rec.calls()
	last := starts[len(starts)-1]
	if last.WorkloadID != "wl_p" || last.IdempotencyKey != "start/wl_p/4.2" || last.FencingToken != 4 {
		t.Fatalf("start after stop: %s key %q token %d; want wl_p start/wl_p/4.2 4", last.WorkloadID, last.IdempotencyKey, last.FencingToken)
	}
	if n := len(h.driverLines("start", "wl_p")); n != 2 {
		t.Fatalf("driver started wl_p %d times; want 2 (the start after a stop is a new one)", n)
	}
	if r, _ := h.record("wl_p"); Phase(r.Phase) != PhaseRunning {
		t.Fatalf("wl_p record after the second start = %+v", r)
	}

	// The stateful workload's removal: a stop of its attempt 1, fenced on the
	// workload with that attempt's revision (2), not on the lease.
	h.desire(spec("wl_p"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	_, stops = h.rec.calls()
	last2 := stops[len(stops)-1]
	if last2.WorkloadID != "wl_s" || last2.IdempotencyKey != "stop/wl_s/2.1" || last2.FencingToken != 2 || last2.FenceResource != "" {
		t.Fatalf("stop of wl_s = %+v; want key stop/wl_s/2.1, token 2 on the workload", last2)
	}
	if _, ok := h.record("wl_s"); ok {
		t.Fatalf("wl_s record left after its removal")
	}
}

// TestStaleLeaseTokenRefusedByDriver: a start under a lease token lower
// than one the driver already admitted for that lease is refused by the
// driver, also after the driver restarted, and recorded as a failed start.
func TestStaleLeaseTokenRefusedByDriver(t *testing.T) {
	t.Parallel()
	h := newFenceHarness(t)
	h.leases["lse_a"] = 7
	h.desire(spec("wl_new", stateful(7)))
	if err := h.pass(h.newLoop()); err != nil {
		t.Fatal(err)
	}
	if r, _ := h.record("wl_new"); Phase(r.Phase) != PhaseRunning {
		t.Fatalf("wl_new = %+v; want running", r)
	}
	_ = h.fake.Close()
	h.openDriver()
	// An older holder's workload (token 6) that the agent's own gate let
	// through, e.g. from a snapshot replayed out of order.
	h.leases["lse_a"] = 6
	h.desire(spec("wl_new", stateful(7)), spec("wl_old", stateful(6)))
	err := h.pass(h.newLoop())
	if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Fatalf("pass = %v; want the driver's stale_fencing_token", err)
	}
	if n := len(h.driverLines("start", "wl_old")); n != 0 {
		t.Fatalf("driver started the stale workload %d times", n)
	}
	if r, _ := h.record("wl_old"); Phase(r.Phase) != PhaseFailed {
		t.Fatalf("wl_old = %+v; want failed", r)
	}
}

// TestStartInterruptedAfterDriverReplays: the agent dies after the driver
// started a workload and before it recorded the result. The restarted agent
// retries the same attempt with the same key and request; the driver
// (restarted too) replays its first answer, so there is one start, and the
// record gets the first start's handle.
func TestStartInterruptedAfterDriverReplays(t *testing.T) {
	t.Parallel()
	h := newFenceHarness(t)
	var first *runtime.StartResponse
	h.rec.afterStart = func(_ *runtime.StartRequest, resp *runtime.StartResponse, err error) error {
		if err != nil {
			return err
		}
		first = resp
		// The agent dies here: nothing it would write from now on lands.
		if cerr := h.store.Close(); cerr != nil {
			t.Errorf("close store: %v", cerr)
		}
		return context.Canceled
	}
	h.desire(spec("wl_a"))
	if err := h.pass(h.newLoop()); err == nil {
		t.Fatal("pass with the agent dying mid-start succeeded")
	}
	if first == nil || first.State == nil || first.State.Handle.IsZero() {
		t.Fatalf("first start answer = %+v", first)
	}

	// Restart: the store from disk, a new driver process on its state, a new loop.
	st, err := localstore.Open(context.Background(), filepath.Join(h.dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h.store = st
	if r, _ := h.record("wl_a"); Phase(r.Phase) != PhaseStarting || r.StartAttempt != 1 || len(r.DriverHandle.Data) != 0 {
		t.Fatalf("record after the crash = %+v; want starting, attempt 1, no handle", r)
	}
	_ = h.fake.Close()
	h.openDriver()
	if err := h.pass(h.newLoop()); err != nil {
		t.Fatal(err)
	}

	starts, _ := h.rec.calls()
	if len(starts) != 1 || starts[0].IdempotencyKey != "start/wl_a/1.1" {
		t.Fatalf("starts after the restart = %+v; want one retry with key start/wl_a/1.1", starts)
	}
	if n := len(h.driverLines("start", "wl_a")); n != 1 {
		t.Fatalf("driver started wl_a %d times; want 1 (the retry replays)", n)
	}
	r, _ := h.record("wl_a")
	if Phase(r.Phase) != PhaseRunning || r.StartAttempt != 1 {
		t.Fatalf("record after the retry = %+v; want running, attempt 1", r)
	}
	if string(r.DriverHandle.Data) != string(first.State.Handle.Data) || r.DriverHandle.Version != first.State.Handle.Version {
		t.Fatalf("recorded handle %+v; want the first start's %+v", r.DriverHandle, first.State.Handle)
	}
}

// TestRecreatedWorkloadStartsAgain: a workload removed from the node (its
// record deleted) and desired again later under the same id is really
// started again, not replayed from the driver's record of its first start:
// the key carries the revision the attempt began at.
func TestRecreatedWorkloadStartsAgain(t *testing.T) {
	t.Parallel()
	h := newFenceHarness(t)
	l := h.newLoop()
	h.desire(spec("wl_r"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	h.desire()
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.record("wl_r"); ok {
		t.Fatal("record of the removed workload is still there")
	}
	h.desire(spec("wl_r"))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if n := len(h.driverLines("start", "wl_r")); n != 2 {
		t.Fatalf("driver started wl_r %d times; want 2", n)
	}
	if _, err := h.fake.Inspect(context.Background(), &runtime.InspectRequest{WorkloadID: "wl_r"}); err != nil {
		t.Fatalf("wl_r after it was desired again: %v", err)
	}
}
