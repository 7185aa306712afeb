package runtime

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/sdk/internal/orphan"

	runtimev1 "github.com/berthhq/berth/abi/proto/runtime/v1"
)

// Handshake values a host and a driver plugin must agree on before any call.
// The host sets the environment variable MagicCookieKey to MagicCookieValue
// when it launches a driver; a binary started without it prints a short notice
// and exits 1 (it is not meant to be run by hand).
const (
	MagicCookieKey   = "BERTH_PLUGIN"
	MagicCookieValue = "berth-runtime-driver-3c9d2a71"
)

// PluginName is the name of the driver in go-plugin's plugin set.
const PluginName = "runtime-driver"

// HandshakeConfig returns the go-plugin handshake of runtime drivers. Protocol
// versions are negotiated through the plugin sets keyed by APIVersion, so the
// ProtocolVersion field is left zero.
func HandshakeConfig() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{MagicCookieKey: MagicCookieKey, MagicCookieValue: MagicCookieValue}
}

// PluginSets returns go-plugin's versioned plugin sets for a driver: one set per
// contract version this package speaks, keyed by version. impl is nil on the
// host side.
func PluginSets(impl Driver) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersion: {PluginName: &GRPCPlugin{Impl: impl}},
	}
}

// Serve runs d as a go-plugin gRPC plugin process and returns when the host
// closes the plugin. It is the whole body of a driver's main function, after
// flag parsing:
//
//	func main() {
//		d, err := process.New(process.Config{StateDir: *stateDir, Logger: runtime.NewLogger(os.Stderr)})
//		...
//		runtime.Serve(d)
//	}
//
// The driver's logs must go to the process's stderr as created before Serve is
// called (use NewLogger(os.Stderr)): the host re-emits those lines in its own log.
// go-plugin replaces os.Stdout and os.Stderr while serving.
func Serve(d Driver) {
	// A host killed with SIGKILL cannot stop its plugins: exit with it.
	orphan.Watch(context.Background(), nil)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  HandshakeConfig(),
		VersionedPlugins: PluginSets(d),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name:       "go-plugin",
			Level:      hclog.Info,
			Output:     os.Stderr,
			JSONFormat: true,
		}),
	})
}

// GRPCPlugin is the go-plugin glue of a driver: on the plugin side it
// registers Impl as the RuntimeDriver gRPC service, on the host side it returns
// a *GRPCClient. Impl is nil on the host side.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Driver
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the RuntimeDriver service serving p.Impl.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	runtimev1.RegisterRuntimeDriverServer(s, &grpcServer{impl: p.Impl})
	return nil
}

// GRPCClient returns a *GRPCClient over conn. ctx is go-plugin's lifetime
// context of the plugin process: it is cancelled when the process has exited.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (interface{}, error) {
	return NewGRPCClient(ctx, conn), nil
}
