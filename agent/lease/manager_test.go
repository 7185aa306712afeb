package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/nodeplugins/fake"
)

// fakeBin is the built berth-plugin-fake: from BERTH_BIN_DIR, or built once
// for this test binary by TestMain.
var fakeBin string

func TestMain(m *testing.M) {
	code := func() int {
		if dir := os.Getenv("BERTH_BIN_DIR"); dir != "" {
			fakeBin = filepath.Join(dir, "berth-plugin-fake")
			return m.Run()
		}
		tmp, err := os.MkdirTemp("", "berth-lease-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		fakeBin = filepath.Join(tmp, "berth-plugin-fake")
		cmd := exec.Command("go", "build", "-o", fakeBin, "github.com/berthhq/berth/cmd/berth-plugin-fake")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build berth-plugin-fake:", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// manualClock is a Clock the test moves.
type manualClock struct{ now atomic.Int64 }

func (c *manualClock) Now() Mono           { return Mono(c.now.Load()) }
func (c *manualClock) set(t time.Duration) { c.now.Store(int64(t)) }

// node is one agent's lease side over a real fake-driver plugin process:
// its local store, driver and manager. restart keeps the store and the
// driver's state directory.
type testNode struct {
	t      *testing.T
	dir    string
	store  *localstore.Store
	drv    *plugin.Driver
	mg     *Manager
	events chan node.Event
	cancel context.CancelFunc
	done   chan error
}

type nodeOpts struct {
	clock Clock
	boot  string
	wrap  func(runtime.Driver) runtime.Driver
	// grace is the local fence's graceful-stop budget. Zero keeps the
	// manager's defaults (DefaultLocalGrace, DefaultLocalForce): a budget
	// covers the Stop call's round trip to the driver process too, and on
	// a loaded machine a 200 ms budget ran out before the call reached the
	// driver, so a fence the test expected to be graceful was forced or
	// failed. Only a test whose driver waits the graceful stop out on
	// purpose sets it.
	grace time.Duration
}

func startNode(t *testing.T, dir string, o nodeOpts) *testNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	entry, err := plugin.PinEntry(filepath.Dir(fakeBin), "fake", pluginapi.KindRuntime)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	drv, err := plugin.LaunchDriver(ctx, entry.Apply(plugin.Config{Args: []string{"--state-dir", filepath.Join(dir, "driver")},
		PidDir: filepath.Join(dir, "plugins"), Logger: log}))
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{t: t, dir: dir, store: st, drv: drv, events: make(chan node.Event, 16), done: make(chan error, 1)}
	var d runtime.Driver = drv
	if o.wrap != nil {
		d = o.wrap(drv)
	}
	if o.boot == "" {
		o.boot = "boot-1"
	}
	n.mg, err = New(ctx, Config{Store: st, Driver: d, NodeID: "nod_test", Clock: o.clock, BootID: o.boot,
		LocalGrace: o.grace, Logger: log,
		Emit: func(_ context.Context, ev node.Event) error { n.events <- ev; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	n.cancel = rcancel
	go func() { n.done <- n.mg.Run(rctx) }()
	t.Cleanup(n.stop)
	return n
}

// stop ends the manager, the driver process and the store. Idempotent.
func (n *testNode) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
	n.cancel = nil
	_ = n.drv.Close()
	_ = n.store.Close()
}

// bind starts workload id through the driver and records it under leaseID,
// as the reconcile loop does for a stateful workload.
func (n *testNode) bind(ctx context.Context, id, leaseID string) {
	n.t.Helper()
	// As the reconcile loop does: attempt 1, fenced by the lease's token.
	var token int64
	fence := ""
	if l, ok := n.mg.Lease(leaseID); ok {
		token, fence = l.Token, runtime.FenceLease(leaseID)
	}
	r, err := n.drv.Start(ctx, &runtime.StartRequest{WorkloadID: id, Command: []string{"app"}, WorkDir: n.dir,
		LogPath: filepath.Join(n.dir, id+".log"), FenceResource: fence,
		Mutation: pluginapi.Mutation{IdempotencyKey: pluginapi.CallKey("start", id, 1, 1), FencingToken: uint64(token)}})
	if err != nil {
		n.t.Fatal(err)
	}
	if err := n.store.PutWorkload(ctx, localstore.Workload{WorkloadID: id, Driver: "fake", Phase: "running",
		LeaseID: leaseID, DriverHandle: localstore.DriverHandle{Version: r.State.Handle.Version, Data: r.State.Handle.Data},
		StartAttempt: 1, FenceToken: token, StartRev: 1}); err != nil {
		n.t.Fatal(err)
	}
}

func (n *testNode) running(ctx context.Context, id string) bool {
	n.t.Helper()
	_, err := n.drv.Inspect(ctx, &runtime.InspectRequest{WorkloadID: id})
	if errors.Is(err, runtime.ErrNotFound) {
		return false
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return true
}

func (n *testNode) event(ctx context.Context) node.Event {
	n.t.Helper()
	select {
	case ev := <-n.events:
		return ev
	case <-ctx.Done():
		n.t.Fatal("no event")
		return node.Event{}
	}
}

// await polls cond until it holds or ctx ends.
func await(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// admits reports whether a stateful start under leaseID and token would be
// admitted, releasing the admission at once.
func admits(mg *Manager, leaseID string, token int64) (bool, string) {
	release, ok, why := mg.Admit(leaseID, token)
	if ok {
		release()
	}
	return ok, why
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func driverLog(t *testing.T, dir string) string {
	raw, err := os.ReadFile(filepath.Join(dir, "driver", fake.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestRevokeFencesLocalLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	n := startNode(t, t.TempDir(), nodeOpts{})
	if refused := n.mg.Grant(ctx, "", &node.LeaseGrant{LeaseID: "lse_a", ResourceType: "service", ResourceID: "svc_a",
		Mode: node.LeaseLocal, FencingToken: 3}); refused != nil {
		t.Fatalf("grant refused: %+v", refused)
	}
	if ok, why := admits(n.mg, "lse_a", 3); !ok {
		t.Fatalf("Admit of a held local lease: %s", why)
	}
	n.bind(ctx, "wl_s", "lse_a")
	n.bind(ctx, "wl_other", "")
	res, refused := n.mg.Revoke(ctx, &node.LeaseRevoke{LeaseID: "lse_a", FencingToken: 2, Reason: node.RevokeMoved})
	if refused == nil || refused.Code != "bad_message" || !n.running(ctx, "wl_s") {
		t.Fatalf("revoke with a lower token = %+v, %+v; want bad_message and nothing stopped", res, refused)
	}
	res, refused = n.mg.Revoke(ctx, &node.LeaseRevoke{LeaseID: "lse_a", FencingToken: 3, Reason: node.RevokeMoved})
	if refused != nil || res.Status != "ok" {
		t.Fatalf("revoke = %+v, %+v; want ok", res, refused)
	}
	if n.running(ctx, "wl_s") {
		t.Errorf("bound workload still runs after the revoke was answered")
	}
	if !n.running(ctx, "wl_other") {
		t.Errorf("a workload bound to no lease was stopped")
	}
	ev := n.event(ctx)
	if ev.Type != node.EventNodeFenced || ev.Subject.ID != "lse_a" || ev.Data["reason"] != ReasonRevoked ||
		fmt.Sprint(ev.Data["workload_ids"]) != "[wl_s]" || ev.Data["fencing_token"] != float64(3) {
		t.Errorf("event = %+v; want node.fenced of lse_a, token 3, reason revoked, [wl_s]", ev)
	}
	fences, err := n.store.Fences(ctx, false)
	if err != nil || len(fences) != 1 || fences[0].Outcome != localstore.FenceOutcomeFenced || fences[0].Token != 3 ||
		fences[0].Reason != ReasonRevoked || strings.Join(fences[0].WorkloadIDs, ",") != "wl_s" {
		t.Errorf("fence records = %+v, %v", fences, err)
	}
	recs, _ := n.store.Workloads(ctx)
	for _, r := range recs {
		if r.WorkloadID == "wl_s" && r.Phase != "stopped" {
			t.Errorf("fenced workload recorded %q, want stopped", r.Phase)
		}
	}
	if ok, _ := admits(n.mg, "lse_a", 3); ok {
		t.Errorf("Admit after the revoke")
	}
	if !strings.Contains(driverLog(t, n.dir), " stop wl_s mode=graceful key=fence-stop/wl_s/1.1 fence=workload/wl_s@1") {
		t.Errorf("driver log has no graceful stop of wl_s with the fence's derived key and the attempt's revision:\n%s", driverLog(t, n.dir))
	}
	if l, _ := n.mg.Lease("lse_a"); l.State != node.LeaseRevoked || l.Fence != FenceDone {
		t.Errorf("lease = %+v; want revoked and fenced", l)
	}
	if h := n.mg.Hello(); len(h) != 1 || h[0].State != node.LeaseRevoked || h[0].FencingToken != 3 {
		t.Errorf("hello leases = %+v", h)
	}
}

// TestFailedFence drives the failed-fence path through the fake driver told
// to fail forced stops: fence_failed answer, node.fence_failed, a failed
// mark that survives a restart and stops every stateful start, and its
// clearing by fence_ack.
func TestFailedFence(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := t.TempDir()
	// The driver waits the graceful stop out, so its budget is the test's cost.
	n := startNode(t, dir, nodeOpts{grace: 2 * time.Second})
	for _, g := range []node.LeaseGrant{
		{LeaseID: "lse_a", ResourceType: "service", ResourceID: "svc_a", Mode: node.LeaseLocal, FencingToken: 1},
		{LeaseID: "lse_b", ResourceType: "service", ResourceID: "svc_b", Mode: node.LeaseLocal, FencingToken: 1},
	} {
		if refused := n.mg.Grant(ctx, "", &g); refused != nil {
			t.Fatal(refused)
		}
	}
	n.bind(ctx, "wl_a", "lse_a")
	if err := os.WriteFile(filepath.Join(dir, "driver", fake.FailForcedStopFile), []byte("wl_a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, refused := n.mg.Revoke(ctx, &node.LeaseRevoke{LeaseID: "lse_a", FencingToken: 2, Reason: node.RevokeLost})
	if refused != nil || res.Status != "error" || res.Error == nil || res.Error.Code != "fence_failed" || !strings.Contains(res.Detail, "wl_a") {
		t.Fatalf("revoke = %+v, %+v; want error fence_failed naming wl_a", res, refused)
	}
	ev := n.event(ctx)
	if ev.Type != node.EventNodeFenceFailed || ev.Subject.ID != "lse_a" || fmt.Sprint(ev.Data["workload_ids"]) != "[wl_a]" {
		t.Errorf("event = %+v; want node.fence_failed of lse_a naming wl_a", ev)
	}
	if !n.running(ctx, "wl_a") {
		t.Errorf("the driver stopped wl_a although told to fail")
	}
	log := driverLog(t, dir)
	if !strings.Contains(log, "stop-failed wl_a mode=graceful") || !strings.Contains(log, "stop-failed wl_a mode=forced") {
		t.Errorf("driver log lacks the failed stops:\n%s", log)
	}
	if ok, _ := admits(n.mg, "lse_b", 1); ok {
		t.Errorf("a failed node admitted a stateful start of another lease")
	}
	if _, marked, _ := n.store.Meta(ctx, localstore.MetaFailed); !marked {
		t.Errorf("failed mark not in node_meta")
	}

	// The mark survives a restart.
	n.stop()
	n = startNode(t, dir, nodeOpts{grace: 2 * time.Second})
	if !n.mg.Failed() {
		t.Fatalf("node not failed after a restart")
	}
	if ok, _ := admits(n.mg, "lse_b", 1); ok {
		t.Errorf("a restarted failed node admitted a stateful start")
	}
	res = n.mg.Ack(ctx, []string{"lse_zz"})
	if res.Status != "ok" || !strings.Contains(res.Detail, "lse_a") || !n.mg.Failed() {
		t.Errorf("ack of an unknown lease = %+v; want ok naming lse_a, still failed", res)
	}
	res = n.mg.Ack(ctx, []string{"lse_a", "lse_zz"})
	if res.Status != "ok" || n.mg.Failed() {
		t.Errorf("ack = %+v, failed %v; want ok and not failed", res, n.mg.Failed())
	}
	if _, marked, _ := n.store.Meta(ctx, localstore.MetaFailed); marked {
		t.Errorf("failed mark still in node_meta after the ack")
	}
	if ok, why := admits(n.mg, "lse_b", 1); !ok {
		t.Errorf("Admit of a held lease after the ack: %s", why)
	}
	if ok, _ := admits(n.mg, "lse_a", 2); ok {
		t.Errorf("the acknowledged lease may start again without a higher grant")
	}
	res = n.mg.Ack(ctx, []string{"lse_a"})
	if res.Status != "ok" {
		t.Errorf("redelivered ack = %+v", res)
	}
}

// barrierDriver holds every graceful Stop until all of want arrived (or
// 20 s passed) and records whether they overlapped.
type barrierDriver struct {
	runtime.Driver
	want       int
	mu         sync.Mutex
	arrived    int
	all        chan struct{}
	overlapped atomic.Bool
}

func (b *barrierDriver) Stop(ctx context.Context, req *runtime.StopRequest) (*runtime.StopResponse, error) {
	if req.Mode == runtime.StopGraceful {
		b.mu.Lock()
		b.arrived++
		if b.arrived == b.want {
			close(b.all)
		}
		b.mu.Unlock()
		t := time.NewTimer(20 * time.Second)
		select {
		case <-b.all:
			b.overlapped.Store(true)
		case <-t.C:
		}
		t.Stop()
	}
	return b.Driver.Stop(ctx, req)
}

// TestConcurrentFencesOfTwoLeases expires two leases at once: each fence's
// graceful stop waits until the other's started, which only concurrent
// fences pass.
func TestConcurrentFencesOfTwoLeases(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	clock := &manualClock{}
	clock.set(time.Hour)
	bd := &barrierDriver{want: 2, all: make(chan struct{})}
	n := startNode(t, t.TempDir(), nodeOpts{clock: clock, wrap: func(d runtime.Driver) runtime.Driver { bd.Driver = d; return bd }})
	for _, id := range []string{"lse_a", "lse_b"} {
		g := &node.LeaseGrant{LeaseID: id, ResourceType: "service", ResourceID: "svc_" + id, Mode: node.LeaseExpiring,
			FencingToken: 5, DurationMS: 60000} // M = 6 s: 3 s graceful, 3 s forced
		if refused := n.mg.Grant(ctx, "", g); refused != nil {
			t.Fatal(refused)
		}
		due := n.mg.DueRenewals()
		if len(due) == 0 {
			t.Fatalf("no renewal due after the first grant of %s", id)
		}
		for _, r := range due {
			if r.LeaseID == id {
				n.mg.RenewSent("msg_r_"+id, r)
			}
		}
		if refused := n.mg.Grant(ctx, "msg_r_"+id, g); refused != nil {
			t.Fatal(refused)
		}
		if l, _ := n.mg.Lease(id); l.State != node.LeaseHeld {
			t.Fatalf("%s = %+v, want held", id, l)
		}
		n.bind(ctx, "wl_"+id, id)
	}
	clock.set(time.Hour + 60*time.Second) // past t_send + D - M
	n.mg.poke()
	for range 2 {
		if ev := n.event(ctx); ev.Type != node.EventNodeFenced || ev.Data["reason"] != ReasonExpired {
			t.Errorf("event = %+v; want node.fenced, reason expired", ev)
		}
	}
	if !bd.overlapped.Load() {
		t.Errorf("the two fences did not run concurrently")
	}
	for _, id := range []string{"wl_lse_a", "wl_lse_b"} {
		if n.running(ctx, id) {
			t.Errorf("%s still runs after its lease expired", id)
		}
	}
}

// blockingDriver never ends a Stop before ctx: the agent crashes mid-fence.
type blockingDriver struct {
	runtime.Driver
	entered chan struct{}
	once    sync.Once
}

func (b *blockingDriver) Stop(ctx context.Context, _ *runtime.StopRequest) (*runtime.StopResponse, error) {
	b.once.Do(func() { close(b.entered) })
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestCrashMidFenceLeavesLeaseFenced(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := t.TempDir()
	bd := &blockingDriver{entered: make(chan struct{})}
	n := startNode(t, dir, nodeOpts{wrap: func(d runtime.Driver) runtime.Driver { bd.Driver = d; return bd }})
	if refused := n.mg.Grant(ctx, "", &node.LeaseGrant{LeaseID: "lse_a", ResourceType: "service", ResourceID: "svc_a",
		Mode: node.LeaseLocal, FencingToken: 4}); refused != nil {
		t.Fatal(refused)
	}
	n.bind(ctx, "wl_a", "lse_a")
	rctx, rcancel := context.WithCancel(ctx)
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		n.mg.Revoke(rctx, &node.LeaseRevoke{LeaseID: "lse_a", FencingToken: 4, Reason: node.RevokeMoved})
	}()
	select {
	case <-bd.entered:
	case <-ctx.Done():
		t.Fatal("the fence never called Stop")
	}
	n.stop() // the agent dies mid-fence
	rcancel()
	<-answered
	rows, err := func() ([]localstore.LeaseRow, error) {
		st, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
		if err != nil {
			return nil, err
		}
		defer st.Close()
		return st.Leases(ctx)
	}()
	if err != nil || len(rows) != 1 || rows[0].State != string(node.LeaseRevoked) || rows[0].Fence != string(FenceRunning) {
		t.Fatalf("lease rows after the crash = %+v, %v; want revoked, fencing", rows, err)
	}

	n = startNode(t, dir, nodeOpts{})
	if ev := n.event(ctx); ev.Type != node.EventNodeFenced || ev.Subject.ID != "lse_a" {
		t.Errorf("event after restart = %+v; want node.fenced of lse_a", ev)
	}
	if n.running(ctx, "wl_a") {
		t.Errorf("wl_a still runs after the restarted fence")
	}
	if l, _ := n.mg.Lease("lse_a"); l.State != node.LeaseRevoked || l.Fence != FenceDone {
		t.Errorf("lease after restart = %+v; want revoked, fenced", l)
	}
	if ok, _ := admits(n.mg, "lse_a", 4); ok {
		t.Errorf("Admit of the fenced lease after restart")
	}
}

// TestRestartRestore restarts the manager over a held expiring lease: in
// the same boot with validity left it comes back uncertain and renews at
// once; with another boot id, or once the validity ran out, it comes back
// expired and fences its workload.
func TestRestartRestore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		boot    string
		advance time.Duration
		want    node.LeaseState
	}{
		{"same boot, validity left", "boot-1", time.Second, node.LeaseUncertain},
		{"same boot, validity ran out", "boot-1", 30 * time.Second, node.LeaseExpired},
		{"other boot", "boot-2", time.Second, node.LeaseExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			dir := t.TempDir()
			clock := &manualClock{}
			clock.set(time.Hour)
			n := startNode(t, dir, nodeOpts{clock: clock, boot: "boot-1"})
			g := &node.LeaseGrant{LeaseID: "lse_a", ResourceType: "service", ResourceID: "svc_a", Mode: node.LeaseExpiring,
				FencingToken: 9, DurationMS: 15000}
			n.mg.Grant(ctx, "", g)
			n.mg.RenewSent("msg_r1", node.LeaseRenew{LeaseID: "lse_a", FencingToken: 9})
			if refused := n.mg.Grant(ctx, "msg_r1", g); refused != nil {
				t.Fatal(refused)
			}
			n.bind(ctx, "wl_a", "lse_a")
			n.stop()

			clock.set(time.Hour + tc.advance)
			n = startNode(t, dir, nodeOpts{clock: clock, boot: tc.boot})
			l, _ := n.mg.Lease("lse_a")
			if l.State != tc.want {
				t.Fatalf("restored lease = %+v, want %s", l, tc.want)
			}
			if ok, _ := admits(n.mg, "lse_a", 9); ok {
				t.Errorf("a restored lease admits a start before its renewal is answered")
			}
			if tc.want == node.LeaseUncertain {
				due := n.mg.DueRenewals()
				if len(due) != 1 || due[0].FencingToken != 9 {
					t.Fatalf("renewals due after restore = %+v, want one at once", due)
				}
				if l.ValidUntil != time.Hour+13500*time.Millisecond {
					t.Errorf("restored validity %v, want the stored one", l.ValidUntil)
				}
				n.mg.RenewSent("msg_r2", due[0])
				if refused := n.mg.Grant(ctx, "msg_r2", g); refused != nil {
					t.Fatal(refused)
				}
				if ok, why := admits(n.mg, "lse_a", 9); !ok {
					t.Errorf("Admit after the renewal was answered: %s", why)
				}
				if !n.running(ctx, "wl_a") {
					t.Errorf("the workload of an uncertain lease was stopped")
				}
				return
			}
			ev := n.event(ctx)
			if ev.Type != node.EventNodeFenced || ev.Data["reason"] != ReasonExpired {
				t.Errorf("event = %+v; want node.fenced, reason expired", ev)
			}
			if n.running(ctx, "wl_a") {
				t.Errorf("wl_a still runs after its lease was restored expired")
			}
		})
	}
}
