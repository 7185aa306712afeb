package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/securefile"
	"github.com/berthhq/berth/internal/version"
	sdkgateway "github.com/berthhq/berth/sdk/gateway"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// Plugin is the gateway as a provider (docs/plugins.md section 5): it manages
// one resource, the route table (type routes.ResourceType, id
// routes.ResourceID, attributes the table's JSON form), and feeds every
// applied table to a *Proxy. Made by [NewPlugin] its state lives in memory
// only (DurableState false): the host applies the table again after a
// relaunch. Made by [OpenPlugin] on a state directory, the applied table and
// the fencing and idempotency records are kept there (DurableState true), so
// a gateway that starts again serves its last table before any host speaks
// to it (docs/plugins.md section 5.3). Safe for concurrent use.
type Plugin struct {
	proxy    *Proxy
	guards   *guard.Guards
	stateDir string // "" keeps everything in memory

	mu    sync.Mutex
	state *provider.Resource // the applied table; nil before the first Apply and after Delete
}

var _ provider.Provider = (*Plugin)(nil)

// tableFile is the applied route table in the state directory, in the
// canonical JSON form of the resource's attributes.
const tableFile = "routes.json"

// idempotencyKeep is how long the records of applied mutations are kept in
// the state directory; older ones are pruned at start and on every Apply.
const idempotencyKeep = 24 * time.Hour

// NewPlugin returns the provider that feeds proxy, with its state in memory.
func NewPlugin(proxy *Proxy) *Plugin {
	g, _ := guard.Open("") // in memory: cannot fail
	return &Plugin{proxy: proxy, guards: g}
}

// OpenPlugin returns the provider that feeds proxy with its state kept under
// stateDir (created 0700): when stateDir holds an applied route table, proxy
// gets it before OpenPlugin returns, so the first table a restarted gateway
// serves is its last one, never an empty one. It fails when the directory
// cannot be created or the stored table does not decode or validate (the
// file is left for an operator to inspect).
func OpenPlugin(proxy *Proxy, stateDir string) (*Plugin, error) {
	if stateDir == "" {
		return NewPlugin(proxy), nil
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("gateway state directory: %w", err)
	}
	g, err := guard.Open(stateDir)
	if err != nil {
		return nil, fmt.Errorf("gateway state directory: %w", err)
	}
	if _, err := g.Idempotency.Prune(time.Now().Add(-idempotencyKeep)); err != nil {
		return nil, fmt.Errorf("gateway state directory: %w", err)
	}
	p := &Plugin{proxy: proxy, guards: g, stateDir: stateDir}
	raw, err := securefile.ReadFile(filepath.Join(stateDir, tableFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("read the stored route table: %w", err)
	}
	state, t, err := sdkgateway.Canonical(provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}, "gateway")
	if err != nil {
		return nil, fmt.Errorf("stored route table %s: %w", filepath.Join(stateDir, tableFile), err)
	}
	proxy.SetTable(t)
	p.state = &state
	return p, nil
}

// Describe implements provider.Provider: name "gateway", one resource type.
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:        "gateway",
		Version:     version.Version,
		APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			DurableState:  p.stateDir != "",
			ResourceTypes: []provider.ResourceType{sdkgateway.ResourceType()},
		},
	}, nil
}

// ValidateConfig implements provider.Provider. The gateway takes its listen
// address as a flag; its configuration must be an empty JSON object.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	return sdkgateway.ValidateNoConfig(req, ""), nil
}

// Plan implements provider.Provider: the planned state is the desired table
// in canonical form; Changes compares it with Current.
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	planned, _, err := sdkgateway.Canonical(req.Desired, "gateway")
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Apply implements provider.Provider: the planned table is stored (with a
// state directory: temp file, fsync, rename) and then replaces the proxy's
// table atomically; a table that cannot be stored is refused and the proxy
// keeps the previous one. Fenced and idempotent through sdk/guard.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return guard.Mutate(ctx, p.guards, routes.ResourceType+"/"+routes.ResourceID, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		state, t, err := sdkgateway.Canonical(req.Planned, "gateway")
		if err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stateDir != "" {
			if err := securefile.WriteFile(filepath.Join(p.stateDir, tableFile), state.Attributes); err != nil {
				return nil, fmt.Errorf("apply: store the route table: %w", err)
			}
			if _, err := p.guards.Idempotency.Prune(time.Now().Add(-idempotencyKeep)); err != nil {
				return nil, fmt.Errorf("apply: %w", err)
			}
		}
		p.proxy.SetTable(t)
		p.state = &state
		return &provider.ApplyResponse{State: redacted(state, t)}, nil
	})
}

// Read implements provider.Provider: the applied table, or ErrNotFound.
// Certificates are listed by names and not_after only: their PEM, and
// their keys above all, never leave the gateway (docs/plugins.md section
// 5.6).
func (p *Plugin) Read(_ context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Type != routes.ResourceType || req.ID != routes.ResourceID || p.state == nil {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	return &provider.ReadResponse{State: redacted(*p.state, p.proxy.Table())}, nil
}

// redacted returns state, the canonical form of t, with each certificate
// reduced to its names and not_after. A table without certificates is
// returned as it is.
func redacted(state provider.Resource, t routes.Table) provider.Resource {
	if len(t.Certificates) == 0 {
		return state
	}
	type certStatus struct {
		Names    []string  `json:"names"`
		NotAfter time.Time `json:"not_after"`
	}
	out := struct {
		routes.Table
		Certificates []certStatus `json:"certificates"`
	}{Table: t}
	for _, c := range t.Certificates {
		out.Certificates = append(out.Certificates, certStatus{Names: c.Names, NotAfter: c.NotAfter})
	}
	raw, err := json.Marshal(out)
	if err != nil { // plain structs: cannot fail
		raw = json.RawMessage(`{}`)
	}
	return provider.Resource{Type: state.Type, ID: state.ID, Attributes: raw}
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
			if p.stateDir != "" {
				if err := os.Remove(filepath.Join(p.stateDir, tableFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return nil, fmt.Errorf("delete the stored route table: %w", err)
				}
			}
			p.proxy.SetTable(routes.Table{})
			p.state = nil
		}
		return &provider.DeleteResponse{}, nil
	})
}
