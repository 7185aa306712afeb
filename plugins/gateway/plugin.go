package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// Plugin is the gateway as a provider (docs/plugins.md section 5): it manages
// one resource, the route table (type routes.ResourceType, id
// routes.ResourceID, attributes the table's JSON form), and feeds every
// applied table to a *Proxy. Its state lives in memory only (DurableState
// false): the host applies the table again after a relaunch. Safe for
// concurrent use.
type Plugin struct {
	proxy  *Proxy
	guards *guard.Guards

	mu    sync.Mutex
	state *provider.Resource // the applied table; nil before the first Apply and after Delete
}

var _ provider.Provider = (*Plugin)(nil)

// NewPlugin returns the provider that feeds proxy.
func NewPlugin(proxy *Proxy) *Plugin {
	g, _ := guard.Open("") // in memory: cannot fail
	return &Plugin{proxy: proxy, guards: g}
}

// Describe implements provider.Provider: name "gateway", one resource type.
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:        "gateway",
		Version:     version.Version,
		APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			ResourceTypes: []provider.ResourceType{{
				Name: routes.ResourceType, Variants: []string{"http"},
				ExampleID: routes.ResourceID, ExampleAttributes: exampleTables(),
			}},
		},
	}, nil
}

// exampleTables are two valid route tables (one route to a discard port, at
// two revisions), the states authors' tools check when given none.
func exampleTables() []json.RawMessage {
	var out []json.RawMessage
	for i, addr := range []string{"127.0.0.1:9", "127.0.0.1:10"} {
		raw, _ := json.Marshal(routes.Table{Revision: int64(i + 1), Routes: []routes.Route{{ // plain structs: cannot fail
			Hostname: "conformance.test", Project: "prj_conformance", Service: "web",
			Upstreams: []routes.Upstream{{WorkloadID: "wl_conformance", Address: addr, Healthy: true}},
		}}})
		out = append(out, raw)
	}
	return out
}

// ValidateConfig implements provider.Provider. The gateway takes its listen
// address as a flag; its configuration must be an empty JSON object.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	var obj map[string]json.RawMessage
	if len(req.Config) > 0 {
		if err := json.Unmarshal(req.Config, &obj); err != nil {
			return &provider.ValidateConfigResponse{Problems: []string{"config is not a JSON object"}}, nil
		}
	}
	var problems []string
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		problems = append(problems, fmt.Sprintf("unknown config field %q", k))
	}
	return &provider.ValidateConfigResponse{Problems: problems}, nil
}

// canonical decodes a route-table resource, checks it with
// routes.Table.Validate, and returns it with canonical attributes (routes and
// upstreams sorted, compact JSON).
func canonical(r provider.Resource) (provider.Resource, routes.Table, error) {
	if r.Type != routes.ResourceType || r.ID != routes.ResourceID {
		return provider.Resource{}, routes.Table{}, abierrors.New(abierrors.ValidationFailed,
			fmt.Sprintf("gateway manages only %s/%s, not %s/%s", routes.ResourceType, routes.ResourceID, r.Type, r.ID))
	}
	var t routes.Table
	dec := json.NewDecoder(bytes.NewReader(orEmpty(r.Attributes)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return provider.Resource{}, routes.Table{}, abierrors.Wrap(abierrors.ValidationFailed, "route table attributes do not decode", err)
	}
	if err := t.Validate(); err != nil {
		return provider.Resource{}, routes.Table{}, abierrors.Wrap(abierrors.ValidationFailed, "route table is not routable", err)
	}
	t.Normalize()
	raw, err := json.Marshal(t)
	if err != nil {
		return provider.Resource{}, routes.Table{}, fmt.Errorf("encode route table: %w", err)
	}
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}, t, nil
}

func orEmpty(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

// Plan implements provider.Provider: the planned state is the desired table
// in canonical form; Changes compares it with Current.
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	planned, _, err := canonical(req.Desired)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Apply implements provider.Provider: the planned table replaces the proxy's
// table atomically. Fenced and idempotent through sdk/guard.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return guard.Mutate(ctx, p.guards, routes.ResourceType+"/"+routes.ResourceID, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		state, t, err := canonical(req.Planned)
		if err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.proxy.SetTable(t)
		p.state = &state
		return &provider.ApplyResponse{State: state}, nil
	})
}

// Read implements provider.Provider: the applied table, or ErrNotFound.
func (p *Plugin) Read(_ context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Type != routes.ResourceType || req.ID != routes.ResourceID || p.state == nil {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	return &provider.ReadResponse{State: *p.state}, nil
}

// Delete implements provider.Provider: the proxy gets the empty table, so
// every host answers no_route.
func (p *Plugin) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Type+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if req.Type == routes.ResourceType && req.ID == routes.ResourceID && p.state != nil {
			p.proxy.SetTable(routes.Table{})
			p.state = nil
		}
		return &provider.DeleteResponse{}, nil
	})
}
