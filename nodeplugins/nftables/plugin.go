package nftables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/network"
)

// idempotencyKept is how long Attach and Detach records are kept.
const idempotencyKept = 24 * time.Hour

// PluginConfig configures a Plugin: what Config holds but the pool, which
// the host gives with Setup.
type PluginConfig struct {
	// StateDir holds the allocations and the guard records. Required.
	StateDir string
	// Bridge and TablePrefix are as in Config (empty: the defaults).
	Bridge, TablePrefix string
	// Logger receives the plugin's logs; nil discards them.
	Logger *slog.Logger
}

// Plugin serves a Network as the node-network plugin contract
// (abi/network): Setup opens the network on the host's pool, Attach and
// Detach are fenced and deduplicated through sdk/guard. Safe for concurrent use.
type Plugin struct {
	cfg    PluginConfig
	log    *slog.Logger
	guards *guard.Guards

	mu  sync.Mutex
	net *Network // nil until Setup; mu must be held
}

var _ network.Network = (*Plugin)(nil)

// NewPlugin returns a plugin on cfg.StateDir; nothing changes on the node
// before Setup.
func NewPlugin(cfg PluginConfig) (*Plugin, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("nftables plugin: StateDir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	g, err := guard.Open(filepath.Join(cfg.StateDir, "guard"))
	if err != nil {
		return nil, fmt.Errorf("nftables plugin: %w", err)
	}
	if _, err := g.Idempotency.Prune(time.Now().Add(-idempotencyKept)); err != nil {
		cfg.Logger.Warn("could not prune idempotency records", "error", err)
	}
	return &Plugin{cfg: cfg, log: cfg.Logger, guards: g}, nil
}

// Describe implements network.Network.
func (p *Plugin) Describe(context.Context) (*network.DescribeResponse, error) {
	return &network.DescribeResponse{Name: "nftables", Version: version.Version, APIVersions: []int{network.APIVersion}}, nil
}

// Setup implements network.Network: the guard first, then the bridge and
// every kept attachment's rules, each one batch. A pool other than the one
// already set up is refused with code validation_failed.
func (p *Plugin) Setup(ctx context.Context, req *network.SetupRequest) (*network.SetupResponse, error) {
	subnet, err := netip.ParsePrefix(req.Subnet)
	if err != nil {
		return nil, abierrors.Wrap(abierrors.ValidationFailed, "setup: subnet", err)
	}
	var gw netip.Addr
	if req.Gateway != "" {
		if gw, err = netip.ParseAddr(req.Gateway); err != nil {
			return nil, abierrors.Wrap(abierrors.ValidationFailed, "setup: gateway", err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.net != nil && (p.net.cfg.Subnet != subnet.Masked() || (gw.IsValid() && p.net.cfg.Gateway != gw)) {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("setup: this plugin runs pool %s, not %s", p.net.cfg.Subnet, subnet))
	}
	if p.net == nil {
		n, err := New(Config{Subnet: subnet, Gateway: gw, Bridge: p.cfg.Bridge, TablePrefix: p.cfg.TablePrefix,
			StateDir: p.cfg.StateDir, Logger: p.log})
		if errors.Is(err, ErrInvalid) {
			return nil, abierrors.Wrap(abierrors.ValidationFailed, "setup", err)
		}
		if err != nil {
			return nil, err
		}
		p.net = n
	}
	if err := p.net.Guard(ctx); err != nil {
		return nil, err
	}
	if err := p.net.Ensure(ctx); err != nil {
		return nil, err
	}
	return &network.SetupResponse{Gateway: p.net.cfg.Gateway.String()}, nil
}

func (p *Plugin) current() (*Network, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.net == nil {
		return nil, abierrors.New(abierrors.Unavailable, "nftables plugin: Setup has not run")
	}
	return p.net, nil
}

// Attach implements network.Network.
func (p *Plugin) Attach(ctx context.Context, req *network.AttachRequest) (*network.Attachment, error) {
	n, err := p.current()
	if err != nil {
		return nil, err
	}
	return guard.Mutate(ctx, p.guards, "attachment/"+req.WorkloadID, req.Mutation, req, func() (*network.Attachment, error) {
		ports := make([]Port, 0, len(req.Ports))
		for _, q := range req.Ports {
			ports = append(ports, Port{HostPort: q.HostPort, ContainerPort: q.ContainerPort, Protocol: q.Protocol})
		}
		a, err := n.Attach(ctx, AttachRequest{WorkloadID: req.WorkloadID, Group: req.Group, Ports: ports})
		if errors.Is(err, ErrInvalid) {
			return nil, abierrors.Wrap(abierrors.ValidationFailed, "attach "+req.WorkloadID, err)
		}
		if err != nil {
			return nil, err
		}
		return toWire(a), nil
	})
}

// Detach implements network.Network.
func (p *Plugin) Detach(ctx context.Context, req *network.DetachRequest) error {
	n, err := p.current()
	if err != nil {
		return err
	}
	_, err = guard.Mutate(ctx, p.guards, "attachment/"+req.WorkloadID, req.Mutation, req, func() (struct{}, error) {
		return struct{}{}, n.Detach(ctx, req.WorkloadID)
	})
	return err
}

// List implements network.Network; empty before Setup.
func (p *Plugin) List(context.Context) ([]*network.Attachment, error) {
	p.mu.Lock()
	n := p.net
	p.mu.Unlock()
	if n == nil {
		return nil, nil
	}
	var out []*network.Attachment
	for _, a := range n.Attachments() {
		out = append(out, toWire(a))
	}
	return out, nil
}

func toWire(a Attachment) *network.Attachment {
	out := &network.Attachment{WorkloadID: a.WorkloadID, Group: a.Group, Address: a.Address.String(), NetNSPath: a.NetNSPath()}
	for _, q := range a.Ports {
		out.Ports = append(out.Ports, network.Port{HostPort: q.HostPort, ContainerPort: q.ContainerPort, Protocol: q.Protocol})
	}
	return out
}
