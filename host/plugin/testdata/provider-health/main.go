// Command provider-health is a test plugin of host/plugin: the hello example
// provider with a Health stream driven from outside, so a test can make a real
// plugin process unhealthy on command. SIGUSR1 makes it report unhealthy,
// SIGUSR2 healthy again; it starts healthy. With --no-health its gRPC server
// answers Health with Unimplemented, as a plugin built without the SDK's
// health support would.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthhq/berth/abi/pluginapi"
	pluginv1 "github.com/berthhq/berth/abi/proto/plugin/v1"
	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/examples/provider-hello/hello"
)

// onCommand is hello whose health follows SIGUSR1 (unhealthy) and SIGUSR2 (healthy).
type onCommand struct {
	*hello.Provider
	unhealthy atomic.Bool
}

func (p *onCommand) report() pluginapi.HealthReport {
	if p.unhealthy.Load() {
		return pluginapi.HealthReport{State: pluginapi.Unhealthy, Description: "told to be unhealthy (SIGUSR1)"}
	}
	return pluginapi.HealthReport{State: pluginapi.Healthy}
}

// Health implements pluginapi.HealthReporter.
func (p *onCommand) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	out := make(chan pluginapi.HealthReport, 1)
	out <- p.report()
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-sig:
				p.unhealthy.Store(s == syscall.SIGUSR1)
				select {
				case out <- p.report():
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// noHealth is a provider server whose Health is not implemented.
type noHealth struct{ providerv1.ProviderServer }

func (noHealth) Health(*pluginv1.HealthRequest, grpc.ServerStreamingServer[pluginv1.HealthReport]) error {
	return status.Error(codes.Unimplemented, "method Health not implemented")
}

// serverPlugin registers the provider service on go-plugin's gRPC server.
type serverPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	srv providerv1.ProviderServer
}

func (p *serverPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterProviderServer(s, p.srv)
	return nil
}

func (p *serverPlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, fmt.Errorf("provider-health serves only")
}

func main() {
	stateDir := flag.String("state-dir", "", "directory of the plugin's state (required)")
	without := flag.Bool("no-health", false, "answer Health with gRPC Unimplemented")
	flag.Parse()
	h, err := hello.New(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "provider-health: %v\n", err)
		os.Exit(1)
	}
	srv := abiprovider.NewServer(&onCommand{Provider: h})
	if *without {
		srv = noHealth{srv}
	}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: goplugin.HandshakeConfig{MagicCookieKey: pluginapi.MagicCookieKey, MagicCookieValue: pluginapi.ProviderCookieValue},
		VersionedPlugins: map[int]goplugin.PluginSet{
			abiprovider.APIVersion: {pluginapi.ProviderPluginName: &serverPlugin{srv: srv}},
		},
		GRPCServer: goplugin.DefaultGRPCServer,
	})
}
