package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/internal/syncbuf"
	"github.com/berthhq/berth/nodeplugins/process"
	"github.com/berthhq/berth/sdk/client"
)

// workloadEnv makes the test binary act as an HTTP workload (see TestMain).
const workloadEnv = "BERTH_AGENT_TEST_WORKLOAD"

func TestMain(m *testing.M) {
	if os.Getenv(workloadEnv) == "http" {
		addr := net.JoinHostPort(os.Getenv("HOST"), os.Getenv("PORT"))
		err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = fmt.Fprintf(w, "%s %d", os.Getenv("BERTH_WORKLOAD_ID"), os.Getpid())
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

const (
	joinToken  = "brj_test_join"
	credential = "brn_test_credential_value"
)

// fakeCore stands for berthd (core/api enroll and core/session): it enrolls
// one node and serves its WebSocket session, handing each frame the node sends
// to the test.
type fakeCore struct {
	t       *testing.T
	srv     *httptest.Server
	key     ed25519.PrivateKey
	pub     ed25519.PublicKey
	frames  chan node.Envelope
	mu      sync.Mutex
	ws      *websocket.Conn
	enrolls []client.EnrollRequest
}

func newFakeCore(t *testing.T) *fakeCore {
	t.Helper()
	return startFakeCore(t, nil)
}

// startFakeCore serves the fake core over plain HTTP, or over TLS with
// cert when cert is not nil (cert is asked on every handshake).
func startFakeCore(t *testing.T, cert func() *tls.Certificate) *fakeCore {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fc := &fakeCore{t: t, key: priv, pub: pub, frames: make(chan node.Envelope, 1024)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/nodes/enroll", func(w http.ResponseWriter, r *http.Request) {
		var req client.EnrollRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.JoinToken != joinToken {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte(`{"title":"bad","status":422,"code":"join_token_expired"}`))
			return
		}
		fc.mu.Lock()
		fc.enrolls = append(fc.enrolls, req)
		fc.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(client.EnrollResponse{NodeID: "nod_test1", Credential: credential,
			ClusterPublicKey: base64.StdEncoding.EncodeToString(pub), ClusterID: "cls_1"})
	})
	mux.HandleFunc("GET /api/v1/nodes/session", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+credential {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(2 << 20)
		fc.mu.Lock()
		fc.ws = ws
		fc.mu.Unlock()
		ctx := r.Context()
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			var env node.Envelope
			if json.Unmarshal(data, &env) == nil {
				if env.Type == node.TypeHello {
					fc.send(ctx, node.TypeWelcome, node.Welcome{ClusterID: "cls_1", Term: 1, HeartbeatIntervalMS: 50, SessionTimeoutMS: 15000})
				}
				fc.frames <- env
			}
		}
	})
	if cert == nil {
		fc.srv = httptest.NewServer(mux)
	} else {
		fc.srv = httptest.NewUnstartedServer(mux)
		fc.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert()},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				return &tls.Config{Certificates: []tls.Certificate{*cert()}}, nil
			}}
		fc.srv.StartTLS()
	}
	t.Cleanup(fc.srv.Close)
	return fc
}

func (fc *fakeCore) send(ctx context.Context, typ node.Type, body any) {
	raw, _ := json.Marshal(body)
	frame, _ := json.Marshal(node.Envelope{V: 1, Type: typ, ID: "msg_" + string(typ), Body: raw})
	fc.mu.Lock()
	ws := fc.ws
	fc.mu.Unlock()
	if ws != nil {
		_ = ws.Write(ctx, websocket.MessageText, frame)
	}
}

func (fc *fakeCore) desire(ctx context.Context, rev int64, specs ...node.WorkloadSpec) {
	fc.t.Helper()
	d := node.DesiredState{Rev: rev, IssuedAt: time.Now().UTC().Truncate(time.Second), Term: 1,
		Spec: node.Spec{Workloads: append([]node.WorkloadSpec{}, specs...), Routes: []node.RouteSpec{}}}
	if err := node.Sign(&d, fc.key); err != nil {
		fc.t.Fatal(err)
	}
	fc.send(ctx, node.TypeDesiredState, d)
}

// awaitStatus reads frames until a status report satisfies ok.
func (fc *fakeCore) awaitStatus(ctx context.Context, what string, ok func(node.StatusReport) bool) node.StatusReport {
	fc.t.Helper()
	for {
		select {
		case env := <-fc.frames:
			if env.Type != node.TypeStatusReport {
				continue
			}
			var rep node.StatusReport
			if err := json.Unmarshal(env.Body, &rep); err != nil {
				fc.t.Fatal(err)
			}
			if ok(rep) {
				return rep
			}
		case <-ctx.Done():
			fc.t.Fatalf("no status report with %s", what)
		}
	}
}

func (fc *fakeCore) awaitType(ctx context.Context, typ node.Type) node.Envelope {
	fc.t.Helper()
	for {
		select {
		case env := <-fc.frames:
			if env.Type == typ {
				return env
			}
		case <-ctx.Done():
			fc.t.Fatalf("no %s", typ)
		}
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func testLogger(buf *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

func TestEnroll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fc := newFakeCore(t)
	dir := filepath.Join(t.TempDir(), "agent")
	var logs syncbuf.Buffer
	cfg := EnrollConfig{Server: fc.srv.URL, JoinToken: joinToken, DataDir: dir, Labels: map[string]string{"zone": "a"},
		Region: "eu", Hostname: "node-1", Logger: testLogger(&logs)}
	id, err := Enroll(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if id != "nod_test1" {
		t.Fatalf("node id = %q", id)
	}
	req := fc.enrolls[0]
	if pk, err := base64.StdEncoding.DecodeString(req.PublicKey); err != nil || len(pk) != ed25519.PublicKeySize {
		t.Errorf("public key %q: %v", req.PublicKey, err)
	}
	if req.Address != "127.0.0.1" || req.Hostname != "node-1" || req.Region != "eu" || req.Labels["zone"] != "a" || req.Capacity.CPUs < 1 {
		t.Errorf("enroll request = %+v", req)
	}
	for path, mode := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, KeyFileName): 0o600, filepath.Join(dir, localstore.FileName): 0o600} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v %v, want %v", path, fi.Mode().Perm(), err, mode)
		}
	}
	st, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	ident, err := st.Identity(ctx)
	_ = st.Close()
	if err != nil || ident.Credential != credential || ident.ServerURL != fc.srv.URL || ident.NodeID != "nod_test1" {
		t.Fatalf("identity = %+v %v", ident, err)
	}
	if _, err := Enroll(ctx, cfg); !errors.Is(err, localstore.ErrAlreadyEnrolled) {
		t.Fatalf("second enroll = %v, want ErrAlreadyEnrolled", err)
	}
	if strings.Contains(logs.String(), credential) || strings.Contains(logs.String(), joinToken) {
		t.Fatal("a secret reached the log")
	}
	if _, err := Enroll(ctx, EnrollConfig{Server: fc.srv.URL, JoinToken: "brj_wrong", DataDir: t.TempDir()}); err == nil {
		t.Fatal("enroll with a wrong token succeeded")
	}
}

func TestNewRefusesUnenrolled(t *testing.T) {
	t.Parallel()
	drv, err := process.New(process.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = drv.Close() }()
	_, err = New(Config{DataDir: t.TempDir(), Driver: drv})
	if !errors.Is(err, localstore.ErrNotEnrolled) {
		t.Fatalf("New = %v, want ErrNotEnrolled", err)
	}
}
