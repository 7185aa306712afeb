package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/host/plugin"
)

// gatewaySink adapts the gateway provider to the reconciler: each route
// table is applied as the resource gateway.route_table/default
// (docs/plugins.md section 5), fenced by the table's revision (which only
// grows within one berthd life, and the gateway's fencing state lives as
// long as its process) and keyed by revision and digest.
type gatewaySink struct{ p *plugin.Provider }

// SetRoutes plans and applies t.
func (s gatewaySink) SetRoutes(ctx context.Context, t abiroutes.Table) error {
	raw, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode route table: %w", err)
	}
	desired := abiprovider.Resource{Type: abiroutes.ResourceType, ID: abiroutes.ResourceID, Attributes: raw}
	m := pluginapi.Mutation{
		IdempotencyKey: "routes/" + strconv.FormatInt(t.Revision, 10) + "/" + t.Digest(),
		FencingToken:   uint64(max(t.Revision, 0)),
	}
	if _, err := s.p.PlanAndApply(ctx, desired, m); err != nil {
		return fmt.Errorf("apply route table revision %d: %w", t.Revision, err)
	}
	return nil
}
