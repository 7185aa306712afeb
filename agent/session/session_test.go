package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
)

const credential = "brn_test_credential"

// fakeCore stands for berthd's node-session endpoint (core/session): a real
// WebSocket server that hands each accepted connection to the test.
type fakeCore struct {
	t     *testing.T
	srv   *httptest.Server
	conns chan *coreConn
	key   ed25519.PrivateKey
	pub   ed25519.PublicKey
}

type coreConn struct {
	t  *testing.T
	ws *websocket.Conn
}

func newFakeCore(t *testing.T) *fakeCore {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeCore{t: t, conns: make(chan *coreConn, 8), key: priv, pub: pub}
	fc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path || r.Header.Get("Authorization") != "Bearer "+credential || strings.Contains(r.URL.RawQuery, credential) {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(4 << 20)
		cc := &coreConn{t: t, ws: ws}
		fc.conns <- cc
		<-r.Context().Done()
	}))
	t.Cleanup(fc.srv.Close)
	return fc
}

func (fc *fakeCore) accept(ctx context.Context) *coreConn {
	fc.t.Helper()
	select {
	case c := <-fc.conns:
		fc.t.Cleanup(func() { _ = c.ws.CloseNow() })
		return c
	case <-ctx.Done():
		fc.t.Fatal("no session dialled")
		return nil
	}
}

func (fc *fakeCore) signed(rev int64, key ed25519.PrivateKey) node.DesiredState {
	fc.t.Helper()
	d := node.DesiredState{Rev: rev, IssuedAt: time.Now().UTC().Truncate(time.Second), Term: 1,
		Spec: node.Spec{Workloads: []node.WorkloadSpec{{WorkloadID: "wl_a", Command: []string{"./app"}, DesiredStatus: node.DesiredRunning}}}}
	if err := node.Sign(&d, key); err != nil {
		fc.t.Fatal(err)
	}
	return d
}

func (c *coreConn) send(ctx context.Context, typ node.Type, id string, body any) {
	c.t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	frame, _ := json.Marshal(node.Envelope{V: 1, Type: typ, ID: id, Body: raw})
	if err := c.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		c.t.Fatal(err)
	}
}

func (c *coreConn) read(ctx context.Context) node.Envelope {
	c.t.Helper()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("core read: %v", err)
	}
	var env node.Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		c.t.Fatal(err)
	}
	return env
}

// await reads until a message of typ arrives, skipping heartbeats and status reports.
func (c *coreConn) await(ctx context.Context, typ node.Type) node.Envelope {
	c.t.Helper()
	for {
		env := c.read(ctx)
		if env.Type == typ {
			return env
		}
	}
}

type agentSide struct {
	client *Client
	store  *localstore.Store
	path   string
	stored chan int64
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, fc *fakeCore, mod func(*Config)) *agentSide {
	t.Helper()
	path := filepath.Join(t.TempDir(), localstore.FileName)
	st, err := localstore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	a := &agentSide{store: st, path: path, stored: make(chan int64, 8), done: make(chan error, 1)}
	cfg := Config{
		ServerURL:  fc.srv.URL,
		Credential: credential,
		ClusterKey: fc.pub,
		Store:      st,
		Hello: func(ctx context.Context) (node.Hello, error) {
			rev, err := st.StoredRev(ctx)
			return node.Hello{NodeID: "nod_test", StoredRev: rev, Drivers: []string{"process"}}, err
		},
		Status: func(context.Context) (node.StatusReport, error) {
			return node.StatusReport{Workloads: []node.WorkloadStatus{}}, nil
		},
		OnStored:   func(rev int64) { a.stored <- rev },
		BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		AgentVersion: "test",
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	a.client, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- a.client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-a.done
		_ = st.Close()
	})
	return a
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func handshake(ctx context.Context, t *testing.T, c *coreConn, hbMS int64) node.Hello {
	t.Helper()
	env := c.read(ctx)
	if env.Type != node.TypeHello {
		t.Fatalf("first message = %s, want hello", env.Type)
	}
	var h node.Hello
	if err := json.Unmarshal(env.Body, &h); err != nil {
		t.Fatal(err)
	}
	c.send(ctx, node.TypeWelcome, "msg_welcome", node.Welcome{ClusterID: "cls_1", Term: 1, HeartbeatIntervalMS: hbMS, SessionTimeoutMS: 15000})
	return h
}

func TestDesiredStatePersistedBeforeAck(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, nil)
	c := fc.accept(ctx)
	h := handshake(ctx, t, c, 60000)
	if h.NodeID != "nod_test" || h.StoredRev != 0 || h.AgentVersion != "test" {
		t.Fatalf("hello = %+v", h)
	}
	c.send(ctx, node.TypeDesiredState, "msg_ds5", fc.signed(5, fc.key))
	ack := c.await(ctx, node.TypeCommandResult)
	// Kill the agent right at the ack, then reopen its store.
	a.cancel()
	<-a.done
	a.done <- nil // for the cleanup
	if ack.Re != "msg_ds5" {
		t.Fatalf("ack re = %q", ack.Re)
	}
	var res node.CommandResult
	_ = json.Unmarshal(ack.Body, &res)
	if res.Status != "ok" || res.Detail != "stored rev 5" {
		t.Fatalf("ack = %+v", res)
	}
	if err := a.store.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := localstore.Open(context.Background(), a.path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	rev, raw, err := st.LatestSnapshot(ctx)
	if err != nil || rev != 5 {
		t.Fatalf("after reopen rev = %d %v", rev, err)
	}
	if _, err := node.Verify(raw, fc.pub); err != nil {
		t.Fatalf("stored body no longer verifies: %v", err)
	}
}

func TestBadSignatureAndStaleRev(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	c.send(ctx, node.TypeDesiredState, "msg_1", fc.signed(5, fc.key))
	c.await(ctx, node.TypeCommandResult)
	if rev := <-a.stored; rev != 5 {
		t.Fatalf("OnStored rev %d", rev)
	}

	_, other, _ := ed25519.GenerateKey(rand.Reader)
	c.send(ctx, node.TypeDesiredState, "msg_2", fc.signed(9, other))
	env := c.await(ctx, node.TypeError)
	var eb node.ErrorBody
	_ = json.Unmarshal(env.Body, &eb)
	if env.Re != "msg_2" || eb.Code != "bad_signature" || eb.Fatal {
		t.Fatalf("error = %+v %+v", env, eb)
	}
	// A tampered body fails too.
	d := fc.signed(10, fc.key)
	d.Rev = 11
	c.send(ctx, node.TypeDesiredState, "msg_3", d)
	if env := c.await(ctx, node.TypeError); env.Re != "msg_3" {
		t.Fatalf("tampered answer re = %q", env.Re)
	}

	c.send(ctx, node.TypeDesiredState, "msg_4", fc.signed(4, fc.key))
	env = c.await(ctx, node.TypeCommandResult)
	var res node.CommandResult
	_ = json.Unmarshal(env.Body, &res)
	if env.Re != "msg_4" || res.Status != "ok" || !strings.Contains(res.Detail, "ignored") {
		t.Fatalf("stale ack = %+v %+v", env, res)
	}
	if rev, _ := a.store.StoredRev(ctx); rev != 5 {
		t.Fatalf("stored rev = %d, want 5 (old snapshot kept)", rev)
	}
	select {
	case rev := <-a.stored:
		t.Fatalf("OnStored called for rejected rev %d", rev)
	default:
	}
}

func TestHeartbeatsAtTheWelcomeInterval(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	startAgent(t, fc, func(c *Config) { c.HeartbeatInterval = time.Hour })
	c := fc.accept(ctx)
	handshake(ctx, t, c, 10)
	// An hour-long default would send none; the welcome's 10 ms sends many.
	for i := 0; i < 3; i++ {
		env := c.await(ctx, node.TypeHeartbeat)
		var hb node.Heartbeat
		if err := json.Unmarshal(env.Body, &hb); err != nil || hb.Time.IsZero() {
			t.Fatalf("heartbeat body %s: %v", env.Body, err)
		}
	}
}

func TestStatusReportAfterWelcomeAndOnRequest(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	c.await(ctx, node.TypeStatusReport)
	a.client.ReportStatus()
	c.await(ctx, node.TypeStatusReport)
}

func TestPingUnknownAndOversize(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)

	c.send(ctx, "frobnicate", "msg_u", struct{}{})
	env := c.await(ctx, node.TypeError)
	var eb node.ErrorBody
	_ = json.Unmarshal(env.Body, &eb)
	if env.Re != "msg_u" || eb.Code != "bad_message" || eb.Fatal {
		t.Fatalf("unknown type answer = %+v %+v", env, eb)
	}

	big := make([]byte, node.MaxMessageBytes+10)
	for i := range big {
		big[i] = 'x'
	}
	if err := c.ws.Write(ctx, websocket.MessageText, big); err != nil {
		t.Fatal(err)
	}
	env = c.await(ctx, node.TypeError)
	_ = json.Unmarshal(env.Body, &eb)
	if eb.Code != "bad_message" || eb.Fatal {
		t.Fatalf("oversize answer = %+v", eb)
	}

	c.send(ctx, node.TypePing, "msg_p", struct{}{})
	if env := c.await(ctx, node.TypePong); env.Re != "msg_p" {
		t.Fatalf("pong re = %q", env.Re)
	}
}

func TestRedialAfterServerCloses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	c.send(ctx, node.TypeDesiredState, "msg_1", fc.signed(3, fc.key))
	c.await(ctx, node.TypeCommandResult)
	_ = c.ws.Close(websocket.StatusGoingAway, "restart")
	c2 := fc.accept(ctx)
	if h := handshake(ctx, t, c2, 60000); h.StoredRev != 3 {
		t.Fatalf("second hello stored_rev = %d, want 3", h.StoredRev)
	}
}

func TestFatalErrorStopsRedialling(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	a := startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	c.send(ctx, node.TypeError, "msg_e", node.ErrorBody{Code: "session_replaced", Message: "newer session", Fatal: true})
	select {
	case err := <-a.done:
		a.done <- err
		var fe *FatalError
		if !errors.As(err, &fe) || fe.Code != "session_replaced" {
			t.Fatalf("Run = %v, want FatalError session_replaced", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after a fatal error")
	}
}

func TestUnsupportedVersionKeepsDialling(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fc := newFakeCore(t)
	startAgent(t, fc, nil)
	c := fc.accept(ctx)
	handshake(ctx, t, c, 60000)
	c.send(ctx, node.TypeError, "msg_e", node.ErrorBody{Code: "unsupported_version", Message: "v2 only", Fatal: true})
	c2 := fc.accept(ctx)
	if env := c2.read(ctx); env.Type != node.TypeHello {
		t.Fatalf("first message after redial = %s", env.Type)
	}
}

func TestBackoffFullJitter(t *testing.T) {
	t.Parallel()
	var asked atomic.Int64
	c, err := New(Config{ServerURL: "http://x", Credential: "c", ClusterKey: make(ed25519.PublicKey, 32),
		Store: nopStore{}, Hello: func(context.Context) (node.Hello, error) { return node.Hello{}, nil },
		Status:     func(context.Context) (node.StatusReport, error) { return node.StatusReport{}, nil },
		RandInt63n: func(n int64) int64 { asked.Store(n); return n - 1 }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		attempt int
		ceil    time.Duration
	}{{0, time.Second}, {1, 2 * time.Second}, {2, 4 * time.Second}, {5, 32 * time.Second}, {6, time.Minute}, {40, time.Minute}} {
		attempt, ceil := tc.attempt, tc.ceil
		got := c.backoff(attempt)
		if time.Duration(asked.Load()) != ceil+1 || got != ceil {
			t.Errorf("attempt %d: drew from [0,%v), got %v; want ceiling %v", attempt, time.Duration(asked.Load()), got, ceil)
		}
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type nopStore struct{}

func (nopStore) StoreSnapshot(context.Context, int64, []byte, time.Time) (bool, error) {
	return false, nil
}
func (nopStore) StoredRev(context.Context) (int64, error) { return 0, nil }

func TestSessionURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://core:8080":      "ws://core:8080/api/v1/nodes/session",
		"https://core/":         "wss://core/api/v1/nodes/session",
		"https://core/base?x=1": "wss://core/base/api/v1/nodes/session",
		"wss://core":            "wss://core/api/v1/nodes/session",
	} {
		if got, err := sessionURL(in); err != nil || got != want {
			t.Errorf("sessionURL(%q) = %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := sessionURL("ftp://core"); err == nil {
		t.Error("ftp scheme accepted")
	}
}
