package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
)

// Provider is a supervised provider plugin process. It implements
// provider.Provider by forwarding each call to the current process under a
// deadline, and checks what comes back:
//
//   - Plan and Apply must answer for the resource asked about ("this is a
//     bug in plugin X" otherwise);
//   - an Apply whose state differs from the planned state it was given marks
//     the plugin degraded (Status.Degraded), logging both values; the state
//     is still returned.
//
// When the plugin does not advertise DurableState, the handle remembers the
// last successful Apply of each resource (and forgets it on Delete) and
// applies it again, with the same mutation fields, after every relaunch.
// Safe for concurrent use.
type Provider struct {
	s *supervisor

	mu      sync.Mutex
	desc    *provider.DescribeResponse // from the latest launch; mu must be held
	applied map[string]*provider.ApplyRequest
}

var _ provider.Provider = (*Provider)(nil)

// LaunchProvider starts the provider plugin at cfg.Path, negotiates
// provider.APIVersion over go-plugin's gRPC protocol, calls Describe, then
// ValidateConfig and Configure with cfg.PluginConfig, and supervises the
// process until Close. ctx bounds only this first launch. It returns an
// error wrapping ErrChecksum when the binary does not match cfg.SHA256, or
// the launch error (the process is killed); configuration problems are
// reported in that error.
func LaunchProvider(ctx context.Context, cfg Config) (*Provider, error) {
	s, err := newSupervisor(cfg, kindSpec{
		kind:     pluginapi.KindProvider,
		cookie:   pluginapi.ProviderCookieValue,
		name:     pluginapi.ProviderPluginName,
		versions: []int{provider.APIVersion},
		newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
			return provider.NewClient(life, conn)
		},
	})
	if err != nil {
		return nil, err
	}
	p := &Provider{s: s, applied: map[string]*provider.ApplyRequest{}}
	s.ready = func(ctx context.Context, impl any, negotiated int) (string, error) {
		c := impl.(*provider.Client)
		desc, err := c.Describe(ctx)
		if err != nil {
			return "", fmt.Errorf("describe: %w", err)
		}
		if err := s.checkVersions(desc.Name, desc.APIVersions, negotiated); err != nil {
			return "", err
		}
		if len(desc.Capabilities.ResourceTypes) == 0 {
			return "", s.bug("Describe lists no resource type")
		}
		conf := &provider.ConfigRequest{Config: cfg.PluginConfig, APIVersion: negotiated}
		if len(conf.Config) == 0 {
			conf.Config = []byte("{}")
		}
		v, err := c.ValidateConfig(ctx, conf)
		if err != nil {
			return "", fmt.Errorf("validate config: %w", err)
		}
		if len(v.Problems) > 0 {
			return "", fmt.Errorf("configuration refused: %s", strings.Join(v.Problems, "; "))
		}
		if err := c.Configure(ctx, conf); err != nil {
			return "", fmt.Errorf("configure: %w", err)
		}
		p.mu.Lock()
		p.desc = desc
		p.mu.Unlock()
		s.log.Info("provider ready", "name", desc.Name, "version", desc.Version, "durable_state", desc.Capabilities.DurableState)
		return desc.Version, nil
	}
	s.installed = func(ctx context.Context, impl any) error {
		p.mu.Lock()
		durable := p.desc != nil && p.desc.Capabilities.DurableState
		var again []*provider.ApplyRequest
		if !durable {
			for _, r := range p.applied {
				again = append(again, r)
			}
		}
		p.mu.Unlock()
		for _, r := range again {
			if _, err := impl.(*provider.Client).Apply(ctx, r); err != nil {
				return fmt.Errorf("apply %s/%s again after relaunch: %w", r.Planned.Type, r.Planned.ID, err)
			}
			s.log.Info("resource applied again after relaunch", "type", r.Planned.Type, "id", r.Planned.ID)
		}
		return nil
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Declared returns the resource types the plugin's latest Describe declared
// (checked at launch: at least one). The slice is the caller's.
func (p *Provider) Declared() []provider.ResourceType {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.desc == nil {
		return nil
	}
	return append([]provider.ResourceType(nil), p.desc.Capabilities.ResourceTypes...)
}

// Name returns the plugin's catalog name (Config.Name).
func (p *Provider) Name() string { return p.s.cfg.Name }

// Close kills the plugin process (gracefully, then with SIGKILL after 2 s)
// and stops relaunching it; it returns once the process is gone. Idempotent.
func (p *Provider) Close() error { return p.s.close() }

// Detach stops supervising the plugin process and closes this host's
// connection to it, leaving the process running: with Config.ReattachPath the
// next handle launched on the same record reconnects to it (docs/plugins.md
// section 2.8). Without ReattachPath the process ends with the host. Later
// calls fail with ErrUnavailable. Idempotent; Close after Detach does nothing.
func (p *Provider) Detach() { p.s.detach() }

// Status returns a snapshot of the handle.
func (p *Provider) Status() Status { return p.s.Status() }

// PID returns the pid of the current plugin process, or 0 while it is down.
func (p *Provider) PID() int { return p.s.Status().PID }

// Launches reports how many times the plugin process was launched
// successfully, the first launch included.
func (p *Provider) Launches() int { return p.s.Status().Launches }

func (p *Provider) impl() (*provider.Client, error) {
	impl, err := p.s.current()
	if err != nil {
		return nil, err
	}
	return impl.(*provider.Client), nil
}

// Describe implements provider.Provider: the answer of the current process.
func (p *Provider) Describe(ctx context.Context) (*provider.DescribeResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Describe(ctx)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	return r, nil
}

// ValidateConfig implements provider.Provider.
func (p *Provider) ValidateConfig(ctx context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.ValidateConfig(ctx, req)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	return r, nil
}

// Plan implements provider.Provider.
func (p *Provider) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Plan(ctx, req)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	if r.Planned.Type != req.Desired.Type || r.Planned.ID != req.Desired.ID {
		return nil, p.s.bug("Plan for %s/%s returned a plan for %s/%s", req.Desired.Type, req.Desired.ID, r.Planned.Type, r.Planned.ID)
	}
	return r, nil
}

// Apply implements provider.Provider. See [Provider] for the Plan-equals-Apply check.
func (p *Provider) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Apply(ctx, req)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	if r.State.Type != req.Planned.Type || r.State.ID != req.Planned.ID {
		return nil, p.s.bug("Apply of %s/%s returned the state of %s/%s", req.Planned.Type, req.Planned.ID, r.State.Type, r.State.ID)
	}
	if !sameState(req.Planned, r.State) {
		// Digests, never the attributes: a state may carry keys.
		p.s.degrade("Apply returned a state other than the planned one",
			"type", req.Planned.Type, "id", req.Planned.ID,
			"planned_sha256", attrDigest(req.Planned), "applied_sha256", attrDigest(r.State))
	}
	c := *req
	p.mu.Lock()
	p.applied[req.Planned.Type+"/"+req.Planned.ID] = &c
	p.mu.Unlock()
	return r, nil
}

// Read implements provider.Provider.
func (p *Provider) Read(ctx context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Read(ctx, req)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	return r, nil
}

// Delete implements provider.Provider.
func (p *Provider) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	impl, err := p.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := p.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Delete(ctx, req)
	if err != nil {
		return nil, p.s.callErr(impl, err)
	}
	p.mu.Lock()
	delete(p.applied, req.Type+"/"+req.ID)
	p.mu.Unlock()
	return r, nil
}

// PlanAndApply is the usual change of one resource: Plan desired over the
// state last applied through this handle (none at first), then Apply the
// plan with m when it has changes or nothing was applied yet. It returns the
// resulting state.
func (p *Provider) PlanAndApply(ctx context.Context, desired provider.Resource, m pluginapi.Mutation) (provider.Resource, error) {
	p.mu.Lock()
	var current *provider.Resource
	if last, ok := p.applied[desired.Type+"/"+desired.ID]; ok {
		c := last.Planned
		current = &c
	}
	p.mu.Unlock()
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: desired, Current: current})
	if err != nil {
		return provider.Resource{}, err
	}
	if !plan.Changes && current != nil {
		return *current, nil
	}
	r, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: m})
	if err != nil {
		return provider.Resource{}, err
	}
	return r.State, nil
}

// sameState is the Plan-equals-Apply check: planned and applied are the same
// resource with equal attributes, where a route table's certificates are
// compared by everything but their PEM, which a gateway keeps out of the
// states it returns (docs/plugins.md section 5.6).
func sameState(planned, applied provider.Resource) bool {
	if planned.Equal(applied) {
		return true
	}
	if planned.Type != routes.ResourceType || planned.Type != applied.Type || planned.ID != applied.ID {
		return false
	}
	a, okA := withoutPEM(planned.Attributes)
	b, okB := withoutPEM(applied.Attributes)
	return okA && okB && reflect.DeepEqual(a, b)
}

// withoutPEM decodes a route table's attributes and drops cert_pem and
// key_pem from each certificate.
func withoutPEM(raw json.RawMessage) (map[string]any, bool) {
	var t map[string]any
	if json.Unmarshal(raw, &t) != nil {
		return nil, false
	}
	certs, _ := t["certificates"].([]any)
	for _, c := range certs {
		if m, ok := c.(map[string]any); ok {
			delete(m, "cert_pem")
			delete(m, "key_pem")
		}
	}
	return t, true
}

// attrDigest is the SHA-256 of a state's attributes, for logs.
func attrDigest(r provider.Resource) string {
	sum := sha256.Sum256(r.Attributes)
	return hex.EncodeToString(sum[:])
}
