package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// chaosProxy is a TCP proxy on loopback between the agent and berthd that
// can delay, drop (read and discard, both ways) and cut its connections.
type chaosProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{} // mu must be held
	delay time.Duration         // mu must be held
	drop  bool                  // mu must be held
	wg    sync.WaitGroup
}

func newChaosProxy(t *testing.T, target string) *chaosProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &chaosProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *chaosProxy) addr() string { return p.ln.Addr().String() }

func (p *chaosProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe copies src to dst, applying the current delay or drop to each read.
func (p *chaosProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		delay, drop := p.delay, p.drop
		p.mu.Unlock()
		if drop {
			continue
		}
		if delay > 0 {
			time.Sleep(delay) // the link's latency, not a wait in the test
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *chaosProxy) set(delay time.Duration, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.drop = delay, drop
}

// cut closes every open connection; new ones are still accepted.
func (p *chaosProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// prober requests a host through the gateway without pause and counts the
// answers that are not 200.
type prober struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	lastErr    string
	stop       context.CancelFunc
	done       chan struct{}
}

func (cl *cluster) probe(host string) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &prober{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		for ctx.Err() == nil {
			resp, err := cl.get(host, "/")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = errors.New(resp.Status)
				}
			}
			if err != nil {
				pr.failed.Add(1)
				pr.mu.Lock()
				pr.lastErr = err.Error()
				pr.mu.Unlock()
			} else {
				pr.ok.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return pr
}

func (pr *prober) finish() (ok, failed int64, last string) {
	pr.stop()
	<-pr.done
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.ok.Load(), pr.failed.Load(), pr.lastErr
}

// TestChaosLinkBetweenAgentAndCore puts a TCP proxy between the agent and
// berthd that delays, cuts and drops the link: the workloads keep serving
// through the gateway throughout, and once the link heals the agent
// converges on what changed meanwhile (docs/node-protocol.md section 6.5),
// including two rotations of the cluster signing key, one live and one while
// the node was away (section 5.21).
func TestChaosLinkBetweenAgentAndCore(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	proxy := newChaosProxy(t, cl.api)
	var jt client.JoinToken
	if err := json.Unmarshal([]byte(cl.cli(t, "join-token", "create", "-o", "json")), &jt); err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(cl.dir, "agent")
	enroll := start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "enroll",
		"--server", "https://"+proxy.addr(), "--join-token", jt.Token, "--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if enroll.Cmd().ProcessState.ExitCode() != 0 {
		t.Fatalf("enroll exited %d", enroll.Cmd().ProcessState.ExitCode())
	}
	start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "run", "--data-dir", agentDir)
	nodeState := func() (client.Node, bool) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return client.Node{}, false
		}
		return ns[0], true
	}
	waitFor(t, converge, "node connected through the proxy", func() (bool, string) {
		n, ok := nodeState()
		return ok && n.Status == "connected", fmt.Sprint(n)
	})
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 2)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 2)
	cl.waitAnswering(t, "hello.localhost", ids)

	pr := cl.probe("hello.localhost")
	converged := func(replicas int) func() (bool, string) {
		return func() (bool, string) {
			n, ok := nodeState()
			ws := cl.workloads(t, "hello")
			healthy := 0
			for _, w := range ws {
				if w.ObservedStatus == "running" && w.Health == "passing" {
					healthy++
				}
			}
			return ok && n.Status == "connected" && n.AppliedRev == n.DesiredRev && len(ws) == replicas && healthy == replicas,
				fmt.Sprintf("node %+v workloads %+v", n, ws)
		}
	}

	// 1. A slow link (200 ms each way per read): berthd rotates its signing
	// key (the live node acknowledges it), and a scale-up signed by the new
	// key still converges.
	proxy.set(200*time.Millisecond, false)
	var rot client.KeyRotation
	if err := json.Unmarshal([]byte(cl.cli(t, "cluster", "rotate-signing-key", "-o", "json")), &rot); err != nil {
		t.Fatal(err)
	}
	if len(rot.Nodes) != 1 || !rot.Nodes[0].Acknowledged {
		t.Fatalf("rotation over a slow link: %+v, want the one live node to acknowledge", rot)
	}
	writeSpec(t, spec, 3)
	cl.cli(t, "apply", "-f", spec)
	waitFor(t, converge, "3 replicas over a slow link", converged(3))

	// 2. The link is cut three times: the agent redials each time.
	proxy.set(0, false)
	for range 3 {
		proxy.cut()
		waitFor(t, converge, "node connected after a cut", converged(3))
	}

	// 3. The link drops everything for longer than the session timeout: the
	// core marks the node disconnected, the workloads keep serving, and a
	// change made meanwhile (a fourth replica) waits for the node.
	proxy.set(0, true)
	dropped := time.Now()
	waitFor(t, converge, "node disconnected while the link drops", func() (bool, string) {
		n, ok := nodeState()
		return ok && n.Status == "disconnected", fmt.Sprint(n)
	})
	t.Logf("the core marked the node disconnected %s after the link started dropping", time.Since(dropped).Round(time.Second))
	writeSpec(t, spec, 4)
	cl.cli(t, "apply", "-f", spec)
	// The key rotates again while the node is away: it is handed the new
	// key at its next handshake, before the desired state signed by it.
	if err := json.Unmarshal([]byte(cl.cli(t, "cluster", "rotate-signing-key", "-o", "json")), &rot); err != nil {
		t.Fatal(err)
	}
	if len(rot.Nodes) != 0 {
		t.Fatalf("rotation while the node is away reached %+v", rot.Nodes)
	}

	// 4. The link heals (connections that lost bytes die; the agent
	// redials): the agent takes the key and converges on the change.
	proxy.set(0, false)
	proxy.cut()
	waitFor(t, 2*converge, "4 replicas after the link healed", converged(4))
	ok, failed, last := pr.finish()
	if failed > 0 || ok == 0 {
		t.Fatalf("through the chaos the gateway answered %d requests with 200 and %d without (last: %s); want every one served", ok, failed, last)
	}
	t.Logf("gateway answered all %d requests during the chaos", ok)
}
