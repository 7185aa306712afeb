package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/provider"
)

// pluginEnv makes the test binary serve echoGateway as a plugin process.
const pluginEnv = "BERTH_SDK_PROVIDER_TEST_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(pluginEnv) != "" {
		provider.Serve(echoGateway{})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// echoGateway stands for a real gateway: it refuses negative revisions and
// otherwise reports the table it received back in its error text, so the test
// sees exactly what crossed the wire.
type echoGateway struct{}

func (echoGateway) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{Name: "echo", Version: "0.0.1", APIVersions: []int{provider.APIVersion}, Capabilities: []string{"http"}}, nil
}

func (echoGateway) SetRoutes(_ context.Context, t routes.Table) error {
	if t.Revision >= 0 {
		return nil
	}
	raw, _ := json.Marshal(t)
	return fmt.Errorf("echo:%s", raw)
}

func TestGatewayRoundTrip(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), pluginEnv+"=1")
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  provider.HandshakeConfig(),
		VersionedPlugins: provider.GatewayPluginSets(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	raw, err := rpc.Dispense(provider.GatewayPluginName)
	if err != nil {
		t.Fatalf("dispense: %v", err)
	}
	g := raw.(provider.Gateway)
	ctx := context.Background()

	d, err := g.Describe(ctx)
	if err != nil || d.Name != "echo" || d.Version != "0.0.1" || len(d.Capabilities) != 1 || d.APIVersions[0] != provider.APIVersion {
		t.Fatalf("Describe = %+v, %v", d, err)
	}
	if err := g.SetRoutes(ctx, routes.Table{Revision: 3}); err != nil {
		t.Fatalf("SetRoutes: %v", err)
	}
	table := routes.Table{Revision: -1, Routes: []routes.Route{{
		Hostname: "a.example", Project: "prj_1", Service: "web",
		Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: "127.0.0.1:9", Healthy: true}, {WorkloadID: "wl_2", Address: "127.0.0.1:10"}},
	}}}
	err = g.SetRoutes(ctx, table)
	var re *provider.RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("SetRoutes err = %v, want a RemoteError", err)
	}
	want, _ := json.Marshal(table)
	if re.Message != "echo:"+string(want) {
		t.Fatalf("table after the wire:\n got %s\nwant echo:%s", re.Message, want)
	}
}
