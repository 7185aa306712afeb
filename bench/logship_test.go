package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// logShipWindow is how long the agent's CPU is measured while a workload writes.
const logShipWindow = 30 * time.Second

// cpuTicks returns the user and system CPU time of process pid, in clock ticks (1/100 s).
func cpuTicks(b *testing.B, pid int) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) start after the last ')'.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime
}

// nextSeq is one past the newest record of the log directory dir.
func nextSeq(b *testing.B, dir string) int64 {
	b.Helper()
	segs, _ := logseg.Segments(dir)
	from := int64(1)
	if len(segs) > 0 {
		from = segs[len(segs)-1].LastSeq + 1
	}
	next, err := logseg.ReadFrom(dir, from, func(logseg.Record) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	return next
}

// BenchmarkAgentLogShipping measures the node agent's CPU while one workload writes about
// 10,000 lines per second through its log writer and the agent ships the sealed segments (the
// defaults: 4 MiB segments) to berthd over its session (docs/logs.md section 6). The figure is
// the agent process's CPU (user and system, % of one core) scaled to 10,000 lines per second;
// the log writer and the driver plugin are other processes and not counted.
func BenchmarkAgentLogShipping(b *testing.B) {
	bin := binaries(b)
	cl := startApplyCluster(b, bin, 1)
	ctx := context.Background()
	dir := b.TempDir()
	script := "#!/bin/sh\nwhile true; do seq 1 1000; sleep 0.1; done\n"
	if err := os.WriteFile(filepath.Join(dir, "spew"), []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, dir, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "spew", &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.ApplyService(ctx, "default", "spew", client.ServiceSpec{Bundle: "spew", Command: []string{"./spew"}}); err != nil {
		b.Fatal(err)
	}
	var logDir string
	waitUntil(b, applyLimit, "the workload writing", func() (bool, string) {
		ws, err := cl.c.ListWorkloads(ctx, "default")
		if err != nil || len(ws) != 1 {
			return false, fmt.Sprint(ws, err)
		}
		logDir = filepath.Join(cl.dir, "agent-0", "workloads", ws[0].ID, "output.segments")
		_, err = os.Stat(filepath.Join(logDir, logseg.CurrentFile))
		return err == nil, fmt.Sprint(err)
	})
	pid := cl.agents[0].Cmd().Process.Pid
	b.ResetTimer()
	var cpuPct, rate float64
	for range b.N {
		seq0, cpu0, t0 := nextSeq(b, logDir), cpuTicks(b, pid), time.Now()
		time.Sleep(logShipWindow)
		seq1, cpu1, t1 := nextSeq(b, logDir), cpuTicks(b, pid), time.Now()
		secs := t1.Sub(t0).Seconds()
		rate = float64(seq1-seq0) / secs
		cpuPct = float64(cpu1-cpu0) / 100 / secs * 100
	}
	b.StopTimer()
	shipped := 0
	segs, _ := logseg.Segments(logDir)
	for _, s := range segs {
		if logseg.Shipped(logDir, s.Name) {
			shipped++
		}
	}
	if shipped == 0 {
		b.Fatalf("no segment was shipped in %s (%d sealed)", logShipWindow, len(segs))
	}
	b.ReportMetric(rate, "lines/s")
	b.ReportMetric(cpuPct, "agent_cpu_%")
	b.ReportMetric(cpuPct*10000/rate, "agent_cpu_%_per_10k_lines/s")
	b.ReportMetric(float64(shipped), "segments_shipped")
}
