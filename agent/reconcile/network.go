package reconcile

import (
	"context"
	"fmt"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/pluginapi"
)

// Network is the node network of container workloads, as the loop needs it
// (docs/plugins.md section 7). The agent's command wires the nftables network
// in; nil runs containers in the node's own network namespace.
type Network interface {
	// Attach gives a workload its network namespace and address, in
	// isolation group group, with hostPort on the node's addresses forwarded
	// to the same port of the workload. Idempotent by workload id; it
	// returns the path of the namespace. m carries the call's idempotency
	// key and fencing token, derived from the workload's start attempt
	// (docs/plugins.md section 3.4).
	Attach(ctx context.Context, workloadID, group string, hostPort int, m pluginapi.Mutation) (netnsPath string, err error)
	// Detach removes a workload's rules, namespace and veth; an unknown
	// workload is success. m is as for Attach.
	Detach(ctx context.Context, workloadID string, m pluginapi.Mutation) error
}

// attachNetwork attaches a container workload when the loop has a network
// and returns the namespace for the driver ("" when the workload shares the
// node's). The workload then listens on all addresses of its namespace, and
// the node's address and port reach it through the published port, so the
// health probe and the routes stay HOST:PORT of the node.
func (l *Loop) attachNetwork(ctx context.Context, spec *node.WorkloadSpec, port int, env map[string]string, m pluginapi.Mutation) (string, error) {
	if l.cfg.Network == nil || spec.Driver != "containerd" {
		return "", nil
	}
	group := spec.ProjectID
	if group == "" {
		group = spec.Project
	}
	ns, err := l.cfg.Network.Attach(ctx, spec.WorkloadID, group, port, m)
	if err != nil {
		return "", fmt.Errorf("attach workload %s to the node network: %w", spec.WorkloadID, err)
	}
	env["HOST"] = "0.0.0.0"
	return ns, nil
}

// detachNetwork removes a workload's network, when the loop has one.
func (l *Loop) detachNetwork(ctx context.Context, id string, m pluginapi.Mutation) error {
	if l.cfg.Network == nil {
		return nil
	}
	if err := l.cfg.Network.Detach(ctx, id, m); err != nil {
		return fmt.Errorf("detach workload %s from the node network: %w", id, err)
	}
	return nil
}
