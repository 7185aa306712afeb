package gateway

import (
	"context"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/provider"
)

// Version is the gateway plugin's own version, reported by Describe.
const Version = "0.1.0"

// Plugin adapts a *Proxy to provider.Gateway: the route tables berthd pushes
// over go-plugin go straight to the proxy. Safe for concurrent use.
type Plugin struct {
	proxy *Proxy
}

var _ provider.Gateway = (*Plugin)(nil)

// NewPlugin returns the provider.Gateway that feeds proxy.
func NewPlugin(proxy *Proxy) *Plugin { return &Plugin{proxy: proxy} }

// Describe implements provider.Gateway: name "gateway", capability "http".
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:         "gateway",
		Version:      Version,
		APIVersions:  []int{provider.APIVersion},
		Capabilities: []string{"http"},
	}, nil
}

// SetRoutes implements provider.Gateway by replacing the proxy's table. It
// never fails except for a cancelled ctx.
func (p *Plugin) SetRoutes(ctx context.Context, t routes.Table) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.proxy.SetTable(t)
	return nil
}
