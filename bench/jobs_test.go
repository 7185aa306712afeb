package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// Shape of BenchmarkJobStartLatency.
const (
	latencyJobs = 100
	// latencyLead is how long before their common fire time the jobs' applies start: room for
	// 100 applies on a loaded machine.
	latencyLead = 40 * time.Second
)

// percentile returns the p-th percentile (0 < p <= 1, nearest rank) of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	i := int(float64(len(ds))*p+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// placedTimes reads, from berthd's info log, when each run was placed ("job run placed").
func placedTimes(b *testing.B, logPath string) map[string]time.Time {
	b.Helper()
	f, err := os.Open(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, `msg="job run placed"`) {
			continue
		}
		var at time.Time
		var run string
		for _, kv := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(kv, "time="); ok {
				at, _ = time.Parse(time.RFC3339Nano, v)
			} else if v, ok := strings.CutPrefix(kv, "run="); ok {
				run = v
			}
		}
		if run != "" && !at.IsZero() {
			out[run] = at
		}
	}
	return out
}

// BenchmarkJobStartLatency measures, with real processes (berthd on its embedded store, one
// berth-agent with the process driver, on loopback), the start latency of 100 jobs that fire in
// the same minute (docs/jobs.md section 7): from the fire time to the run's process started, as
// the node reports it, p50 and p99; and the two halves of it, fire time to placed (the core's
// one-second pass: dispatch and placement, read from berthd's log) and placed to started (the
// node's desired state written, sent and acted on). The jobs are "M * * * *" for the first
// minute M at least latencyLead ahead, running a script that exits 0. The scenario runs once
// whatever b.N; run with -benchtime 1x. core/jobs BenchmarkPassPlaces100 measures the pass alone.
func BenchmarkJobStartLatency(b *testing.B) {
	bin := binaries(b)
	cl := startApplyCluster(b, bin, 1, "--log-level", "info")
	ctx := context.Background()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job"), []byte("#!/bin/sh\necho ran\nexit 0\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, dir, &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "job", &buf); err != nil {
		b.Fatal(err)
	}
	fire := time.Now().Add(latencyLead).Truncate(time.Minute).Add(time.Minute).UTC()
	spec := fmt.Sprintf("%d * * * *", fire.Minute())
	names := make([]string, latencyJobs)
	for i := range names {
		names[i] = fmt.Sprintf("job-%03d", i)
		if _, err := cl.c.ApplyService(ctx, "default", names[i], client.ServiceSpec{Kind: "job", Bundle: "job", Command: []string{"./job"},
			Job: &client.JobSpec{Schedule: spec}}); err != nil {
			b.Fatalf("apply %s: %v", names[i], err)
		}
	}
	if left := time.Until(fire); left < 5*time.Second {
		b.Fatalf("the applies ended %s before the fire time; raise latencyLead", left)
	}
	b.ResetTimer()
	started := make(map[string]time.Time, latencyJobs)
	// The node's start times are what is measured, not when this loop sees them: one listing
	// every 500 ms keeps the poll from loading berthd while it places the runs.
	proctest.WaitForEvery(b, time.Until(fire)+applyLimit, 500*time.Millisecond, "every run started", func() (bool, string) {
		if time.Now().Before(fire) {
			return false, "before the fire time"
		}
		js, err := cl.c.Jobs(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		for _, j := range js {
			if r := j.LastRun; r != nil && r.FireTime.Equal(fire) && !r.StartedAt.IsZero() {
				started[j.Name] = r.StartedAt
			}
		}
		return len(started) == latencyJobs, fmt.Sprintf("%d/%d started", len(started), latencyJobs)
	})
	b.StopTimer()
	placed := placedTimes(b, cl.berthd.LogPath())
	var total, toPlaced, toStarted []time.Duration
	for _, name := range names {
		s := started[name]
		total = append(total, s.Sub(fire))
		if p, ok := placed["default/"+name+"@"+fire.Format(time.RFC3339)]; ok {
			toPlaced = append(toPlaced, p.Sub(fire))
			toStarted = append(toStarted, s.Sub(p))
		}
	}
	if len(toPlaced) != latencyJobs {
		b.Fatalf("berthd logged the placing of %d of %d runs", len(toPlaced), latencyJobs)
	}
	for _, ds := range [][]time.Duration{total, toPlaced, toStarted} {
		slices.Sort(ds)
	}
	b.ReportMetric(percentile(total, 0.5).Seconds(), "start_p50_s")
	b.ReportMetric(percentile(total, 0.99).Seconds(), "start_p99_s")
	b.ReportMetric(percentile(toPlaced, 0.5).Seconds(), "placed_p50_s")
	b.ReportMetric(percentile(toPlaced, 0.99).Seconds(), "placed_p99_s")
	b.ReportMetric(percentile(toStarted, 0.5).Seconds(), "placed_to_started_p50_s")
	b.ReportMetric(percentile(toStarted, 0.99).Seconds(), "placed_to_started_p99_s")
	b.Logf("%d jobs firing at %s: fire to started p50 %s p99 %s max %s; fire to placed p50 %s p99 %s; placed to started p50 %s p99 %s",
		latencyJobs, fire.Format(time.RFC3339), percentile(total, 0.5), percentile(total, 0.99), total[len(total)-1],
		percentile(toPlaced, 0.5), percentile(toPlaced, 0.99), percentile(toStarted, 0.5), percentile(toStarted, 0.99))
}
