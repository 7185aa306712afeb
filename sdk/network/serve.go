// Package network is what a node-network plugin author links: the Go
// contract (re-exported from abi/network) and Serve (docs/plugins.md section 7).
package network

import (
	"io"
	"log/slog"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	abinetwork "github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
	networkv1 "github.com/berthhq/berth/abi/proto/network/v1"
	"github.com/berthhq/berth/sdk/internal/serve"
)

// The contract, re-exported so a plugin author imports one package. See
// [abinetwork.Network] for the lifecycle and obligations.
type (
	Network          = abinetwork.Network
	DescribeResponse = abinetwork.DescribeResponse
	SetupRequest     = abinetwork.SetupRequest
	SetupResponse    = abinetwork.SetupResponse
	Port             = abinetwork.Port
	AttachRequest    = abinetwork.AttachRequest
	Attachment       = abinetwork.Attachment
	DetachRequest    = abinetwork.DetachRequest
	Mutation         = pluginapi.Mutation
)

// APIVersion is the contract version this package serves.
const APIVersion = abinetwork.APIVersion

// PluginSets returns go-plugin's versioned plugin sets serving n.
func PluginSets(n Network) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		APIVersion: {pluginapi.NetworkPluginName: &serve.ServerPlugin{Register: func(s *grpc.Server) {
			networkv1.RegisterNodeNetworkServer(s, abinetwork.NewServer(n))
		}}},
	}
}

// Serve runs n as a go-plugin gRPC plugin process and returns when the host
// closes the plugin; the whole body of a plugin's main after flag parsing.
// A binary started by hand prints a notice and exits 1.
func Serve(n Network) {
	serve.Serve(pluginapi.NetworkCookieValue, PluginSets(n))
}

// NewLogger returns the logger a plugin writes to w (its stderr), in the
// form the host re-emits under the plugin's name.
func NewLogger(w io.Writer) *slog.Logger { return serve.NewLogger(w) }
