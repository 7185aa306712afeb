// Package serve is the go-plugin plumbing shared by sdk/provider and
// sdk/runtime: the handshake, the plugin's own logger and the orphan watch.
package serve

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/sdk/internal/orphan"
)

// Handshake returns go-plugin's handshake for a plugin kind's cookie value.
// Protocol versions are negotiated through the versioned plugin sets.
func Handshake(cookie string) plugin.HandshakeConfig {
	return plugin.HandshakeConfig{MagicCookieKey: pluginapi.MagicCookieKey, MagicCookieValue: cookie}
}

// Serve runs a go-plugin gRPC server with sets until the host closes it. A
// host killed with SIGKILL cannot stop its plugins: the orphan watch ends
// the process when its parent changes.
func Serve(cookie string, sets map[int]plugin.PluginSet) {
	orphan.Watch(context.Background(), nil)
	ServeDetachable(cookie, sets)
}

// ServeDetachable is Serve without the orphan watch, for a plugin that keeps
// running when its host dies and is reattached by the next host
// (docs/plugins.md section 2.8).
func ServeDetachable(cookie string, sets map[int]plugin.PluginSet) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake(cookie),
		VersionedPlugins: sets,
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name:       "go-plugin",
			Level:      hclog.Info,
			Output:     os.Stderr,
			JSONFormat: true,
		}),
	})
}

// ServerPlugin is go-plugin glue that only serves: register adds the service
// to the gRPC server. Its client side is the host's (host/plugin).
type ServerPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Register func(*grpc.Server)
}

// GRPCServer registers the service.
func (p *ServerPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	p.Register(s)
	return nil
}

// GRPCClient is not used by a plugin process.
func (p *ServerPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (interface{}, error) {
	return nil, errServerOnly
}

type serverOnly struct{}

func (serverOnly) Error() string { return "berth: the plugin side of the glue has no client" }

var errServerOnly = serverOnly{}
