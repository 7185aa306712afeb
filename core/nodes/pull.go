package nodes

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/berthhq/berth/abi/node"
)

// AuthenticateID is [Registry.Authenticate] that returns the node's id only: the registry's
// check of a node pulling an image (docs/registry.md section 5).
func (r *Registry) AuthenticateID(ctx context.Context, cred string) (string, error) {
	n, err := r.Authenticate(ctx, cred)
	if err != nil {
		return "", err
	}
	return n.ID, nil
}

// DesiredImages returns the images of the workloads in node nodeID's current desired state
// (none before the first one is signed): what the node may pull from the registry.
func (r *Registry) DesiredImages(ctx context.Context, nodeID string) ([]string, error) {
	n, err := r.Get(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	if n.DesiredSpec == "" {
		return nil, nil
	}
	var spec node.Spec
	if err := json.Unmarshal([]byte(n.DesiredSpec), &spec); err != nil {
		return nil, fmt.Errorf("decode desired state of %s: %w", nodeID, err)
	}
	var out []string
	for _, w := range spec.Workloads {
		if w.Image != "" {
			out = append(out, w.Image)
		}
	}
	return out, nil
}
