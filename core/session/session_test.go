package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

type fixture struct {
	srv     *httptest.Server
	reg     *nodes.Registry
	cat     *services.Catalog
	pub     ed25519.PublicKey
	node    *nodes.Node
	cred    string
	changes chan string
	events  *events.Log
	clog    *changelog.Log
	st      *store.Store
	s       *Server
}

func newFixture(t *testing.T, opts ...func(*Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t)
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	tok, _, err := reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	npub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, cred, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(npub), Hostname: "n1", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{reg: reg, cat: cat, pub: pub, node: n, cred: cred, changes: make(chan string, 64), events: events.New(st, nil),
		clog: changelog.New(st, 1, nil), st: st}
	cfg := Config{Nodes: reg, Catalog: cat, SigningKey: priv, ClusterID: "cls_test", Events: f.events, Changelog: f.clog,
		OnChange: func(r string) { f.changes <- r }, SessionTimeout: quietPeerTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	s := New(cfg)
	f.s = s
	f.srv = httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); f.srv.Close() })
	return f
}

// quietPeerTimeout is the session timeout of the fixtures. The test peer
// sends no heartbeats, so with a short timeout the core ends its session
// whenever the peer is quiet for longer, for example while it verifies a
// batch of 1 MB change-log entries on a loaded machine; tests that are about
// the timeout set their own (TestSilentNodeTimesOut).
const quietPeerTimeout = 2 * time.Minute

// peerReadBound bounds how long the peer waits for the core's next frame.
// A 500-entry change-log batch read from the embedded store under -race on
// a loaded machine takes several seconds.
const peerReadBound = 30 * time.Second

type peer struct {
	t  *testing.T
	ws *websocket.Conn
}

func (f *fixture) dial(t *testing.T, cred string) (*peer, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.srv.URL, "http"), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + cred}},
	})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(4 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return &peer{t: t, ws: ws}, resp, nil
}

func (p *peer) send(v int, typ node.Type, body any) {
	p.t.Helper()
	raw, _ := json.Marshal(body)
	frame, _ := json.Marshal(node.Envelope{V: v, Type: typ, ID: "msg_test", Body: raw})
	p.sendRaw(frame)
}

func (p *peer) sendRaw(frame []byte) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		p.t.Fatal(err)
	}
}

// next reads the next envelope, or fails the test when none arrives within
// peerReadBound.
func (p *peer) next() *node.Envelope {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), peerReadBound)
	defer cancel()
	_, raw, err := p.ws.Read(ctx)
	if err != nil {
		p.t.Fatalf("read: %v", err)
	}
	var env node.Envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		p.t.Fatal(err)
	}
	return &env
}

func (p *peer) expectError(code string, fatal bool) {
	p.t.Helper()
	env := p.next()
	var e node.ErrorBody
	_ = json.Unmarshal(env.Body, &e)
	if env.Type != node.TypeError || e.Code != code || e.Fatal != fatal {
		p.t.Fatalf("got %s %s, want error %s fatal=%v", env.Type, env.Body, code, fatal)
	}
}

// handshake sends hello and checks welcome then a verifiable desired_state.
func (f *fixture) handshake(t *testing.T, p *peer) *node.DesiredState {
	t.Helper()
	p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, AgentVersion: "test"})
	if env := p.next(); env.Type != node.TypeWelcome || env.Re != "msg_test" {
		t.Fatalf("first message %s re %q, want welcome re msg_test", env.Type, env.Re)
	}
	env := p.next()
	if env.Type != node.TypeDesiredState {
		t.Fatalf("second message %s, want desired_state", env.Type)
	}
	ds, err := node.Verify(env.Body, f.pub)
	if err != nil {
		t.Fatalf("desired_state does not verify: %v", err)
	}
	return ds
}

func TestSessionRefusesBadCredentials(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, cred := range []string{"", "brn_wrong"} {
		_, resp, err := f.dial(t, cred)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("credential %q: err %v resp %v, want 401", cred, err, resp)
		}
	}
}

func TestSessionHandshakeAndSteadyState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	ds := f.handshake(t, p)
	if ds.Rev != 0 || len(ds.Spec.Workloads) != 0 {
		t.Fatalf("fresh node got %+v", ds)
	}
	// The status writer records the start off the session's path: wait for it.
	f.waitNode(t, "connected after hello", func(n *nodes.Node) bool { return n.Status == nodes.StatusConnected })

	// Unknown type and oversize frame: non-fatal, the session goes on.
	p.send(1, "no_such_type", struct{}{})
	p.expectError("bad_message", false)
	p.sendRaw([]byte(`{"v":1,"type":"heartbeat","id":"msg_big","body":{"pad":"` + strings.Repeat("x", node.MaxMessageBytes) + `"}}`))
	p.expectError("bad_message", false)
	p.sendRaw([]byte(`not json`))
	p.expectError("bad_message", false)
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong || env.Re != "msg_test" {
		t.Fatalf("got %s re %q, want pong", env.Type, env.Re)
	}

	// A status report updates only this node's workloads.
	ctx := context.Background()
	p1, _, _ := f.cat.EnsureProject(ctx, "p")
	svc, _, err := f.cat.PutService(ctx, p1, &services.Service{Name: "s", BundleDigest: "sha256:x", Command: []string{"x"}, Replicas: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mine, _ := f.cat.CreateWorkload(ctx, svc, 0, f.node.ID)
	theirs, _ := f.cat.CreateWorkload(ctx, svc, 1, "nod_other")
	p.send(1, node.TypeStatusReport, node.StatusReport{AppliedRev: 0, Workloads: []node.WorkloadStatus{
		{WorkloadID: mine.ID, ObservedStatus: "running", Health: "passing", Address: "127.0.0.1:1"},
		{WorkloadID: theirs.ID, ObservedStatus: "running", Health: "passing", Address: "127.0.0.1:2"},
	}})
	waitChange(t, f.changes, "status_report")
	ws, _ := f.cat.ListWorkloads(ctx, bson.M{})
	for _, w := range ws {
		switch w.ID {
		case mine.ID:
			if w.ObservedStatus != "running" || w.Address != "127.0.0.1:1" {
				t.Fatalf("own workload not updated: %+v", w)
			}
		case theirs.ID:
			if w.ObservedStatus != "creating" || w.Address != "" {
				t.Fatalf("another node's workload was written: %+v", w)
			}
		}
	}

	// Pushing a newer desired state delivers it, signed.
	n, _ := f.reg.Get(ctx, f.node.ID)
	if _, _, err := f.reg.SetDesired(ctx, n, "h1", `{"workloads":[],"routes":[],"network":{"address":"127.0.0.1"}}`); err != nil {
		t.Fatal(err)
	}
	s := f.srv.Config.Handler.(*Server)
	s.Push(ctx, f.node.ID)
	env := p.next()
	ds, err = node.Verify(env.Body, f.pub)
	if err != nil || ds.Rev != 1 {
		t.Fatalf("pushed desired_state: %v %+v", err, ds)
	}
}

func TestSessionProtocolViolations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	t.Run("first message not hello", func(t *testing.T) {
		p, _, err := f.dial(t, f.cred)
		if err != nil {
			t.Fatal(err)
		}
		p.send(1, node.TypeHeartbeat, node.Heartbeat{})
		p.expectError("bad_message", true)
	})
	t.Run("unsupported major version", func(t *testing.T) {
		p, _, err := f.dial(t, f.cred)
		if err != nil {
			t.Fatal(err)
		}
		p.send(2, node.TypeHello, node.Hello{NodeID: f.node.ID})
		p.expectError("unsupported_version", true)
	})
	t.Run("hello naming another node", func(t *testing.T) {
		p, _, err := f.dial(t, f.cred)
		if err != nil {
			t.Fatal(err)
		}
		p.send(1, node.TypeHello, node.Hello{NodeID: "nod_someone_else"})
		p.expectError("bad_message", true)
	})
}

// TestBadFirstFrameIsFatalBadMessage: whatever the first frame is, when it is
// not a valid hello the core answers a fatal bad_message before it closes the
// socket (docs/node-protocol.md section 4.2), and the node stays pending.
func TestBadFirstFrameIsFatalBadMessage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	big := []byte(`{"v":1,"type":"hello","id":"msg_big","body":{"pad":"` + strings.Repeat("x", node.MaxMessageBytes) + `"}}`)
	for _, tc := range []struct {
		name  string
		typ   websocket.MessageType
		frame []byte
	}{
		{"not JSON", websocket.MessageText, []byte(`not json`)},
		{"binary frame", websocket.MessageBinary, []byte(`{"v":1,"type":"hello","id":"msg_bin","body":{}}`)},
		{"over the frame limit", websocket.MessageText, big},
		{"version of the wrong type", websocket.MessageText, []byte(`{"v":"1","type":"hello","id":"msg_v","body":{}}`)},
		{"no type", websocket.MessageText, []byte(`{"v":1,"id":"msg_t","body":{}}`)},
		{"wrong type", websocket.MessageText, []byte(`{"v":1,"type":"heartbeat","id":"msg_hb","body":{}}`)},
		{"hello body not an object", websocket.MessageText, []byte(`{"v":1,"type":"hello","id":"msg_h","body":[1]}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, err := f.dial(t, f.cred)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.ws.Write(ctx, tc.typ, tc.frame); err != nil {
				t.Fatal(err)
			}
			p.expectError("bad_message", true)
			_, _, err = p.ws.Read(ctx)
			if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
				t.Fatalf("after the error the socket read %v, want close 1008", err)
			}
		})
	}
	t.Run("unsupported major version", func(t *testing.T) {
		p, _, err := f.dial(t, f.cred)
		if err != nil {
			t.Fatal(err)
		}
		p.send(2, node.TypeHello, node.Hello{NodeID: f.node.ID})
		p.expectError("unsupported_version", true) // section 3.4 names its own code
	})
	n, err := f.reg.Get(context.Background(), f.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n.Status != nodes.StatusPending {
		t.Fatalf("node status %s after refused first frames, want pending", n.Status)
	}
}

func TestNewerSessionClosesOlder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	old, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, old)
	fresh, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, fresh)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err = old.ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("older session read %v, want close 1008", err)
	}
	// The fresh session still works, and the node stays connected.
	fresh.send(1, node.TypePing, struct{}{})
	if env := fresh.next(); env.Type != node.TypePong {
		t.Fatalf("got %s", env.Type)
	}
	// The old session's end went to the status writer when its handler returned: wait until
	// the writer has nothing pending and the node shows the fresh session.
	f.s.mu.Lock()
	current := f.s.sessions[f.node.ID].id
	f.s.mu.Unlock()
	waitFor(t, "the status writer drained", f.s.status.idle)
	f.waitNode(t, "connected under the fresh session", func(n *nodes.Node) bool {
		return n.SessionID == current && n.Status == nodes.StatusConnected
	})
}

func TestSilentNodeTimesOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *Config) { c.SessionTimeout = 3 * time.Second })
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	// No frames: the core ends the session after SessionTimeout (3 s here).
	waitChange(t, f.changes, "node.disconnected")
	n, _ := f.reg.Get(context.Background(), f.node.ID)
	if n.Status != nodes.StatusDisconnected {
		t.Fatalf("status %s, want disconnected", n.Status)
	}
	expectEvents(t, f, events.TypeNodeDisconnected, "heartbeat_timeout")
}

// waitNode waits (10 s at most) until the node's stored document satisfies ok, and returns it.
func (f *fixture) waitNode(t *testing.T, what string, ok func(*nodes.Node) bool) *nodes.Node {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := f.reg.Get(context.Background(), f.node.ID)
		if err == nil && ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not %s within 10 s: %+v (err %v)", what, n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor waits (10 s at most) until ok reports true.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitChange(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %q change within 10 s", want)
		}
	}
}

// TestLastFrameFollowsEveryFrame: the session knows when its node's last frame arrived, newer
// than the last_seen_at the store keeps (written at most every 30 s), and forgets it with the
// session.
func TestLastFrameFollowsEveryFrame(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.srv.Config.Handler.(*Server)
	if _, ok := s.LastFrame(f.node.ID); ok {
		t.Fatal("a last frame before any session")
	}
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	first, ok := s.LastFrame(f.node.ID)
	if !ok {
		t.Fatal("no last frame after the hello")
	}
	// The hello queues two writes (the session's start, then last_seen_at with the applied
	// revision) before the welcome is sent; the writer may take them in one pass or two, so the
	// stored time is read once it has written both.
	waitFor(t, "the status writer drained", f.s.status.idle)
	stored := f.waitNode(t, "seen at the handshake", func(n *nodes.Node) bool { return n.LastSeenAt != nil })
	before := time.Now()
	p.send(1, node.TypePing, struct{}{})
	if env := p.next(); env.Type != node.TypePong {
		t.Fatalf("got %s, want pong", env.Type)
	}
	last, ok := s.LastFrame(f.node.ID)
	if !ok || last.Before(before) || !last.After(first) {
		t.Fatalf("last frame %v (ok %v) after a ping sent at %v; the hello's was %v", last, ok, before, first)
	}
	if n, _ := f.reg.Get(context.Background(), f.node.ID); n.LastSeenAt == nil || !n.LastSeenAt.Equal(*stored.LastSeenAt) || !last.After(*n.LastSeenAt) {
		t.Fatalf("stored last_seen_at %v (was %v), last frame %v: want the stored one unchanged and older", n.LastSeenAt, stored.LastSeenAt, last)
	}
}

// TestSessionStoreFailureIs503 pins the answer to a credential lookup the store could not make: 503
// unavailable with Retry-After, not the 401 of a credential that does not match, so an agent and
// its operator are never told a good credential is bad (docs/node-protocol.md section 3.1).
func TestSessionStoreFailureIs503(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, resp, err := f.dial(t, "brn_wrong")
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong credential: err %v resp %v, want 401", err, resp)
	}
	// The node's document is written, so the read view must re-read it by _id before it can
	// answer; then the store goes away under the server: every read of it fails from now on.
	// (A credential whose entries the view holds unchanged is answered from memory.)
	if err := f.reg.Seen(context.Background(), f.node.ID, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, cred := range []string{f.cred, "brn_wrong"} {
		_, resp, err = f.dial(t, cred)
		if err == nil || resp == nil {
			t.Fatalf("dial with the store closed: err %v resp %v, want an HTTP refusal", err, resp)
		}
		var body struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusServiceUnavailable || body.Code != "unavailable" || body.Status != http.StatusServiceUnavailable ||
			resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("dial with the store closed: %d %+v Content-Type %q Retry-After %q, want 503 unavailable with Retry-After",
				resp.StatusCode, body, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"))
		}
	}
}
