// Package provider is what a provider-plugin author links: the Go contracts of
// provider plugins (the gateway first) and Serve, which runs one as a go-plugin process.
package provider

import (
	"context"

	"github.com/berthhq/berth/abi/routes"
)

// APIVersion is the provider contract version of this package.
//
// Changelog: 1 (2026-11-29) Gateway: Describe, SetRoutes.
const APIVersion = 1

// Gateway routes HTTP traffic for hostnames to upstream workloads. berthd
// calls it; implementations must be safe for concurrent use.
//
// Lifecycle: the host calls Describe once after launch, then SetRoutes with the
// complete table every time the table changes and again after every relaunch of
// the plugin process. A gateway holds no state the host cannot re-send.
type Gateway interface {
	// Describe names the plugin. Cheap; called once per launch.
	Describe(ctx context.Context) (*DescribeResponse, error)
	// SetRoutes replaces the complete route table with t. Idempotent: the
	// same table twice changes nothing. A table with a lower Revision than the
	// current one may be refused with an error. The callee must not keep
	// references into t's slices beyond the call unless it copies them.
	SetRoutes(ctx context.Context, t routes.Table) error
}

// DescribeResponse names a provider plugin and what it can do.
type DescribeResponse struct {
	Name         string   // e.g. "gateway"
	Version      string   // the plugin's own version
	APIVersions  []int    // contract versions it speaks
	Capabilities []string // static, e.g. "http", "tls"
}
