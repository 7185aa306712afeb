package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// fakeNode is an agent running the fake runtime driver in its own process group, so the test can
// freeze the whole node (agent, driver plugin and the driver's workloads) with one signal.
type fakeNode struct {
	name, dir, id string
	proc          *proctest.Proc
}

// allowTestDrivers is the environment entry berth-agent needs to run on the
// fake driver (cmd/berth-agent refuses it otherwise).
const allowTestDrivers = "BERTH_ALLOW_TEST_DRIVERS=1"

// driverLog is the fake driver's transition log of the node (one line per start or stop).
func (n *fakeNode) driverLog() string { return filepath.Join(n.dir, "driver", "fake", "driver.log") }

// signal sends sig to the node's whole process group.
func (n *fakeNode) signal(sig syscall.Signal) { _ = syscall.Kill(-n.proc.Cmd().Process.Pid, sig) }

// startFakeNode enrolls and runs a fake-driver node labelled name=<name>; enrollArgs are further
// flags of berth-agent enroll (--region, --label).
func startFakeNode(t *testing.T, cl *cluster, name string, enrollArgs ...string) *fakeNode {
	t.Helper()
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{name: name, dir: filepath.Join(cl.dir, "agent-"+name)}
	logPath := filepath.Join(cl.dir, "agent-"+name+".log")
	enroll := start(t, logPath, "berth-agent", append([]string{"enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", n.dir, "--label", "name=" + name}, enrollArgs...)...)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("enroll %s exited %d:\n%s", name, code, b)
	}
	cmd := exec.Command(filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", n.dir, "--driver", "fake", "--plugin-dir", env.bin)
	cmd.Env = append(os.Environ(), allowTestDrivers)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.proc = proctest.StartCmd(t, logPath, cmd)
	t.Cleanup(func() {
		n.signal(syscall.SIGCONT)
		n.proc.Stop()
		n.signal(syscall.SIGKILL) // the driver plugin, if the agent left it behind
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 15000 {
				b = b[len(b)-15000:]
			}
			t.Logf("---- agent %s (tail) ----\n%s", name, b)
			d, _ := os.ReadFile(n.driverLog())
			t.Logf("---- driver log %s ----\n%s", name, d)
		}
	})
	return n
}

// waitNodes waits until every node is connected and fills in their ids (matched by hostname
// label order is not known, so by the enrollment label name=...).
func waitNodes(t *testing.T, cl *cluster, ns ...*fakeNode) {
	t.Helper()
	waitFor(t, converge, "nodes connected", func() (bool, string) {
		list, err := cl.c.ListNodes(context.Background())
		if err != nil {
			return false, err.Error()
		}
		connected := 0
		for _, n := range ns {
			for _, got := range list {
				if got.Labels["name"] == n.name {
					n.id = got.ID
					if got.Status == "connected" {
						connected++
					}
				}
			}
		}
		return connected == len(ns), fmt.Sprint(list)
	})
}

// transition is one line of a fake driver log.
type transition struct {
	at       time.Time
	what, wl string
}

func readDriverLog(t *testing.T, path string) []transition {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []transition
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, f[0])
		if err != nil {
			t.Fatalf("driver log %s: %q: %v", path, sc.Text(), err)
		}
		out = append(out, transition{at: at, what: f[1], wl: f[2]})
	}
	return out
}

// interval is when a node ran the service's workload, by its driver log; end is zero while it
// still runs.
type interval struct{ start, end time.Time }

// runIntervals returns the intervals during which the node ran any workload of wls.
func runIntervals(ts []transition, wls map[string]bool) []interval {
	var out []interval
	running := map[string]time.Time{}
	for _, tr := range ts {
		if !wls[tr.wl] {
			continue
		}
		switch tr.what {
		case "start":
			running[tr.wl] = tr.at
		case "stop":
			if s, ok := running[tr.wl]; ok {
				out = append(out, interval{s, tr.at})
				delete(running, tr.wl)
			}
		}
	}
	for _, s := range running {
		out = append(out, interval{start: s})
	}
	return out
}

func (cl *cluster) lease(t *testing.T, resource string) client.Lease {
	t.Helper()
	ls, err := cl.c.ListLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.ResourceID == resource {
			return l
		}
	}
	return client.Lease{}
}

// serviceWorkloadIDs returns every workload id the driver logs of ns mention for svc: the ids are
// the core's, listed through the API while they exist.
func (cl *cluster) serviceWorkloads(t *testing.T, svc string) map[string]string {
	t.Helper()
	ws, err := cl.c.ListWorkloads(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, w := range ws {
		if w.Service == svc {
			out[w.ID] = w.NodeID
		}
	}
	return out
}

func applyStateful(t *testing.T, cl *cluster, name string, durationMS int64) *client.Service {
	t.Helper()
	one := 1
	svc, err := cl.c.ApplyService(context.Background(), "default", name, client.ServiceSpec{
		Bundle: "hello", Command: []string{"./hello"}, Replicas: &one, PlacementMode: "stateful",
		Lease: &client.LeaseSpec{Mode: string(node.LeaseExpiring), DurationMS: durationMS},
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// waitHeldAndRunning waits until svc's lease is held and the holder's driver runs its workload,
// and returns the holder, the other node, the lease and the workload id.
func waitHeldAndRunning(t *testing.T, cl *cluster, svc *client.Service, a, b *fakeNode, notToken int64) (holder, other *fakeNode, l client.Lease, wl string) {
	t.Helper()
	waitFor(t, 90*time.Second, "stateful workload running under its lease", func() (bool, string) {
		l = cl.lease(t, svc.ID)
		if l.Holder == "" || l.FencingToken <= notToken {
			return false, fmt.Sprintf("lease %+v", l)
		}
		holder, other = a, b
		if l.Holder == b.id {
			holder, other = b, a
		}
		for id, nodeID := range cl.serviceWorkloads(t, svc.Name) {
			if nodeID != holder.id {
				continue
			}
			ivs := runIntervals(readDriverLog(t, holder.driverLog()), map[string]bool{id: true})
			if len(ivs) > 0 && ivs[len(ivs)-1].end.IsZero() {
				wl = id
				return true, ""
			}
		}
		return false, fmt.Sprintf("lease %+v held, workload not started yet", l)
	})
	return holder, other, l, wl
}

// TestLeasePausedHolder is the paused-node scenario of docs/node-protocol.md section 8: the node
// holding an expiring lease (D = 15 s) is frozen (SIGSTOP of its agent, driver and workloads) past
// its validity; the core grants the lease to the other node once its gate opens; when the frozen
// node wakes, its write with the old token is refused by the storage guard, it fences itself, and
// the driver logs show the two nodes never ran the workload at the same time while both were
// awake, apart from the woken node's own self-fence right after it wakes (a frozen process cannot
// stop anything; the fencing token is what protects storage in that window).
func TestLeasePausedHolder(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	cl.pushBundle(t, env.helloDir, "hello")
	a, b := startFakeNode(t, cl, "a"), startFakeNode(t, cl, "b")
	waitNodes(t, cl, a, b)

	const d = 15 * time.Second
	m := node.LeaseMargin(d)
	svc := applyStateful(t, cl, "db", d.Milliseconds())
	holder, other, l1, wl1 := waitHeldAndRunning(t, cl, svc, a, b, 0)
	t.Logf("lease %s held by %s at token %d, workload %s", l1.LeaseID, holder.name, l1.FencingToken, wl1)

	// The holder writes to shared storage with its token.
	stateDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(stateDir, "state"), []byte("written by the lease holder\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, stateDir, &buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	if _, err := cl.c.PushBundleFenced(ctx, "default", "state-1", svc.ID, l1.FencingToken, bytes.NewReader(data)); err != nil {
		t.Fatalf("holder's write with its token: %v", err)
	}

	// Freeze the holder: agent, driver plugin and its workloads.
	pausedAt := time.Now()
	holder.signal(syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			holder.signal(syscall.SIGCONT)
		}
	}()

	// The other node gets the lease after the gate and runs the workload.
	_, _, l2, wl2 := waitHeldAndRunning(t, cl, svc, other, other, l1.FencingToken)
	if l2.Holder != other.id || l2.FencingToken <= l1.FencingToken {
		t.Fatalf("after the pause: %+v", l2)
	}
	startedOther := runIntervals(readDriverLog(t, other.driverLog()), map[string]bool{wl2: true})[0].start
	t.Logf("failover: holder frozen at %s, workload running on the other node at %s: %.1f s (D + 2M = %s)",
		pausedAt.UTC().Format(time.RFC3339Nano), startedOther.UTC().Format(time.RFC3339Nano), startedOther.Sub(pausedAt).Seconds(), d+2*m)
	if _, err := cl.c.PushBundleFenced(ctx, "default", "state-2", svc.ID, l2.FencingToken, bytes.NewReader(data)); err != nil {
		t.Fatalf("new holder's write: %v", err)
	}

	// Wake the old holder: its stale write is refused, and it fences itself.
	wokeAt := time.Now()
	holder.signal(syscall.SIGCONT)
	paused = false
	_, err := cl.c.PushBundleFenced(ctx, "default", "state-3", svc.ID, l1.FencingToken, bytes.NewReader(data))
	if !client.IsCode(err, "stale_fencing_token") {
		t.Fatalf("the woken holder's write with token %d: %v, want stale_fencing_token", l1.FencingToken, err)
	}
	waitFor(t, 60*time.Second, "the woken holder fenced its workload", func() (bool, string) {
		ivs := runIntervals(readDriverLog(t, holder.driverLog()), map[string]bool{wl1: true})
		return len(ivs) == 1 && !ivs[0].end.IsZero(), fmt.Sprint(ivs)
	})
	waitFor(t, converge, "the woken holder reconnected, the lease stayed", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		for _, n := range ns {
			if n.ID == holder.id && n.Status == "connected" {
				l := cl.lease(t, svc.ID)
				return l.Holder == other.id && l.FencingToken == l2.FencingToken, fmt.Sprintf("%+v", l)
			}
		}
		return false, fmt.Sprint(ns)
	})

	// From the driver logs: the old holder ran [start, stop], frozen during [pausedAt, wokeAt];
	// the new holder from startedOther on. Awake, they overlap only while the woken node fenced.
	all := map[string]bool{wl1: true, wl2: true}
	old := runIntervals(readDriverLog(t, holder.driverLog()), all)
	cur := runIntervals(readDriverLog(t, other.driverLog()), all)
	if len(old) != 1 || len(cur) != 1 {
		t.Fatalf("driver logs: old holder %v, new holder %v; want one run each (the old holder never started again)", old, cur)
	}
	if !cur[0].start.After(pausedAt) {
		t.Fatalf("the new holder started at %s, before the old one was frozen at %s", cur[0].start, pausedAt)
	}
	awakeOverlap := old[0].end.Sub(maxTime(wokeAt, cur[0].start))
	if awakeOverlap < 0 {
		awakeOverlap = 0
	}
	t.Logf("old holder ran %s .. %s (frozen %s .. %s); new holder from %s; awake overlap %s (the woken node's own fence)",
		old[0].start.Format(time.RFC3339Nano), old[0].end.Format(time.RFC3339Nano), pausedAt.Format(time.RFC3339Nano),
		wokeAt.Format(time.RFC3339Nano), cur[0].start.Format(time.RFC3339Nano), awakeOverlap)
	t.Logf("driver log of the old holder:\n%s\ndriver log of the new holder:\n%s", readFile(t, holder.driverLog()), readFile(t, other.driverLog()))
	// While both were awake, only the woken node's self-fence overlapped: its stop is the first
	// thing it logged after waking (its fence must end within M by the protocol; the figure is
	// logged above, not asserted).
	if old[0].end.IsZero() || old[0].end.Before(wokeAt) || old[0].start.After(pausedAt) {
		t.Fatalf("old holder's run %v: want one run from before the freeze to a stop after waking", old[0])
	}
}

// TestLeaseFailedFence: a forced stop that fails ends in a failed fence; the lease is granted to
// nobody until an operator acknowledges it with `berth node fence-ack`, then to the other node
// under a higher token.
func TestLeaseFailedFence(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	cl.pushBundle(t, env.helloDir, "hello")
	a, b := startFakeNode(t, cl, "a"), startFakeNode(t, cl, "b")
	waitNodes(t, cl, a, b)
	svc := applyStateful(t, cl, "db", 3000)
	holder, other, l1, wl1 := waitHeldAndRunning(t, cl, svc, a, b, 0)

	// The holder's driver will fail every forced stop; removing the node revokes its lease.
	if err := os.WriteFile(filepath.Join(holder.dir, "driver", "fake", "fail-forced-stop"), []byte("*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "node", "remove", holder.id)
	fence, err := cl.c.NodeFence(ctx, holder.id)
	if err != nil || len(fence.FenceFailure) != 1 || fence.FenceFailure[0].LeaseID != l1.LeaseID {
		t.Fatalf("fence state of the removed holder: %+v %v", fence, err)
	}
	if l := cl.lease(t, svc.ID); l.Holder != "" || len(l.FenceFailed) != 1 || l.FenceFailed[0] != holder.id {
		t.Fatalf("lease after the failed fence: %+v", l)
	}
	ivs := runIntervals(readDriverLog(t, holder.driverLog()), map[string]bool{wl1: true})
	if len(ivs) != 1 || !ivs[0].end.IsZero() {
		t.Fatalf("the failed fence stopped the workload after all: %v", ivs)
	}

	// The reconciler sees the blocked lease on a pass after the failure and grants it to nobody.
	mark := strings.Count(readFile(t, filepath.Join(cl.dir, "berthd.log")), "its lease is blocked")
	waitFor(t, converge, "a reconcile pass refusing the blocked lease", func() (bool, string) {
		n := strings.Count(readFile(t, filepath.Join(cl.dir, "berthd.log")), "its lease is blocked")
		return n > mark, fmt.Sprintf("%d refusals logged", n)
	})
	if l := cl.lease(t, svc.ID); l.Holder != "" {
		t.Fatalf("blocked lease granted: %+v", l)
	}
	if ts := readDriverLog(t, other.driverLog()); len(ts) != 0 {
		t.Fatalf("the other node started something while the lease was blocked: %v", ts)
	}

	// The operator checked the machine and acknowledges; the other node gets it, higher token.
	if _, err := cl.c.FenceAck(ctx, holder.id, []string{"lse_wrong"}); !client.IsCode(err, "fence_ack_mismatch") {
		t.Fatalf("a wrong acknowledgement: %v", err)
	}
	out := cl.cli(t, "node", "fence-ack", holder.id, "--lease", l1.LeaseID)
	t.Log(strings.TrimSpace(out))
	_, _, l2, _ := waitHeldAndRunning(t, cl, svc, other, other, l1.FencingToken)
	if l2.Holder != other.id || l2.FencingToken <= l1.FencingToken+1 {
		t.Fatalf("after the acknowledgement: %+v (token before %d)", l2, l1.FencingToken)
	}
	if out := cl.cli(t, "get", "leases"); !strings.Contains(out, l1.LeaseID) || !strings.Contains(out, other.id) {
		t.Fatalf("berth get leases:\n%s", out)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
