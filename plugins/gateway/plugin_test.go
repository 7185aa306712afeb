package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

// Samples are two route tables, as the conformance suite needs them.
func samples(t *testing.T) [2]provider.Resource {
	t.Helper()
	mk := func(rev int64, addr string) provider.Resource {
		raw, err := json.Marshal(routes.Table{Revision: rev, Routes: []routes.Route{{
			Hostname: "app.test", Project: "prj_1", Service: "web",
			Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: addr, Healthy: true}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
	}
	return [2]provider.Resource{mk(1, "127.0.0.1:9"), mk(2, "127.0.0.1:10")}
}

// TestConformance runs the provider suite on the gateway in process (over
// real gRPC, with a proxy it can inspect) and as the built binary.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("in-process", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Factory: func(string) (provider.Provider, error) {
				return gateway.NewPlugin(gateway.NewProxy(slog.New(slog.NewTextHandler(io.Discard, nil)))), nil
			},
			Samples: samples(t),
		})
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-gateway")
		if os.Getenv("BERTH_BIN_DIR") == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-gateway")
		}
		conformance.RunProvider(t, conformance.ProviderConfig{
			Binary:  bin,
			Args:    func(string) []string { return []string{"--listen", "127.0.0.1:0"} },
			Samples: samples(t),
		})
	})
}

// TestGatewayConformance runs the gateway cases (docs/plugins.md section
// 6.3) on the built binary: real HTTP through its listener to real upstreams.
func TestGatewayConformance(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-gateway")
	if os.Getenv("BERTH_BIN_DIR") == "" {
		bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-gateway")
	}
	conformance.RunGateway(t, conformance.GatewayConfig{
		Binary: bin,
		Args:   func(stateDir, listen string) []string { return []string{"--listen", listen, "--state-dir", stateDir} },
	})
}

// TestGatewayConformanceFailsAStickyGateway: a gateway that never withdraws a
// host (internal/sticky) fails exactly gateway_swap_withdraws.
func TestGatewayConformanceFailsAStickyGateway(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/plugins/gateway/internal/sticky")
	rep, err := conformance.CheckGateway(t.Context(), conformance.GatewayConfig{
		Binary: bin,
		Args:   func(_, listen string) []string { return []string{"--listen", listen} },
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Failed(); len(got) != 1 || got[0] != "gateway_swap_withdraws" {
		var b strings.Builder
		_ = rep.WriteText(&b)
		t.Fatalf("failed cases %v, want exactly gateway_swap_withdraws:\n%s", got, b.String())
	}
}

// TestPlanRefusesUnroutableTables: the gateway refuses a table it cannot
// honour (unknown TLS mode, an allow_sources entry that is not a prefix)
// with validation_failed, so the host keeps the table in force.
func TestPlanRefusesUnroutableTables(t *testing.T) {
	t.Parallel()
	p := gateway.NewPlugin(gateway.NewProxy(nil))
	for name, r := range map[string]routes.Route{
		"tls mode":      {Hostname: "a.test", TLSMode: "https"},
		"allow sources": {Hostname: "a.test", AllowSources: []string{"10.0.0.1/8"}},
	} {
		raw, err := json.Marshal(routes.Table{Revision: 1, Routes: []routes.Route{r}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Plan(context.Background(), &provider.PlanRequest{Desired: provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}})
		if abierrors.CodeOf(err) != abierrors.ValidationFailed {
			t.Errorf("%s: plan answered %v, want validation_failed", name, err)
		}
	}
}

// TestOpenPluginKeepsStateAcrossRestarts: with a state directory, the
// applied table is stored (0600) and a gateway opened again on it serves that
// table at once and still refuses a fencing token lower than the last one it
// admitted; Delete removes the stored table (docs/plugins.md section 5.3).
func TestOpenPluginKeepsStateAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	p, err := gateway.OpenPlugin(gateway.NewProxy(nil), dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := p.Describe(ctx); err != nil || !d.Capabilities.DurableState {
		t.Fatalf("Describe = %+v, %v; want DurableState", d, err)
	}
	s := samples(t)
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: s[1]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: "k2", FencingToken: 7}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "routes.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored table: %v, %v; want a 0600 file", fi, err)
	}

	proxy := gateway.NewProxy(nil)
	again, err := gateway.OpenPlugin(proxy, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := proxy.Table(); got.Revision != 2 || len(got.Routes) != 1 || got.Routes[0].Upstreams[0].Address != "127.0.0.1:10" {
		t.Fatalf("table after reopening = %+v, want the stored revision 2", got)
	}
	if r, err := again.Read(ctx, &provider.ReadRequest{Type: routes.ResourceType, ID: routes.ResourceID}); err != nil || !r.State.Equal(plan.Planned) {
		t.Fatalf("Read after reopening = %+v, %v", r, err)
	}
	plan1, err := again.Plan(ctx, &provider.PlanRequest{Desired: s[0]})
	if err != nil {
		t.Fatal(err)
	}
	_, err = again.Apply(ctx, &provider.ApplyRequest{Planned: plan1.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 6}})
	if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Fatalf("Apply with a lower token after reopening = %v, want stale fencing token", err)
	}
	if got := proxy.Table(); got.Revision != 2 {
		t.Fatalf("a refused Apply changed the table to %+v", got)
	}
	if _, err := again.Delete(ctx, &provider.DeleteRequest{Type: routes.ResourceType, ID: routes.ResourceID, Mutation: pluginapi.Mutation{IdempotencyKey: "k3", FencingToken: 8}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "routes.json")); !os.IsNotExist(err) {
		t.Fatalf("stored table after Delete: %v", err)
	}
}

// TestOpenPluginRefusesACorruptTable: a stored table that does not decode
// stops the gateway from starting rather than serving nothing.
func TestOpenPluginRefusesACorruptTable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "routes.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.OpenPlugin(gateway.NewProxy(nil), dir); err == nil {
		t.Fatal("OpenPlugin accepted a corrupt stored table")
	}
}

// TestWatchStateDir: removing the state directory, replacing it with
// another one, or a second gateway marking it is reported once.
func TestWatchStateDir(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"remove", "replace", "take over"} {
		dir := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		got := make(chan string, 2)
		if err := gateway.WatchStateDir(ctx, dir, 10*time.Millisecond, func(reason string) { got <- reason }); err != nil {
			t.Fatal(err)
		}
		switch how {
		case "remove", "replace":
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if how == "replace" {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
		case "take over":
			if err := gateway.WatchStateDir(ctx, dir, time.Hour, func(string) {}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case r := <-got:
			if !strings.Contains(r, dir) {
				t.Errorf("reason %q does not name the directory", r)
			}
		case <-ctx.Done():
			t.Fatalf("%s: the watch never reported", how)
		}
	}
}
