package containerd

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/errdefs"
	"google.golang.org/protobuf/proto"

	"github.com/berthhq/berth/sdk/runtime"
)

// Stats implements runtime.StatsReporter from the task's cgroup (v1 or v2):
// CPU time of all the container's processes and its memory usage less the
// inactive page cache. ErrNotFound for an unknown or exited workload.
func (d *Driver) Stats(ctx context.Context, req *runtime.StatsRequest) (*runtime.Stats, error) {
	if d.isClosed() {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, errClosed)
	}
	c, err := d.load(ctx, req.WorkloadID)
	if err != nil {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("stats of workload %s: no task: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, err)
	}
	m, err := task.Metrics(ctx)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, err)
	}
	out, err := decodeMetrics(m.Data.GetTypeUrl(), m.Data.GetValue())
	if err != nil {
		return nil, fmt.Errorf("stats of workload %s: %w", req.WorkloadID, err)
	}
	out.At = time.Now().UTC()
	if m.Timestamp != nil {
		out.At = m.Timestamp.AsTime().UTC()
	}
	return out, nil
}

// decodeMetrics reads the cgroup v1 or v2 metrics a shim reports.
func decodeMetrics(typeURL string, raw []byte) (*runtime.Stats, error) {
	switch {
	case strings.HasSuffix(typeURL, "io.containerd.cgroups.v1.Metrics"):
		var m v1.Metrics
		if err := proto.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("decode cgroup v1 metrics: %w", err)
		}
		s := &runtime.Stats{}
		if cpu := m.GetCPU().GetUsage(); cpu != nil {
			s.CPUSeconds = float64(cpu.GetTotal()) / 1e9
		}
		if mem := m.GetMemory(); mem != nil {
			s.MemoryBytes = int64(mem.GetUsage().GetUsage()) - int64(mem.GetTotalInactiveFile())
			if s.MemoryBytes <= 0 {
				s.MemoryBytes = int64(mem.GetRSS())
			}
		}
		return s, nil
	case strings.HasSuffix(typeURL, "io.containerd.cgroups.v2.Metrics"):
		var m v2.Metrics
		if err := proto.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("decode cgroup v2 metrics: %w", err)
		}
		s := &runtime.Stats{}
		if cpu := m.GetCPU(); cpu != nil {
			s.CPUSeconds = float64(cpu.GetUsageUsec()) / 1e6
		}
		if mem := m.GetMemory(); mem != nil {
			s.MemoryBytes = int64(mem.GetUsage()) - int64(mem.GetInactiveFile())
			if s.MemoryBytes <= 0 {
				s.MemoryBytes = int64(mem.GetAnon())
			}
		}
		return s, nil
	}
	return nil, fmt.Errorf("metrics of unknown type %q", typeURL)
}
