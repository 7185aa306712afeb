// Package runtime is what a runtime-driver author links: the Go contract of a
// driver (re-exported from abi/runtime), Serve, and the guard helpers (docs/plugins.md section 3).
package runtime

import (
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
	runtimev1 "github.com/berthhq/berth/abi/proto/runtime/v1"
	abiruntime "github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/sdk/internal/serve"
)

// The contract, re-exported so a driver author imports one package. See
// [abiruntime.Driver] for the lifecycle and obligations.
type (
	Driver             = abiruntime.Driver
	LogStreamer        = abiruntime.LogStreamer
	StatsReporter      = abiruntime.StatsReporter
	DescribeResponse   = abiruntime.DescribeResponse
	Capabilities       = abiruntime.Capabilities
	Handle             = abiruntime.Handle
	StartRequest       = abiruntime.StartRequest
	StartResponse      = abiruntime.StartResponse
	RegistryCredential = abiruntime.RegistryCredential
	StopMode           = abiruntime.StopMode
	StopRequest        = abiruntime.StopRequest
	StopResponse       = abiruntime.StopResponse
	InspectRequest     = abiruntime.InspectRequest
	RecoverRequest     = abiruntime.RecoverRequest
	LogsRequest        = abiruntime.LogsRequest
	StatsRequest       = abiruntime.StatsRequest
	Stats              = abiruntime.Stats
	WorkloadState      = abiruntime.WorkloadState
	Mutation           = pluginapi.Mutation
	HealthReport       = pluginapi.HealthReport
	HealthState        = pluginapi.HealthState
)

// Re-exported constants of the contract.
const (
	APIVersion   = abiruntime.APIVersion
	StateRunning = abiruntime.StateRunning
	StateExited  = abiruntime.StateExited
	StopGraceful = abiruntime.StopGraceful
	StopForced   = abiruntime.StopForced
	// LimitsCgroup2, LimitsCgroup1, LimitsContainer and ExitReasonOOM: see
	// [abiruntime.Capabilities] and [abiruntime.WorkloadState].
	LimitsCgroup2   = abiruntime.LimitsCgroup2
	LimitsCgroup1   = abiruntime.LimitsCgroup1
	LimitsContainer = abiruntime.LimitsContainer
	ExitReasonOOM   = abiruntime.ExitReasonOOM
)

// ErrNotFound is [abiruntime.ErrNotFound]: wrap it for an unknown workload.
var ErrNotFound = abiruntime.ErrNotFound

// PluginSets returns go-plugin's versioned plugin sets serving d, one per
// contract version this package speaks.
func PluginSets(d Driver) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersion: {pluginapi.RuntimePluginName: &serve.ServerPlugin{Register: func(s *grpc.Server) {
			runtimev1.RegisterRuntimeDriverServer(s, abiruntime.NewServer(d))
		}}},
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
// A binary started by hand (without the handshake variable) prints a notice
// and exits 1. The driver's logs must go to the process's stderr as it was
// before Serve (use NewLogger(os.Stderr)): the host re-emits those lines
// under the plugin's name. The process exits by itself when its host dies.
func Serve(d Driver) {
	serve.Serve(pluginapi.RuntimeCookieValue, PluginSets(d))
}
