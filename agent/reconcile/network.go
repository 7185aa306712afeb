package reconcile

import (
	"context"
	"fmt"

	"github.com/berthhq/berth/abi/node"
)

// Network is the node network of container workloads, as the loop needs it
// (docs/plugins.md section 7). The agent's command wires the nftables network
// in; nil runs containers in the node's own network namespace.
type Network interface {
	// Attach gives a workload its network namespace and address, in
	// isolation group group, with hostPort on the node's addresses forwarded
	// to the same port of the workload. Idempotent by workload id; it
	// returns the path of the namespace.
	Attach(ctx context.Context, workloadID, group string, hostPort int) (netnsPath string, err error)
	// Detach removes a workload's rules, namespace and veth; an unknown
	// workload is success.
	Detach(ctx context.Context, workloadID string) error
}

// attachNetwork attaches a container workload when the loop has a network
// and returns the namespace for the driver ("" when the workload shares the
// node's). The workload then listens on all addresses of its namespace, and
// the node's address and port reach it through the published port, so the
// health probe and the routes stay HOST:PORT of the node.
func (l *Loop) attachNetwork(ctx context.Context, spec *node.WorkloadSpec, port int, env map[string]string) (string, error) {
	if l.cfg.Network == nil || spec.Driver != "containerd" {
		return "", nil
	}
	group := spec.ProjectID
	if group == "" {
		group = spec.Project
	}
	ns, err := l.cfg.Network.Attach(ctx, spec.WorkloadID, group, port)
	if err != nil {
		return "", fmt.Errorf("attach workload %s to the node network: %w", spec.WorkloadID, err)
	}
	env["HOST"] = "0.0.0.0"
	return ns, nil
}

// detachNetwork removes a workload's network, when the loop has one.
func (l *Loop) detachNetwork(ctx context.Context, id string) error {
	if l.cfg.Network == nil {
		return nil
	}
	if err := l.cfg.Network.Detach(ctx, id); err != nil {
		return fmt.Errorf("detach workload %s from the node network: %w", id, err)
	}
	return nil
}
