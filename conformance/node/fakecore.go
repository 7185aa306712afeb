package node

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/sdk/client"
)

// Values the scripted core hands the agent at enrollment.
const (
	fakeJoinToken  = "brj_conformance_join_token"
	fakeCredential = "brn_conformance_node_credential"
	fakeNodeID     = "nod_conformance"
	fakeClusterID  = "cls_conformance"
)

// fakeCore is a scripted berthd for one case: it serves enrollment and the
// node session over TLS on loopback, pinned by fingerprint like the real one
// (docs/node-protocol.md section 2.2), and hands each session to the case.
type fakeCore struct {
	t           conformance.T
	srv         *httptest.Server
	fingerprint string
	key         ed25519.PrivateKey
	pub         ed25519.PublicKey
	sessions    chan *peer
	mu          sync.Mutex
	done        chan struct{}
	// refused counts session requests refused for a bad credential or a
	// credential outside the Authorization header.
	refused int
}

func newFakeCore(t conformance.T) *fakeCore {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("signing key: %v", err)
	}
	fc := &fakeCore{t: t, key: priv, pub: pub, sessions: make(chan *peer, 16), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/nodes/enroll", fc.enroll)
	mux.HandleFunc("GET /api/v1/nodes/session", fc.session)
	fc.srv = httptest.NewUnstartedServer(mux)
	fc.srv.StartTLS()
	fc.fingerprint = client.Fingerprint(fc.srv.Certificate().Raw)
	t.Cleanup(func() {
		close(fc.done)
		fc.srv.CloseClientConnections()
		fc.srv.Close()
	})
	return fc
}

func (fc *fakeCore) enroll(w http.ResponseWriter, r *http.Request) {
	var req client.EnrollRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.JoinToken != fakeJoinToken {
		http.Error(w, `{"code":"join_token_expired","status":422}`, http.StatusUnprocessableEntity)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(client.EnrollResponse{NodeID: fakeNodeID, Credential: fakeCredential,
		ClusterPublicKey: base64.StdEncoding.EncodeToString(fc.pub), ClusterID: fakeClusterID})
}

func (fc *fakeCore) session(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+fakeCredential || strings.Contains(r.URL.RawQuery, fakeCredential) {
		fc.mu.Lock()
		fc.refused++
		fc.mu.Unlock()
		http.Error(w, `{"code":"unauthenticated","status":401}`, http.StatusUnauthorized)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	p := newPeer(fc.t, ws)
	select {
	case fc.sessions <- p:
	case <-fc.done:
		_ = ws.CloseNow()
		return
	}
	<-fc.done
	_ = ws.CloseNow()
}

// accept waits for the agent's next session.
func (fc *fakeCore) accept() *peer {
	fc.t.Helper()
	select {
	case p := <-fc.sessions:
		return p
	case <-time.After(wait):
		fc.t.Fatalf("the agent dialled no session within %s", wait)
	case <-fc.t.Context().Done():
		fc.t.Fatalf("cancelled while waiting for a session")
	}
	return nil
}

// signed returns a desired_state body of rev signed by key.
func (fc *fakeCore) signed(rev int64, key ed25519.PrivateKey, wls ...node.WorkloadSpec) node.DesiredState {
	fc.t.Helper()
	if wls == nil {
		wls = []node.WorkloadSpec{}
	}
	d := node.DesiredState{Rev: rev, IssuedAt: time.Now().UTC().Truncate(time.Second), Term: 1,
		Spec: node.Spec{Workloads: wls, Routes: []node.RouteSpec{}, Network: node.Network{Address: "127.0.0.1"}}}
	if err := node.Sign(&d, key); err != nil {
		fc.t.Fatalf("sign desired_state: %v", err)
	}
	return d
}

// welcome reads the hello a fresh session starts with, answers welcome with
// the given heartbeat interval and returns the hello.
func (fc *fakeCore) welcome(p *peer, heartbeat time.Duration) node.Hello {
	fc.t.Helper()
	env := p.next()
	if env.Type != node.TypeHello {
		fc.t.Fatalf("first message of the session is %s, want hello (docs/node-protocol.md section 4.2)", env.Type)
	}
	h := decode[node.Hello](fc.t, env)
	p.send(node.TypeWelcome, env.ID, node.Welcome{ClusterID: fakeClusterID, Term: 1, ServerTime: time.Now().UTC(),
		HeartbeatIntervalMS: heartbeat.Milliseconds(), SessionTimeoutMS: node.DefaultSessionTimeout.Milliseconds()})
	return h
}

// desire sends a desired_state and waits for its command_result.
func (fc *fakeCore) desire(p *peer, d node.DesiredState) node.CommandResult {
	fc.t.Helper()
	id := p.send(node.TypeDesiredState, "", d)
	env := p.await("command_result for desired_state", func(e *node.Envelope) bool {
		return (e.Type == node.TypeCommandResult || e.Type == node.TypeError) && e.Re == id
	})
	if env.Type == node.TypeError {
		fc.t.Fatalf("desired_state rev %d answered with error %s", d.Rev, env.Body)
	}
	return decode[node.CommandResult](fc.t, env)
}

// agentProc is a running berth-agent started by a case.
type agentProc struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
	code int
}

// agentRun is one case's agent: enrolled against its own fake core, running.
type agentRun struct {
	cfg     AgentConfig
	core    *fakeCore
	dataDir string
	proc    *agentProc
}

// startAgent enrolls a fresh data directory against a new fake core and
// starts `berth-agent run` on it. Cleanup stops the agent and every
// workload it left running (workloads outlive the agent by design).
func startAgent(t conformance.T, cfg AgentConfig) *agentRun {
	t.Helper()
	fc := newFakeCore(t)
	dir := t.TempDir()
	a := &agentRun{cfg: cfg, core: fc, dataDir: filepath.Join(dir, "agent")}
	enroll := a.exec(t, "enroll", "--server", fc.srv.URL, "--join-token", fakeJoinToken, "--fingerprint", fc.fingerprint,
		"--data-dir", a.dataDir, "--hostname", "conformance")
	select {
	case <-enroll.done:
	case <-time.After(wait):
		t.Fatalf("berth-agent enroll did not finish within %s", wait)
	}
	if enroll.code != 0 {
		t.Fatalf("berth-agent enroll exited %d:\n%s", enroll.code, enroll.out.String())
	}
	a.start(t)
	t.Cleanup(func() { killWorkloads(a.dataDir) })
	return a
}

// start runs `berth-agent run` on the enrolled data directory.
func (a *agentRun) start(t conformance.T) {
	t.Helper()
	args := []string{"run", "--data-dir", a.dataDir}
	if a.cfg.PluginDir != "" {
		args = append(args, "--plugin-dir", a.cfg.PluginDir)
	}
	a.proc = a.exec(t, args...)
}

func (a *agentRun) exec(t conformance.T, args ...string) *agentProc {
	t.Helper()
	p := &agentProc{out: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(a.cfg.Binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s %s: %v", a.cfg.Binary, args[0], err)
	}
	go func() {
		err := p.cmd.Wait()
		p.code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if failed, ok := t.(interface{ Failed() bool }); ok && failed.Failed() && args[0] == "run" {
			t.Logf("berth-agent output:\n%s", tail(p.out.String(), 8000))
		}
	})
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (p *agentProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// killWorkloads SIGKILLs every process whose working directory lies under
// dir: the workloads an agent of this case started.
func killWorkloads(dir string) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+string(filepath.Separator)) {
			continue
		}
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// sessionCtx is a context for one step of a case.
func sessionCtx(t conformance.T) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), wait)
}
