// Package provider is what a provider-plugin author links: the Go contract of
// a provider (re-exported from abi/provider), Serve, and the guard helpers (docs/plugins.md section 4).
package provider

import (
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/sdk/internal/serve"
)

// The contract, re-exported so a plugin author imports one package. See
// [abiprovider.Provider] for the lifecycle and obligations.
type (
	Provider               = abiprovider.Provider
	Configurer             = abiprovider.Configurer
	DescribeResponse       = abiprovider.DescribeResponse
	Capabilities           = abiprovider.Capabilities
	ResourceType           = abiprovider.ResourceType
	Resource               = abiprovider.Resource
	ConfigRequest          = abiprovider.ConfigRequest
	ValidateConfigResponse = abiprovider.ValidateConfigResponse
	PlanRequest            = abiprovider.PlanRequest
	PlanResponse           = abiprovider.PlanResponse
	ApplyRequest           = abiprovider.ApplyRequest
	ApplyResponse          = abiprovider.ApplyResponse
	ReadRequest            = abiprovider.ReadRequest
	ReadResponse           = abiprovider.ReadResponse
	DeleteRequest          = abiprovider.DeleteRequest
	DeleteResponse         = abiprovider.DeleteResponse
	Mutation               = pluginapi.Mutation
	HealthReport           = pluginapi.HealthReport
	HealthState            = pluginapi.HealthState
)

// APIVersion is [abiprovider.APIVersion].
const APIVersion = abiprovider.APIVersion

// ErrNotFound is [abiprovider.ErrNotFound]: wrap it when Read finds nothing.
var ErrNotFound = abiprovider.ErrNotFound

// PluginSets returns go-plugin's versioned plugin sets serving p, one per
// contract version this package speaks.
func PluginSets(p Provider) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersion: {pluginapi.ProviderPluginName: &serve.ServerPlugin{Register: func(s *grpc.Server) {
			providerv1.RegisterProviderServer(s, abiprovider.NewServer(p))
		}}},
	}
}

// Serve runs p as a go-plugin gRPC plugin process and returns when the host
// closes the plugin. It is the whole body of a provider's main function after
// flag parsing. Log through NewLogger(os.Stderr), created before Serve:
// go-plugin replaces os.Stdout and os.Stderr while serving. The process exits
// by itself when its host dies.
func Serve(p Provider) {
	serve.Serve(pluginapi.ProviderCookieValue, PluginSets(p))
}

// ServeDetachable is [Serve] for a provider that outlives its host: the
// process keeps running (and serving whatever it serves on its own) when the
// host dies or lets it go, and the next host reattaches to it
// (docs/plugins.md section 2.8). The plugin must then ignore SIGPIPE, since
// the stderr pipe it logs to ends with the host, and stop by itself only
// when told to (go-plugin's shutdown, or a signal). The host must launch it
// with host/plugin Config.ReattachPath.
func ServeDetachable(p Provider) {
	serve.ServeDetachable(pluginapi.ProviderCookieValue, PluginSets(p))
}
