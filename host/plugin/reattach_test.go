package plugin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/host/plugin"
)

// TestGatewayReattach: a gateway launched with a reattach record keeps
// serving after its handle detaches, the next handle reconnects to the same
// process and drives it, and a recorded process that no longer runs the
// pinned binary (an upgrade) is replaced by a new one, which serves the table
// it stored before any Apply (docs/plugins.md section 2.8).
func TestGatewayReattach(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	upstream := func(body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return strings.TrimPrefix(s.URL, "http://")
	}
	a, b := upstream("a"), upstream("b")
	dir := t.TempDir()
	bin := filepath.Join(dir, "berth-plugin-gateway")
	raw, err := os.ReadFile(filepath.Join(binDir, "berth-plugin-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cfg := plugin.Config{
		Name: "gateway", Path: bin, SHA256: sha256File(t, bin),
		Args:         []string{"--listen", addr, "--state-dir", filepath.Join(dir, "state")},
		PidDir:       dir,
		ReattachPath: filepath.Join(dir, "gateway.reattach.json"),
		Logger:       logger,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	launch := func(cfg plugin.Config) *plugin.Provider {
		t.Helper()
		g, err := plugin.LaunchProvider(ctx, cfg)
		if err != nil {
			t.Fatalf("LaunchProvider: %v", err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	table := func(rev int64, up string) routes.Table {
		return routes.Table{Revision: rev, Routes: []routes.Route{{Hostname: "app.test", Project: "prj_1", Service: "web",
			Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: up, Healthy: true}}}}}
	}
	wantBody := func(want string) {
		t.Helper()
		if code, body, err := get(addr, "app.test"); err != nil || code != http.StatusOK || body != want {
			t.Fatalf("GET through the gateway = %d %q, %v; want 200 %q", code, body, err, want)
		}
	}

	g := launch(cfg)
	pid := g.PID()
	if fi, err := os.Stat(cfg.ReattachPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("reattach record: %v, %v; want a 0600 file", fi, err)
	}
	if err := applyTable(ctx, g, table(1, a)); err != nil {
		t.Fatal(err)
	}
	wantBody("a")

	g.Detach()
	g.Close() // after Detach: leaves the process and its record alone
	if !processAlive(pid) {
		t.Fatalf("gateway %d ended with its handle", pid)
	}
	wantBody("a")

	g2 := launch(cfg)
	if g2.PID() != pid {
		t.Fatalf("second handle runs pid %d, want the reattached %d", g2.PID(), pid)
	}
	if st := g2.Status(); st.APIVersion != 1 || st.State != plugin.StateRunning {
		t.Fatalf("reattached status = %+v", st)
	}
	if err := applyTable(ctx, g2, table(2, b)); err != nil {
		t.Fatal(err)
	}
	wantBody("b")
	g2.Detach()

	// An upgrade: the binary at Path is replaced and pinned anew. The
	// recorded process runs the old binary, so it is replaced.
	if err := os.WriteFile(bin+".new", append(raw, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	cfg.SHA256 = sha256File(t, bin)
	g3 := launch(cfg)
	if g3.PID() == pid || processAlive(pid) {
		t.Fatalf("after an upgrade pid %d (old %d alive: %v); want a new process and the old one gone", g3.PID(), pid, processAlive(pid))
	}
	wantBody("b") // the stored table, before any Apply
	cur := g3.PID()
	if err := g3.Close(); err != nil {
		t.Fatal(err)
	}
	if processAlive(cur) {
		t.Fatalf("gateway %d alive after Close", cur)
	}
	if _, err := os.Stat(cfg.ReattachPath); !os.IsNotExist(err) {
		t.Fatalf("reattach record after Close: %v; want it removed", err)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL) // in case a check above failed
}
