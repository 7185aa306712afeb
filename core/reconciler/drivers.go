package reconciler

import (
	"slices"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/scheduler"
)

// withDriver returns cands where, for a service of a runtime other than the
// default ("" or "process"), a node is schedulable only when it advertised
// that driver in its last hello (docs/plugins.md section 3). Services of the
// default runtime are placed as before, on any schedulable node (test nodes
// run other drivers, such as "fake", for them). cands is not changed.
func withDriver(cands []scheduler.Node, drivers map[string][]string, runtime string) []scheduler.Node {
	if runtime == "" || runtime == "process" {
		return cands
	}
	out := slices.Clone(cands)
	for i := range out {
		if !slices.Contains(drivers[out[i].ID], runtime) {
			out[i].Schedulable = false
		}
	}
	return out
}

// defaultDriver is the driver named in the specs of n's workloads of the
// default runtime (docs/node-protocol.md section 6.1): "process" when n
// advertised it in its last hello, or advertised nothing yet; otherwise the
// first driver n advertised, the one it runs them with. The core names no
// driver the node did not announce, so the agent's records and its
// recovery after a restart follow the driver that really runs the workload.
func defaultDriver(n *nodes.Node) string {
	if len(n.Drivers) == 0 || slices.Contains(n.Drivers, "process") {
		return "process"
	}
	return n.Drivers[0]
}
