package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// enrollNamed enrolls and runs one agent named hostname with extra flags on both enroll and
// run (--resource, --reserve), and returns its node once it is connected.
func (cl *cluster) enrollNamed(t *testing.T, hostname string, extra ...string) client.Node {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir, logPath := filepath.Join(cl.dir, hostname), filepath.Join(cl.dir, hostname+".log")
	enroll := start(t, logPath, "berth-agent", append([]string{"enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", dir, "--hostname", hostname}, extra...)...)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll of %s exited %d", hostname, code)
	}
	start(t, logPath, "berth-agent", append([]string{"run", "--data-dir", dir}, extra...)...)
	var out client.Node
	waitFor(t, converge, hostname+" connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, n := range ns {
			if n.Hostname == hostname {
				out = n
				// resource_limits comes with the session's hello, after the enrollment's capacity.
				return n.Status == "connected" && n.Allocatable.CPUMilli > 0 && n.ResourceLimits != "", fmt.Sprintf("%+v", n)
			}
		}
		return false, fmt.Sprint(ns)
	})
	return out
}

// TestNodeCapacityCordonDrain: two real agents report what they can give to workloads (one
// declares a gpu and keeps some CPU and memory for the host); an operator override changes what
// placement reads; a cordoned node gets nothing new; berth node drain waits until the one replica
// moved to the other node, which answers through the gateway; uncordon returns the node.
func TestNodeCapacityCordonDrain(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	a := cl.enrollNamed(t, "node-a", "--resource", "gpu=1", "--reserve", "cpu_m=500,memory_mib=256")
	b := cl.enrollNamed(t, "node-b")
	if want := int64(goruntime.NumCPU())*1000 - 500; a.Allocatable.CPUMilli != want || a.Allocatable.Extended["gpu"] != 1 {
		t.Fatalf("node-a allocatable %+v, want cpu %dm and gpu=1", a.Allocatable, want)
	}
	if b.Allocatable.CPUMilli != int64(goruntime.NumCPU())*1000 || b.Allocatable.MemoryMiB <= a.Allocatable.MemoryMiB || len(b.Allocatable.Extended) != 0 {
		t.Fatalf("node-b allocatable %+v against node-a %+v: want all CPUs, 256 MiB more memory, no gpu", b.Allocatable, a.Allocatable)
	}
	if a.ResourceLimits == "" {
		t.Fatal("node-a reported no resource_limits")
	}

	// An override: memory and gpu replaced, CPU as reported.
	cl.cli(t, "node", "set-capacity", a.ID, "--memory-mib", "1234", "--extended", "gpu=2")
	got, err := cl.c.GetNode(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Schedulable; s.MemoryMiB != 1234 || s.Extended["gpu"] != 2 || s.CPUMilli != a.Allocatable.CPUMilli {
		t.Fatalf("schedulable after the override %+v", s)
	}
	if out := cl.cli(t, "describe", "node", a.ID); !strings.Contains(out, "memory 1234 MiB") || !strings.Contains(out, "gpu=2") {
		t.Fatalf("describe node lacks the override:\n%s", out)
	}

	// node-b cordoned: the one replica lands on node-a.
	cl.cli(t, "node", "cordon", b.ID)
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)
	if ws := cl.workloads(t, "hello"); ws[0].NodeID != a.ID {
		t.Fatalf("the replica landed on %s, not node-a %s: node-b is cordoned", ws[0].NodeID, a.ID)
	}
	cl.waitAnswering(t, "hello.localhost", ids)
	if out := cl.cli(t, "get", "nodes"); !strings.Contains(out, "connected,cordoned") {
		t.Fatalf("get nodes does not show node-b cordoned:\n%s", out)
	}

	// Uncordon node-b, drain node-a: the command waits until the replica left it.
	cl.cli(t, "node", "uncordon", b.ID)
	out := cl.cli(t, "node", "drain", a.ID, "--deadline", "3m")
	if !strings.Contains(out, "drained") {
		t.Fatalf("node drain printed:\n%s", out)
	}
	ids = cl.waitReplicas(t, "hello", 1)
	if ws := cl.workloads(t, "hello"); ws[0].NodeID != b.ID {
		t.Fatalf("after the drain the replica runs on %s, want node-b %s", ws[0].NodeID, b.ID)
	}
	cl.waitAnswering(t, "hello.localhost", ids)
	var drained client.Node
	if err := json.Unmarshal([]byte(cl.cli(t, "describe", "node", a.ID, "-o", "json")), &drained); err != nil {
		t.Fatal(err)
	}
	if drained.Status != "draining" || drained.Drain == nil || drained.Drain.State != "drained" || len(drained.Drain.Remaining) != 0 || !drained.Cordoned {
		t.Fatalf("node-a after the drain: status %s cordoned %v drain %+v", drained.Status, drained.Cordoned, drained.Drain)
	}

	// Uncordon returns node-a; the replica stays where it is.
	cl.cli(t, "node", "uncordon", a.ID)
	got, err = cl.c.GetNode(ctx, a.ID)
	if err != nil || got.Status != "connected" || got.Cordoned || got.Drain != nil {
		t.Fatalf("node-a after uncordon: %+v %v", got, err)
	}
	if ws := cl.workloads(t, "hello"); len(ws) != 1 || ws[0].NodeID != b.ID {
		t.Fatalf("uncordon moved the replica: %+v", ws)
	}
}

// TestDrainHandsStatefulLeaseOver: the node holding a stateful service's local lease (which never
// moves by time) is drained; the real agent is sent lease_revoke drain, stops the workload and
// answers, the lease is granted to the other node under the next token, and the driver logs show
// the old run ended before the new one began. berth node drain --detach returns at once; the
// drain then reports drained.
func TestDrainHandsStatefulLeaseOver(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	cl.pushBundle(t, env.helloDir, "hello")
	a, b := startFakeNode(t, cl, "a"), startFakeNode(t, cl, "b")
	waitNodes(t, cl, a, b)
	one := 1
	svc, err := cl.c.ApplyService(ctx, "default", "db", client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"}, Replicas: &one,
		PlacementMode: "stateful", Lease: &client.LeaseSpec{Mode: string(node.LeaseLocal)}})
	if err != nil {
		t.Fatal(err)
	}
	holder, other, l1, wl1 := waitHeldAndRunning(t, cl, svc, a, b, 0)

	began := time.Now()
	if out := cl.cli(t, "node", "drain", holder.id, "--detach"); !strings.Contains(out, "draining") {
		t.Fatalf("node drain --detach printed:\n%s", out)
	}
	_, _, l2, wl2 := waitHeldAndRunning(t, cl, svc, other, other, l1.FencingToken)
	if l2.Holder != other.id || l2.FencingToken != l1.FencingToken+1 {
		t.Fatalf("lease after the drain %+v, want %s at token %d", l2, other.id, l1.FencingToken+1)
	}
	old := runIntervals(readDriverLog(t, holder.driverLog()), map[string]bool{wl1: true})
	next := runIntervals(readDriverLog(t, other.driverLog()), map[string]bool{wl2: true})
	if len(old) != 1 || old[0].end.IsZero() || len(next) != 1 || next[0].start.Before(old[0].end) {
		t.Fatalf("runs: old holder %v, new holder %v: want the old run ended before the new one began", old, next)
	}
	t.Logf("handover: drain at %s, old run stopped %.2f s later, new run started %.2f s later",
		began.UTC().Format(time.RFC3339Nano), old[0].end.Sub(began).Seconds(), next[0].start.Sub(began).Seconds())
	waitFor(t, converge, "the drain reports drained", func() (bool, string) {
		n, err := cl.c.GetNode(ctx, holder.id)
		if err != nil || n.Drain == nil {
			return false, fmt.Sprint(n, err)
		}
		return n.Drain.State == "drained", fmt.Sprintf("%+v", n.Drain)
	})
}
