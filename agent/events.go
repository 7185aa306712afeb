package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/berthhq/berth/abi/node"
)

// Event types the agent emits (docs/node-protocol.md sections 5.4 and 6.3).
const (
	EventAppDown         = "app.down"
	EventAppUp           = "app.up"
	EventWorkloadCrashed = "workload.crashed"
)

// observedChange is one event the decider found: its type, the workload and data.
type observedChange struct {
	Type       string
	WorkloadID string
	Data       map[string]any
}

// diffObserved is the pure decider behind app.down, app.up and
// workload.crashed: given the previous observation of each workload and the
// current report, it returns the events to emit, in report order. A workload
// seen for the first time emits nothing: there is no transition yet.
func diffObserved(prev map[string]node.WorkloadStatus, cur []node.WorkloadStatus) []observedChange {
	var out []observedChange
	for _, w := range cur {
		p, ok := prev[w.WorkloadID]
		if !ok {
			continue
		}
		if p.Health != node.HealthFailing && w.Health == node.HealthFailing {
			out = append(out, observedChange{EventAppDown, w.WorkloadID, map[string]any{"workload_id": w.WorkloadID}})
		}
		if p.Health == node.HealthFailing && w.Health == node.HealthPassing {
			out = append(out, observedChange{EventAppUp, w.WorkloadID, map[string]any{"workload_id": w.WorkloadID}})
		}
		if p.ObservedStatus != node.StatusCrashed && w.ObservedStatus == node.StatusCrashed {
			d := map[string]any{"workload_id": w.WorkloadID, "restart_count": w.RestartCount}
			if w.LastExitCode != nil {
				d["exit_code"] = *w.LastExitCode
			}
			out = append(out, observedChange{EventWorkloadCrashed, w.WorkloadID, d})
		}
	}
	return out
}

// newEvent builds the body of an event message this node emits (section 5.4).
func newEvent(nodeID string, ch observedChange, now time.Time) node.Event {
	return node.Event{
		SchemaVersion: 1,
		ID:            "evt_" + ulid.Make().String(),
		Type:          ch.Type,
		Time:          now.UTC(),
		Source:        node.EventSource{Kind: "node", NodeID: nodeID},
		Subject:       node.EventRef{Type: "workload", ID: ch.WorkloadID},
		Actor:         node.EventRef{Type: "node", ID: nodeID},
		Data:          ch.Data,
	}
}

// bufferEvent stores ev in the local event buffer (bounded, section 6.5).
func (a *Agent) bufferEvent(ctx context.Context, ev node.Event) error {
	raw, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", ev.Type, err)
	}
	return a.store.BufferEvent(ctx, ev.ID, raw, node.MaxBufferedEvents)
}

// diskFreeGB returns the free space of the file system holding dir, in GB
// (10^9 bytes), or 0 when it cannot be read.
func diskFreeGB(dir string) float64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return float64(st.Bavail) * float64(st.Bsize) / 1e9
}
