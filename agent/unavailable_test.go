package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/internal/syncbuf"
)

// TestSessionUnavailableKeepsCredential pins the agent's side of a core whose store is away: its
// session dials answered 503 unavailable (docs/node-protocol.md section 3.1) leave the enrolled
// credential as it was, enroll nothing, and the agent keeps redialling until the core lets it in.
func TestSessionUnavailableKeepsCredential(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fc := newFakeCore(t)
	const refusals = 3
	var refused atomic.Int32
	core := fc.srv.Config.Handler
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/nodes/session" && refused.Load() < refusals {
			refused.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"title":"Service Unavailable","status":503,"code":"unavailable"}`))
			return
		}
		core.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	dir := filepath.Join(t.TempDir(), "agent")
	if _, err := Enroll(ctx, EnrollConfig{Server: front.URL, JoinToken: joinToken, DataDir: dir, Hostname: "node-1"}); err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	stop := runAgent(t, dir, &logs)
	fc.awaitType(ctx, node.TypeHello)
	stop()

	if n := refused.Load(); n != refusals {
		t.Fatalf("%d dials answered 503, want %d before the session", n, refusals)
	}
	fc.mu.Lock()
	enrolls := len(fc.enrolls)
	fc.mu.Unlock()
	if enrolls != 1 {
		t.Fatalf("%d enrollments, want the one of the test", enrolls)
	}
	st, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
	if err != nil {
		t.Fatal(err)
	}
	ident, err := st.Identity(ctx)
	_ = st.Close()
	if err != nil || ident.Credential != credential || ident.NodeID != "nod_test1" {
		t.Fatalf("identity after 503s = %+v %v, want the enrolled credential kept", ident, err)
	}
}
