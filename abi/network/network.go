// Package network is the Go contract of node-network plugins: the Network
// interface, its types and their gRPC wire adapters (docs/plugins.md section 7).
//
// A network plugin gives container workloads their network on one node: a
// namespace per workload, an address of the node's pool, isolation by group
// and published ports. Plugin authors implement [Network] and serve it with
// github.com/berthhq/berth/sdk/network; the agent reaches it through [Client]
// (wrapped by host/plugin).
package network

import (
	"context"

	"github.com/berthhq/berth/abi/pluginapi"
)

// APIVersion is the node-network contract version of this package.
//
// Changelog:
//   - 1 (2026-12-13) Describe, Health, Setup, Attach, Detach, List.
const APIVersion = 1

// Network is a node's container network. Implementations must be safe for
// concurrent use.
//
// Lifecycle, as the agent drives it:
//
//  1. Describe once after launch.
//  2. Setup with the node's pool, after every launch and before any workload
//     starts: it restores the deny-only guard of the pool, then the bridge
//     and the rules of every attachment the plugin kept.
//  3. Attach before a container workload starts (its namespace path goes to
//     the runtime driver), Detach when the workload is removed.
//
// Attach and Detach embed [pluginapi.Mutation]: a stale fencing token is
// refused and a repeated idempotency key returns the recorded result. Attach
// is idempotent by workload id (an attached workload keeps its address; its
// group and ports are replaced); Detach of an unknown workload is success.
type Network interface {
	// Describe names the plugin. Cheap.
	Describe(ctx context.Context) (*DescribeResponse, error)
	// Setup applies the guard, bridge and rules for req's pool; idempotent.
	// A pool other than the one of the plugin's kept attachments is refused
	// with code validation_failed.
	Setup(ctx context.Context, req *SetupRequest) (*SetupResponse, error)
	// Attach gives a workload its network.
	Attach(ctx context.Context, req *AttachRequest) (*Attachment, error)
	// Detach removes a workload's network.
	Detach(ctx context.Context, req *DetachRequest) error
	// List reports every attachment, sorted by workload id.
	List(ctx context.Context) ([]*Attachment, error)
}

// DescribeResponse names the plugin.
type DescribeResponse struct {
	Name        string // e.g. "nftables"; a DNS label
	Version     string
	APIVersions []int
}

// SetupRequest is the node's workload pool: Subnet an IPv4 prefix
// ("10.88.0.0/16"), Gateway the bridge's address in it (empty: the first).
type SetupRequest struct {
	Subnet  string
	Gateway string
}

// SetupResponse reports the gateway in force.
type SetupResponse struct {
	Gateway string
}

// Port is a published port: HostPort on the node's addresses forwards to
// ContainerPort of the workload. Protocol is "tcp" (empty) or "udp".
type Port struct {
	HostPort      uint16
	ContainerPort uint16
	Protocol      string
}

// AttachRequest asks for a workload's network; Group is its isolation group
// (the project id).
type AttachRequest struct {
	WorkloadID string
	Group      string
	Ports      []Port
	pluginapi.Mutation
}

// Attachment is a workload's network as applied. NetNSPath is the path of
// its network namespace, for runtime.StartRequest.NetworkNamespace.
type Attachment struct {
	WorkloadID string
	Group      string
	Address    string
	NetNSPath  string
	Ports      []Port
}

// DetachRequest names a workload.
type DetachRequest struct {
	WorkloadID string
	pluginapi.Mutation
}
