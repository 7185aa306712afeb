package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// relayListenPort is the port of the relay's TLS listener in its namespace.
const relayListenPort = "8443"

// relayNode is an agent of the relay test: in a node namespace behind the relay, or direct.
type relayNode struct {
	name, dir, id, log string
	proc               *proctest.Proc
}

// TestRelayInNamespaces runs a cluster whose nodes reach only its relay (docs/relay.md section
// 13): berthd in the root namespace, berth-relay in a namespace that reaches berthd, two agents
// in namespaces whose only way out is the relay's host, where an nftables forward drop stands for
// the site's firewall. It proves the isolation first (a node connects to berthd's address before
// the firewall, not after; it connects to the relay), then: both nodes enroll through the relay
// (real TLS, pinned to the relay's certificate) and run a service with a replica on each, their
// bundle downloaded through the relay; an image is pulled through the relay's /v2/ from a node's
// namespace; kill -9 of the relay leaves the workloads running and the nodes resume when it
// returns; a restarted berthd sees the relay and the nodes register again.
//
// Last, the lease scenario of docs/node-protocol.md section 8 through the relay. Both relayed
// nodes sit behind the one relay, so stopping it (SIGSTOP) cuts them off together: a lease could
// not move between them. A third node therefore runs in the root namespace and dials berthd
// directly (the default cluster), the way a stateful service of a site can fail over to a node
// elsewhere. It joins only once the stateful service runs behind the relay. The relay is then
// stopped past the lease's duration: the holder, awake but cut off, must fence itself (its
// validity ends, no revoke can reach it), and the core grants the lease to the direct node only
// after its gate. The test samples every 100 ms and fails if the old holder's process and the
// new one's were ever seen alive together.
func TestRelayInNamespaces(t *testing.T) {
	t.Parallel()
	rn := newRelayNet(t) // first cleanup registered: runs after every process is gone
	ctx := context.Background()
	crane := craneBinary(t)

	// The isolation: berthd's future address answers a node before the firewall and not after.
	ln, err := net.Listen("tcp", net.JoinHostPort(rn.coreIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	api := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	if err := dialFrom(rn.nodeNS[0], api, 5*time.Second); err != nil {
		t.Fatalf("before the firewall, node namespace %s should reach %s through the relay's host: %v", rn.nodeNS[0], api, err)
	}
	rn.firewall(t)
	for _, ns := range rn.nodeNS {
		if err := dialFrom(ns, api, 2*time.Second); err == nil {
			t.Fatalf("node namespace %s reached berthd's address %s through the firewall", ns, api)
		}
	}
	_ = ln.Close()

	cl := newClusterAt(t, api)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"relay.log", "agent-a.log", "agent-b.log", "agent-c.log"} {
				b, _ := os.ReadFile(filepath.Join(cl.dir, f))
				if len(b) > 12000 {
					b = b[len(b)-12000:]
				}
				t.Logf("---- %s (tail) ----\n%s", f, b)
			}
		}
	})
	if err := dialFrom(rn.nodeNS[1], api, 2*time.Second); err == nil {
		t.Fatalf("node namespace %s reached berthd at %s", rn.nodeNS[1], api)
	}

	// The cluster, its relay credential, and the relay with its own certificate.
	cl.cli(t, "cluster", "create", "edge", "--requires-relay")
	rc, err := cl.c.EnsureRelayCredential(ctx, "edge")
	if err != nil || rc.Credential == "" {
		t.Fatalf("relay credential: %+v %v", rc, err)
	}
	credFile := filepath.Join(cl.dir, "relay-credential")
	if err := os.WriteFile(credFile, []byte(rc.Credential+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certPath, keyPath, relayPin := selfSignedCert(t, cl.dir, rn.relayNodeIP(0), rn.relayNodeIP(1))
	health := "http://" + net.JoinHostPort(rn.relayCoreIP(), "9184")
	relayArgs := []string{"netns", "exec", rn.relayNS, filepath.Join(env.bin, "berth-relay"),
		"--core-url", "wss://" + api + "/relay/v1/session", "--core-ca", filepath.Join(cl.dataDir(), "tls", "server.crt"),
		"--tls-cert", certPath, "--tls-key", keyPath, "--credential-file", credFile,
		"--listen", net.JoinHostPort("0.0.0.0", relayListenPort), "--health-listen", net.JoinHostPort(rn.relayCoreIP(), "9184"),
		"--log-level", "debug"}
	ipPath, _ := exec.LookPath("ip")
	runRelay := func() *proctest.Proc {
		p := proctest.Start(t, filepath.Join(cl.dir, "relay.log"), ipPath, relayArgs...)
		waitFor(t, converge, "relay ready", func() (bool, string) {
			if p.Exited() {
				t.Fatalf("berth-relay exited:\n%s", readFile(t, filepath.Join(cl.dir, "relay.log")))
			}
			code, body := httpGet(health + "/readyz")
			return code == http.StatusOK, fmt.Sprint(code, " ", body)
		})
		return p
	}
	relay := runRelay()
	relayStopped := false
	t.Cleanup(func() {
		if relayStopped {
			_ = syscall.Kill(relay.Cmd().Process.Pid, syscall.SIGCONT)
		}
	})
	for i, ns := range rn.nodeNS {
		if err := dialFrom(ns, net.JoinHostPort(rn.relayNodeIP(i), relayListenPort), 5*time.Second); err != nil {
			t.Fatalf("node namespace %s cannot reach its relay: %v", ns, err)
		}
	}
	if st, err := cl.c.ClusterStatus(ctx, "edge"); err != nil || st.Election.State != "connected" {
		t.Fatalf("cluster edge with its relay up: %+v %v", st, err)
	}

	// Two nodes enroll through the relay: the join token names the cluster, the server is the
	// relay's address in the node's link, the pin the relay's certificate.
	a := startRelayedNode(t, cl, "a", rn.nodeNS[0], "https://"+net.JoinHostPort(rn.relayNodeIP(0), relayListenPort), relayPin)
	b := startRelayedNode(t, cl, "b", rn.nodeNS[1], "https://"+net.JoinHostPort(rn.relayNodeIP(1), relayListenPort), relayPin)
	waitRelayNodes(t, cl, a, b)
	st, err := cl.c.ClusterStatus(ctx, "edge")
	if err != nil || st.Election.Relay == nil {
		t.Fatalf("cluster status: %+v %v", st, err)
	}
	status := cl.cli(t, "cluster", "status", "edge")
	for _, want := range []string{"connected", a.id, b.id, st.Election.Relay.RelayID, st.Election.Relay.Build} {
		if !strings.Contains(status, want) {
			t.Fatalf("berth cluster status edge does not show %q:\n%s", want, status)
		}
	}

	// A node of the cluster may enroll directly, but its session is refused there: the cluster
	// is reached only through its relay.
	refuseDirectSession(t, cl)

	// A service with a replica on each relayed node; their bundle comes through the relay.
	cl.pushBundle(t, env.helloDir, "hello")
	two := 2
	if _, err := cl.c.ApplyService(ctx, "default", "web", client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
		Replicas: &two, HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1},
		Scheduling: client.Scheduling{NodeSelector: map[string]string{"side": "relay"}, MaxPerNode: 1}}); err != nil {
		t.Fatal(err)
	}
	webPIDs := waitWebOnBoth(t, cl, a, b)
	t.Logf("web runs on both relayed nodes: %v", webPIDs)

	// An image pulled through the relay from a node's namespace: berthd's registry answers over
	// the relay, and its challenge names the relay's origin (the node could not reach berthd's).
	pullThroughRelay(t, cl, crane, rn)

	// kill -9 of the relay: the workloads keep running; the nodes redial and resume.
	relay.Kill9()
	waitFor(t, converge, "relayed nodes disconnected", func() (bool, string) {
		return nodeStatus(t, cl, a.id) == "disconnected" && nodeStatus(t, cl, b.id) == "disconnected",
			nodeStatus(t, cl, a.id) + " " + nodeStatus(t, cl, b.id)
	})
	if got := webPIDsNow(t, cl, webPIDs); !slices.Equal(got, sortedPIDs(webPIDs)) {
		t.Fatalf("web processes changed while the relay was down: %v, were %v", got, webPIDs)
	}
	relay = runRelay()
	waitRelayNodes(t, cl, a, b)
	waitFor(t, converge, "the relayed nodes report their workloads again", func() (bool, string) {
		return appliedCurrent(t, cl, a.id) && appliedCurrent(t, cl, b.id), ""
	})
	if got := webPIDsNow(t, cl, webPIDs); !slices.Equal(got, sortedPIDs(webPIDs)) {
		t.Fatalf("web processes changed across the relay's restart: %v, were %v", got, webPIDs)
	}

	// berthd crashes and restarts: the relay registers again (same relay, a higher sequence) and,
	// since the nodes' own connections to it never broke, asks them to re-register, which they
	// do; the workloads never stop. (A berthd that stops gracefully closes the node sessions
	// itself, and the nodes re-register without being asked.)
	before, err := cl.c.ClusterStatus(ctx, "edge")
	if err != nil || before.Election.Relay == nil {
		t.Fatalf("cluster status before berthd's restart: %+v %v", before, err)
	}
	reregs := strings.Count(readFile(t, filepath.Join(cl.dir, "relay.log")), "node asked to re-register")
	cl.berthd.Kill9()
	startBerthd(t, cl)
	waitFor(t, 2*converge, "relay registered again with berthd", func() (bool, string) {
		st, err := cl.c.ClusterStatus(ctx, "edge")
		if err != nil || st.Election.Relay == nil {
			return false, fmt.Sprint(st, err)
		}
		r := st.Election.Relay
		return st.Election.State == "connected" && r.RelayID == before.Election.Relay.RelayID && r.Sequence > before.Election.Relay.Sequence,
			fmt.Sprintf("%+v", st.Election)
	})
	waitRelayNodes(t, cl, a, b)
	if n := strings.Count(readFile(t, filepath.Join(cl.dir, "relay.log")), "node asked to re-register"); n < reregs+2 {
		t.Fatalf("the relay asked %d nodes to re-register after berthd's restart, want both", n-reregs)
	}
	if got := webPIDsNow(t, cl, webPIDs); !slices.Equal(got, sortedPIDs(webPIDs)) {
		t.Fatalf("web processes changed across berthd's restart: %v, were %v", got, webPIDs)
	}

	// The lease scenario. The stateful service first runs behind the relay (no other node yet).
	const d = 6 * time.Second
	one := 1
	db, err := cl.c.ApplyService(ctx, "default", "db", client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
		Replicas: &one, PlacementMode: "stateful", Lease: &client.LeaseSpec{Mode: string(node.LeaseExpiring), DurationMS: d.Milliseconds()}})
	if err != nil {
		t.Fatal(err)
	}
	var l1 client.Lease
	var holderPIDs []int
	waitFor(t, 2*converge, "db running under its lease behind the relay", func() (bool, string) {
		l1 = cl.lease(t, db.ID)
		if l1.Holder != a.id && l1.Holder != b.id {
			return false, fmt.Sprintf("lease %+v", l1)
		}
		holderPIDs = servicePIDsOn(t, cl, "db", l1.Holder)
		return len(holderPIDs) > 0, fmt.Sprintf("lease %+v, pids %v", l1, holderPIDs)
	})
	c := startDirectNode(t, cl, "c")
	waitFor(t, converge, "direct node connected", func() (bool, string) {
		s := nodeStatus(t, cl, c.id)
		return s == "connected", s
	})
	if l := cl.lease(t, db.ID); l.Holder != l1.Holder || l.FencingToken != l1.FencingToken {
		t.Fatalf("the lease moved before the relay stopped: %+v, was %+v", l, l1)
	}

	stoppedAt := time.Now()
	if err := syscall.Kill(relay.Cmd().Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	relayStopped = true
	var fencedAt, movedAt time.Time
	var l2 client.Lease
	deadline := time.Now().Add(2 * converge)
	for {
		oldAlive := anyAlive(holderPIDs)
		newPIDs := servicePIDsOn(t, cl, "db", c.id)
		if oldAlive && len(newPIDs) > 0 {
			t.Fatalf("db ran on the old holder (pids %v) and on the direct node (pids %v) at once", holderPIDs, newPIDs)
		}
		if !oldAlive && fencedAt.IsZero() {
			fencedAt = time.Now()
		}
		if len(newPIDs) > 0 {
			l2 = cl.lease(t, db.ID)
			if l2.Holder == c.id && l2.FencingToken > l1.FencingToken {
				movedAt = time.Now()
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("db did not move to the direct node within %s of stopping the relay: lease %+v, old holder alive %v",
				2*converge, cl.lease(t, db.ID), oldAlive)
		}
		time.Sleep(100 * time.Millisecond)
	}
	m := node.LeaseMargin(d)
	t.Logf("relay stopped at 0 s; the old holder's db process gone at %.1f s (its fence: D - M = %s after its last answered renewal); "+
		"db running on the direct node at %.1f s under token %d (was %d; the gate: D + 2M = %s)",
		fencedAt.Sub(stoppedAt).Seconds(), d-m, movedAt.Sub(stoppedAt).Seconds(), l2.FencingToken, l1.FencingToken, d+2*m)
	if fencedAt.IsZero() || !fencedAt.Before(movedAt) {
		t.Fatalf("the old holder had not fenced itself when the direct node ran db (fenced at %v, moved at %v)", fencedAt, movedAt)
	}

	// The relay resumes: its stalled session is gone, it dials again, the nodes re-register; the
	// lease stays where it went and the web replicas never stopped.
	if err := syscall.Kill(relay.Cmd().Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	relayStopped = false
	waitRelayNodes(t, cl, a, b)
	waitFor(t, converge, "the relayed nodes report again after the stall", func() (bool, string) {
		return appliedCurrent(t, cl, a.id) && appliedCurrent(t, cl, b.id), ""
	})
	if l := cl.lease(t, db.ID); l.Holder != c.id || l.FencingToken != l2.FencingToken {
		t.Fatalf("the lease after the relay resumed: %+v, want holder %s token %d", l, c.id, l2.FencingToken)
	}
	if pids := servicePIDsOn(t, cl, "db", l1.Holder); len(pids) > 0 || anyAlive(holderPIDs) {
		t.Fatalf("db runs again on the old holder: %v", pids)
	}
	if got := webPIDsNow(t, cl, webPIDs); !slices.Equal(got, sortedPIDs(webPIDs)) {
		t.Fatalf("web processes changed across the relay's stall: %v, were %v", got, webPIDs)
	}
	if out := cl.cli(t, "cluster", "status", "edge"); !strings.Contains(out, "connected") {
		t.Fatalf("berth cluster status edge after the stall:\n%s", out)
	}
}

// startRelayedNode enrolls and runs a process-driver node named name inside namespace ns,
// dialling server (the relay) pinned to pin, with a join token of cluster edge.
func startRelayedNode(t *testing.T, cl *cluster, name, ns, server, pin string) *relayNode {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{Cluster: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	n := &relayNode{name: name, dir: filepath.Join(cl.dir, "agent-"+name), log: filepath.Join(cl.dir, "agent-"+name+".log")}
	ipPath, _ := exec.LookPath("ip")
	agent := filepath.Join(env.bin, "berth-agent")
	enroll := proctest.Start(t, n.log, ipPath, "netns", "exec", ns, agent, "enroll", "--server", server, "--join-token", jt.Token,
		"--fingerprint", pin, "--data-dir", n.dir, "--hostname", "relayed-"+name, "--label", "side=relay", "--label", "name="+name)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll %s through the relay exited %d:\n%s", name, code, readFile(t, n.log))
	}
	n.proc = proctest.Start(t, n.log, ipPath, "netns", "exec", ns, agent, "run", "--data-dir", n.dir)
	return n
}

// startDirectNode enrolls and runs a process-driver node in the root namespace, dialling berthd.
func startDirectNode(t *testing.T, cl *cluster, name string) *relayNode {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := &relayNode{name: name, dir: filepath.Join(cl.dir, "agent-"+name), log: filepath.Join(cl.dir, "agent-"+name+".log")}
	enroll := start(t, n.log, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token, "--fingerprint", cl.fingerprint,
		"--data-dir", n.dir, "--hostname", "direct-"+name, "--label", "side=direct", "--label", "name="+name)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll %s exited %d:\n%s", name, code, readFile(t, n.log))
	}
	n.proc = start(t, n.log, "berth-agent", "run", "--data-dir", n.dir)
	waitFor(t, converge, "node "+name+" listed", func() (bool, string) {
		n.id = nodeIDByName(t, cl, name)
		return n.id != "", ""
	})
	return n
}

// waitRelayNodes waits until every node is connected, filling in their ids.
func waitRelayNodes(t *testing.T, cl *cluster, ns ...*relayNode) {
	t.Helper()
	waitFor(t, 2*converge, "relayed nodes connected", func() (bool, string) {
		var states []string
		ok := true
		for _, n := range ns {
			if n.id == "" {
				n.id = nodeIDByName(t, cl, n.name)
			}
			s := nodeStatus(t, cl, n.id)
			states = append(states, n.name+"="+s)
			ok = ok && n.id != "" && s == "connected"
		}
		return ok, strings.Join(states, " ")
	})
}

func nodeIDByName(t *testing.T, cl *cluster, name string) string {
	t.Helper()
	ns, err := cl.c.ListNodes(context.Background())
	if err != nil {
		return ""
	}
	for _, n := range ns {
		if n.Labels["name"] == name {
			return n.ID
		}
	}
	return ""
}

// nodeStatus is the node's status as berthd lists it ("" when unknown or berthd is away).
func nodeStatus(t *testing.T, cl *cluster, id string) string {
	t.Helper()
	if id == "" {
		return ""
	}
	n, err := cl.c.GetNode(context.Background(), id)
	if err != nil {
		return ""
	}
	return n.Status
}

// appliedCurrent reports whether the node applied the newest desired state berthd sent it.
func appliedCurrent(t *testing.T, cl *cluster, id string) bool {
	t.Helper()
	n, err := cl.c.GetNode(context.Background(), id)
	return err == nil && n.Status == "connected" && n.AppliedRev == n.DesiredRev
}

// waitWebOnBoth waits until web runs healthy on both nodes, one replica each, and returns the
// pids of its workloads by workload id.
func waitWebOnBoth(t *testing.T, cl *cluster, a, b *relayNode) map[string][]int {
	t.Helper()
	var pids map[string][]int
	waitFor(t, 3*converge, "web healthy on both relayed nodes", func() (bool, string) {
		ws := cl.workloads(t, "web")
		onNode := map[string]int{}
		pids = map[string][]int{}
		all := cl.workloadPIDs(t)
		for _, w := range ws {
			if w.ObservedStatus != "running" || w.Health != "passing" || len(all[w.ID]) == 0 {
				return false, fmt.Sprintf("%+v", ws)
			}
			onNode[w.NodeID]++
			pids[w.ID] = all[w.ID]
		}
		return len(ws) == 2 && onNode[a.id] == 1 && onNode[b.id] == 1, fmt.Sprintf("%+v", ws)
	})
	return pids
}

func sortedPIDs(m map[string][]int) []int {
	var out []int
	for _, p := range m {
		out = append(out, p...)
	}
	slices.Sort(out)
	return out
}

// webPIDsNow returns, sorted, the pids of the workloads in was that are alive now.
func webPIDsNow(t *testing.T, cl *cluster, was map[string][]int) []int {
	t.Helper()
	now := cl.workloadPIDs(t)
	out := map[string][]int{}
	for id := range was {
		out[id] = now[id]
	}
	return sortedPIDs(out)
}

// servicePIDsOn returns the pids of svc's workloads that berthd places on node id.
func servicePIDsOn(t *testing.T, cl *cluster, svc, id string) []int {
	t.Helper()
	ws, err := cl.c.ListWorkloads(context.Background(), "default")
	if err != nil {
		return nil
	}
	all := cl.workloadPIDs(t)
	var out []int
	for _, w := range ws {
		if w.Service == svc && w.NodeID == id {
			for _, p := range all[w.ID] {
				if alive(p) {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// alive reports whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(raw), ')')
	return i > 0 && i+2 < len(raw) && raw[i+2] != 'Z'
}

func anyAlive(pids []int) bool {
	return slices.ContainsFunc(pids, alive)
}

// httpGet returns the status and body of a GET of u (0 and the error on failure).
func httpGet(u string) (int, string) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	sb.Write(buf[:n])
	return resp.StatusCode, sb.String()
}

// pullThroughRelay pushes an image to berthd's registry from the root namespace, then pulls it
// with crane from node a's namespace through the relay (HEAD for its digest, GET for the manifest
// and every blob), checking the relay's certificate, and compares the digests. A push through
// the relay is refused: only GET and HEAD are carried under /v2/.
func pullThroughRelay(t *testing.T, cl *cluster, crane string, rn *relayNet) {
	t.Helper()
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	dir := t.TempDir()
	tar := filepath.Join(dir, "img.tar")
	tag, _ := name.NewTag("default/relayed:v1")
	if err := tarball.WriteToFile(tar, tag, img); err != nil {
		t.Fatal(err)
	}
	relayHost := net.JoinHostPort(rn.relayNodeIP(0), relayListenPort)
	run := func(ns, caFile string, args ...string) (string, error) {
		argv := append([]string{crane}, args...)
		if ns != "" {
			argv = append([]string{"ip", "netns", "exec", ns}, argv...)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "DOCKER_CONFIG="+filepath.Join(dir, "docker"), "SSL_CERT_FILE="+caFile)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	berthdCA := filepath.Join(cl.dataDir(), "tls", "server.crt")
	relayCA := filepath.Join(cl.dir, "relay.crt")
	for _, host := range []string{cl.api, relayHost} {
		if out, err := run("", berthdCA, "auth", "login", host, "-u", "berth", "-p", cl.token); err != nil {
			t.Fatalf("crane auth login %s: %v\n%s", host, err, out)
		}
	}
	if out, err := run("", berthdCA, "push", tar, cl.api+"/default/relayed:v1"); err != nil {
		t.Fatalf("crane push to berthd: %v\n%s", err, out)
	}
	got, err := run(rn.nodeNS[0], relayCA, "digest", relayHost+"/default/relayed:v1")
	if err != nil || got != want.String() {
		t.Fatalf("crane digest through the relay = %q (%v), want %s", got, err, want)
	}
	pulled := filepath.Join(dir, "pulled.tar")
	if out, err := run(rn.nodeNS[0], relayCA, "pull", relayHost+"/default/relayed@"+want.String(), pulled); err != nil {
		t.Fatalf("crane pull through the relay: %v\n%s", err, out)
	}
	pimg, err := tarball.ImageFromPath(pulled, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pd, err := pimg.Digest(); err != nil || pd != want {
		t.Fatalf("pulled image digest %v (%v), want %s", pd, err, want)
	}
	if out, err := run(rn.nodeNS[0], relayCA, "push", tar, relayHost+"/default/relayed:v2"); err == nil {
		t.Fatalf("a push through the relay was accepted:\n%s", out)
	}
}

// refuseDirectSession enrolls a node of cluster edge straight at berthd and dials its node
// session there: 403 relay_required, before any session opens.
func refuseDirectSession(t *testing.T, cl *cluster) {
	t.Helper()
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{Cluster: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	en, err := cl.c.Enroll(ctx, client.EnrollRequest{JoinToken: jt.Token, PublicKey: base64.StdEncoding.EncodeToString(pub),
		Hostname: "direct-edge", Address: "127.0.0.1", Capacity: client.Capacity{CPUs: 1, MemoryMB: 512}})
	if err != nil {
		t.Fatalf("enroll a node of edge directly: %v", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, "wss://"+cl.api+"/api/v1/nodes/session", &websocket.DialOptions{HTTPClient: cl.hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + en.Credential}}})
	if err == nil {
		_ = ws.CloseNow()
		t.Fatal("berthd opened a direct session for a node of a cluster that requires a relay")
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("direct session of a node of edge: %v %v, want 403 relay_required", resp, err)
	}
	var p struct {
		Code string `json:"code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Code != "relay_required" {
		t.Fatalf("direct session of a node of edge: code %q (%v), want relay_required", p.Code, err)
	}
	if err := cl.c.RemoveNode(ctx, en.NodeID); err != nil {
		t.Fatal(err)
	}
}
