package plugin

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/sdk/provider"
)

// Gateway is a supervised gateway plugin process. It implements
// provider.Gateway; it remembers the last table given to SetRoutes and sends
// it again to every relaunched process. Safe for concurrent use.
type Gateway struct {
	s *supervisor

	sendMu sync.Mutex    // serialises sends, so the plugin ends with the last table
	table  *routes.Table // last table given to SetRoutes, nil before the first; sendMu must be held
}

var _ provider.Gateway = (*Gateway)(nil)

// LaunchGateway starts the gateway plugin at cfg.Path, negotiates
// provider.APIVersion over go-plugin's gRPC protocol, calls Describe, and
// supervises the process until Close. ctx bounds only this first launch. It
// returns an error wrapping ErrChecksum when the binary does not match
// cfg.SHA256, or the launch error (the process is killed).
func LaunchGateway(ctx context.Context, cfg Config) (*Gateway, error) {
	s, err := newSupervisor(cfg, provider.HandshakeConfig(), provider.GatewayPluginSets(nil), provider.GatewayPluginName)
	if err != nil {
		return nil, err
	}
	g := &Gateway{s: s}
	s.ready = func(ctx context.Context, impl any) error {
		d, err := impl.(provider.Gateway).Describe(ctx)
		if err != nil {
			return fmt.Errorf("describe: %w", err)
		}
		if d == nil || d.Name == "" {
			return s.bug("Describe without a name")
		}
		s.log.Info("gateway ready", "name", d.Name, "version", d.Version)
		return nil
	}
	s.installed = func(ctx context.Context, impl any) error {
		g.sendMu.Lock()
		defer g.sendMu.Unlock()
		if g.table == nil {
			return nil
		}
		if err := impl.(provider.Gateway).SetRoutes(ctx, *g.table); err != nil {
			return fmt.Errorf("re-send routes (revision %d): %w", g.table.Revision, err)
		}
		s.log.Info("route table re-sent", "revision", g.table.Revision)
		return nil
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// Close kills the plugin process (gracefully, then with SIGKILL after 2 s) and
// stops relaunching it; it returns once the process is gone. Idempotent.
func (g *Gateway) Close() error { return g.s.close() }

// PID returns the pid of the current plugin process, or 0 while it is down.
func (g *Gateway) PID() int { return g.s.PID() }

// Launches reports how many times the plugin process was launched
// successfully, the first launch included.
func (g *Gateway) Launches() int { return g.s.Launches() }

// Describe implements provider.Gateway.
func (g *Gateway) Describe(ctx context.Context) (*provider.DescribeResponse, error) {
	impl, err := g.s.current()
	if err != nil {
		return nil, err
	}
	r, err := impl.(provider.Gateway).Describe(ctx)
	if err != nil {
		return nil, g.s.callErr(impl, err)
	}
	return r, nil
}

// SetRoutes implements provider.Gateway. The table is remembered (copied) even
// when the call fails, and sent to the plugin again after every relaunch; so
// an error wrapping ErrUnavailable means "will be applied when the plugin is
// back". Calls are serialised.
func (g *Gateway) SetRoutes(ctx context.Context, t routes.Table) error {
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	c := cloneTable(t)
	g.table = &c
	impl, err := g.s.current()
	if err != nil {
		return err
	}
	if err := impl.(provider.Gateway).SetRoutes(ctx, c); err != nil {
		return g.s.callErr(impl, err)
	}
	return nil
}

func cloneTable(t routes.Table) routes.Table {
	out := routes.Table{Revision: t.Revision, Routes: slices.Clone(t.Routes)}
	for i := range out.Routes {
		out.Routes[i].Upstreams = slices.Clone(out.Routes[i].Upstreams)
	}
	return out
}
