package provider

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/sdk/internal/orphan"

	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
)

// Handshake values a host and a provider plugin must agree on before any call.
// The host sets the environment variable MagicCookieKey to MagicCookieValue
// when it launches a provider; a binary started without it prints a short
// notice and exits 1.
const (
	MagicCookieKey   = "BERTH_PLUGIN"
	MagicCookieValue = "berth-provider-8e41b6f0"
)

// GatewayPluginName is the name of the gateway in go-plugin's plugin set.
const GatewayPluginName = "gateway"

// HandshakeConfig returns the go-plugin handshake of provider plugins. Protocol
// versions are negotiated through the plugin sets keyed by APIVersion.
func HandshakeConfig() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{MagicCookieKey: MagicCookieKey, MagicCookieValue: MagicCookieValue}
}

// GatewayPluginSets returns go-plugin's versioned plugin sets for a gateway,
// keyed by contract version. impl is nil on the host side.
func GatewayPluginSets(impl Gateway) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersion: {GatewayPluginName: &GatewayGRPCPlugin{Impl: impl}},
	}
}

// Serve runs g as a go-plugin gRPC plugin process and returns when the host
// closes the plugin. It is the whole body of a gateway's main function after
// flag parsing and listening. Log through NewLogger(os.Stderr), created before
// Serve: go-plugin replaces os.Stdout and os.Stderr while serving.
func Serve(g Gateway) {
	// A host killed with SIGKILL cannot stop its plugins: exit with it.
	orphan.Watch(context.Background(), nil)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  HandshakeConfig(),
		VersionedPlugins: GatewayPluginSets(g),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name:       "go-plugin",
			Level:      hclog.Info,
			Output:     os.Stderr,
			JSONFormat: true,
		}),
	})
}

// GatewayGRPCPlugin is the go-plugin glue of a gateway: on the plugin side it
// registers Impl as the Gateway gRPC service, on the host side it returns a
// *GatewayGRPCClient. Impl is nil on the host side.
type GatewayGRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Gateway
}

var _ plugin.GRPCPlugin = (*GatewayGRPCPlugin)(nil)

// GRPCServer registers the Gateway service serving p.Impl.
func (p *GatewayGRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterGatewayServer(s, &gatewayServer{impl: p.Impl})
	return nil
}

// GRPCClient returns a *GatewayGRPCClient over conn. ctx is go-plugin's
// lifetime context of the plugin process: cancelled when the process has exited.
func (p *GatewayGRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (interface{}, error) {
	return NewGatewayGRPCClient(ctx, conn), nil
}
