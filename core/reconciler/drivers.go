package reconciler

import (
	"slices"

	"github.com/berthhq/berth/core/nodes"
)

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
