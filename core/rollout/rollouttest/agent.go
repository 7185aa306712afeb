// Package rollouttest stands in for node agents in tests and benchmarks of core/rollout: it
// reads a node's stored desired state and reports on it the way an agent does
// (docs/node-protocol.md section 5.3), without processes.
package rollouttest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// Report makes node id apply its stored desired state and report on it: a workload desired
// running runs and passes its probe, unless crashes(its bundle digest) holds (crashes may be
// nil), when it is reported crashed; a workload desired stopped is reported stopped; a workload
// left out is no longer reported. The node then acknowledges the desired revision as applied.
// A removed node reports nothing.
func Report(ctx context.Context, reg *nodes.Registry, cat *services.Catalog, id string, crashes func(digest string) bool) error {
	got, err := reg.Get(ctx, id)
	if err != nil {
		return err
	}
	if got.Status == nodes.StatusRemoved {
		return nil
	}
	var spec node.Spec
	if got.DesiredSpec != "" {
		if err := json.Unmarshal([]byte(got.DesiredSpec), &spec); err != nil {
			return fmt.Errorf("desired state of %s: %w", id, err)
		}
	}
	obs := make([]services.Observation, 0, len(spec.Workloads))
	for _, w := range spec.Workloads {
		o := services.Observation{WorkloadID: w.WorkloadID, ObservedStatus: "stopped", Health: "unknown"}
		switch {
		case w.DesiredStatus != node.DesiredRunning:
		case crashes != nil && crashes(w.BundleDigest):
			o = services.Observation{WorkloadID: w.WorkloadID, ObservedStatus: "crashed", Health: "unknown", Message: "exit status 1"}
		default:
			o = services.Observation{WorkloadID: w.WorkloadID, ObservedStatus: "running", Health: "passing", Address: "127.0.0.1:9"}
		}
		obs = append(obs, o)
	}
	if _, err := cat.Observe(ctx, id, obs); err != nil {
		return err
	}
	rev := got.DesiredRev
	return reg.Seen(ctx, id, &rev)
}
