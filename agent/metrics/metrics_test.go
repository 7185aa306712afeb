package metrics

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

func writeProc(t *testing.T, dir, stat, meminfo string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "meminfo"), []byte(meminfo), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRingSamplesAndForgets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Unix(1700000000, 0)
	cpu := 10.0
	r := New(Config{ProcDir: dir, Interval: 5 * time.Second, Window: time.Minute, Now: func() time.Time { return now },
		Workloads: func(context.Context) ([]WorkloadStat, error) {
			return []WorkloadStat{{WorkloadID: "wl_a", CPUSeconds: cpu, RSSBytes: 4096}}, nil
		}})
	mem := "MemTotal:       1000 kB\nMemAvailable:    250 kB\n"
	writeProc(t, dir, "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\ncpu1 1 0 0 0 0 0 0 0 0 0\n", mem)
	ctx := context.Background()
	r.Sample(ctx)
	if m := r.Query(node.MetricsQuery{Node: true}); len(m.Node) != 0 {
		t.Fatalf("first sample only primes: %+v", m.Node)
	}
	// 100 more busy and 100 more idle jiffies: 50 % busy; 2.5 CPU s in 5 s.
	now = now.Add(5 * time.Second)
	cpu += 2.5
	writeProc(t, dir, "cpu  150 0 150 800 100 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\ncpu1 1 0 0 0 0 0 0 0 0 0\n", mem)
	r.Sample(ctx)
	m := r.Query(node.MetricsQuery{Node: true, WorkloadIDs: []string{"wl_a", "wl_gone"}})
	if len(m.Node) != 1 || m.Node[0].CPUUsage != 0.5 || m.Node[0].CPUCount != 2 || m.Node[0].MemoryUsedBytes != 750*1024 || m.Node[0].MemoryTotalBytes != 1000*1024 {
		t.Fatalf("node samples %+v", m.Node)
	}
	if len(m.Workloads) != 2 || len(m.Workloads[0].Samples) != 1 || m.Workloads[0].Samples[0].CPUUsage != 0.5 || len(m.Workloads[1].Samples) != 0 {
		t.Fatalf("workload samples %+v", m.Workloads)
	}
	// Past the window the samples are gone.
	now = now.Add(2 * time.Minute)
	writeProc(t, dir, "cpu  150 0 150 900 100 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\n", mem)
	r.Sample(ctx)
	m = r.Query(node.MetricsQuery{Node: true, WorkloadIDs: []string{"wl_a"}})
	if len(m.Node) != 1 || len(m.Workloads[0].Samples) != 1 || !m.Node[0].Time.Equal(now.UTC()) {
		t.Fatalf("after the window: %+v", m)
	}
}

func TestRealProc(t *testing.T) {
	t.Parallel()
	if _, _, _, err := readStat("/proc"); err != nil {
		t.Fatal(err)
	}
	if total, avail, err := readMeminfo("/proc"); err != nil || total <= 0 || avail <= 0 {
		t.Fatalf("meminfo %d %d %v", total, avail, err)
	}
}
