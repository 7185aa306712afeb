package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
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
