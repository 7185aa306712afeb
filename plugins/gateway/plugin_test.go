package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

func testTable() routes.Table {
	return routes.Table{Revision: 7, Routes: []routes.Route{{
		Hostname: "app.test", Project: "prj_1", Service: "web",
		Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:9", Healthy: true}},
	}}}
}

// TestPluginModes runs the adapter in process and over a real gRPC connection
// (go-plugin's in-memory test connection); the subprocess mode is covered by
// host/plugin's tests of the berth-plugin-gateway binary.
func TestPluginModes(t *testing.T) {
	modes := map[string]func(t *testing.T, impl provider.Gateway) provider.Gateway{
		"in-process": func(_ *testing.T, impl provider.Gateway) provider.Gateway { return impl },
		"grpc": func(t *testing.T, impl provider.Gateway) provider.Gateway {
			client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
				provider.GatewayPluginName: &provider.GatewayGRPCPlugin{Impl: impl},
			})
			t.Cleanup(func() { client.Close() })
			raw, err := client.Dispense(provider.GatewayPluginName)
			if err != nil {
				t.Fatalf("dispense: %v", err)
			}
			return raw.(provider.Gateway)
		},
	}
	for name, connect := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			proxy := gateway.NewProxy(slog.New(slog.NewTextHandler(io.Discard, nil)))
			g := connect(t, gateway.NewPlugin(proxy))
			ctx := context.Background()

			d, err := g.Describe(ctx)
			if err != nil || d.Name != "gateway" || d.Version != gateway.Version || !reflect.DeepEqual(d.APIVersions, []int{provider.APIVersion}) {
				t.Fatalf("Describe = %+v, %v", d, err)
			}
			want := testTable()
			if err := g.SetRoutes(ctx, want); err != nil {
				t.Fatalf("SetRoutes: %v", err)
			}
			if got := proxy.Table(); !reflect.DeepEqual(got, want) {
				t.Fatalf("proxy table = %+v, want %+v", got, want)
			}
		})
	}
}

func TestSetRoutesCancelled(t *testing.T) {
	t.Parallel()
	proxy := gateway.NewProxy(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := gateway.NewPlugin(proxy).SetRoutes(ctx, testTable()); err == nil {
		t.Fatal("SetRoutes with a cancelled ctx succeeded")
	}
	if got := proxy.Table(); got.Revision != 0 {
		t.Fatalf("table applied despite the cancelled ctx: %+v", got)
	}
}
