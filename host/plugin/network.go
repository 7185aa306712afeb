package plugin

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
)

// Network is a supervised node-network plugin process (docs/plugins.md
// section 7). It implements network.Network by forwarding each call to the
// current process under a deadline; calls fail with an error wrapping
// ErrUnavailable while the process is down. Every launch, relaunches
// included, runs Setup with the pool given to LaunchNetwork before the
// process becomes current, so the guard is back before any Attach. Safe for
// concurrent use.
type Network struct {
	s *supervisor
}

var _ network.Network = (*Network)(nil)

// ResolveNetwork is Resolve for a node-network plugin.
func ResolveNetwork(dir, name string) (Entry, error) {
	return Resolve(dir, name, pluginapi.KindNetwork)
}

// LaunchNetwork starts the network plugin at cfg.Path, negotiates
// network.APIVersion, calls Describe and Setup(setup), and supervises the
// process until Close. ctx bounds only this first launch. It returns an
// error wrapping ErrChecksum when the binary does not match cfg.SHA256, or
// the launch error (the process is killed).
func LaunchNetwork(ctx context.Context, cfg Config, setup network.SetupRequest) (*Network, error) {
	s, err := newSupervisor(cfg, kindSpec{
		kind:     pluginapi.KindNetwork,
		cookie:   pluginapi.NetworkCookieValue,
		name:     pluginapi.NetworkPluginName,
		versions: []int{network.APIVersion},
		newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
			return network.NewClient(life, conn)
		},
	})
	if err != nil {
		return nil, err
	}
	s.ready = func(ctx context.Context, impl any, negotiated int) (string, error) {
		n := impl.(network.Network)
		desc, err := n.Describe(ctx)
		if err != nil {
			return "", fmt.Errorf("describe: %w", err)
		}
		if err := s.checkVersions(desc.Name, desc.APIVersions, negotiated); err != nil {
			return "", err
		}
		r, err := n.Setup(ctx, &setup)
		if err != nil {
			return "", fmt.Errorf("setup of pool %s: %w", setup.Subnet, err)
		}
		s.log.Info("node network ready", "name", desc.Name, "version", desc.Version, "subnet", setup.Subnet, "gateway", r.Gateway)
		return desc.Version, nil
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return &Network{s: s}, nil
}

// Close kills the plugin process and stops relaunching it. The network it
// made stays in the kernel. Idempotent.
func (n *Network) Close() error { return n.s.close() }

// Status returns a snapshot of the handle.
func (n *Network) Status() Status { return n.s.Status() }

func (n *Network) impl() (*network.Client, error) {
	impl, err := n.s.current()
	if err != nil {
		return nil, err
	}
	return impl.(*network.Client), nil
}

// Describe implements network.Network.
func (n *Network) Describe(ctx context.Context) (*network.DescribeResponse, error) {
	impl, err := n.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Describe(ctx)
	if err != nil {
		return nil, n.s.callErr(impl, err)
	}
	return r, nil
}

// Setup implements network.Network.
func (n *Network) Setup(ctx context.Context, req *network.SetupRequest) (*network.SetupResponse, error) {
	impl, err := n.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Setup(ctx, req)
	if err != nil {
		return nil, n.s.callErr(impl, err)
	}
	return r, nil
}

// Attach implements network.Network. An answer for another workload, or
// without a namespace, is refused as a bug of the plugin.
func (n *Network) Attach(ctx context.Context, req *network.AttachRequest) (*network.Attachment, error) {
	impl, err := n.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.Attach(ctx, req)
	if err != nil {
		return nil, n.s.callErr(impl, err)
	}
	switch {
	case r == nil:
		return nil, n.s.bug("Attach without an attachment")
	case r.WorkloadID != req.WorkloadID:
		return nil, n.s.bug("Attach of %q returned the attachment of %q", req.WorkloadID, r.WorkloadID)
	case r.NetNSPath == "":
		return nil, n.s.bug("Attach of %q returned no network namespace", req.WorkloadID)
	}
	return r, nil
}

// Detach implements network.Network.
func (n *Network) Detach(ctx context.Context, req *network.DetachRequest) error {
	impl, err := n.impl()
	if err != nil {
		return err
	}
	ctx, cancel := n.s.callCtx(ctx, 0)
	defer cancel()
	if err := impl.Detach(ctx, req); err != nil {
		return n.s.callErr(impl, err)
	}
	return nil
}

// List implements network.Network.
func (n *Network) List(ctx context.Context) ([]*network.Attachment, error) {
	impl, err := n.impl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := n.s.callCtx(ctx, 0)
	defer cancel()
	r, err := impl.List(ctx)
	if err != nil {
		return nil, n.s.callErr(impl, err)
	}
	return r, nil
}
