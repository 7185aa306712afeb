// Package metrics owns the agent's in-memory metrics ring: node samples from
// /proc/stat and /proc/meminfo and workload samples from the runtime driver,
// kept for 10 minutes and never written to disk (docs/node-protocol.md section 5.17).
package metrics

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Defaults of [Config].
const (
	DefaultInterval = 5 * time.Second
	DefaultWindow   = 10 * time.Minute
)

// WorkloadStat is one workload's counters as the runtime driver reports them:
// CPUSeconds is cumulative CPU time, RSSBytes resident memory.
type WorkloadStat struct {
	WorkloadID string
	CPUSeconds float64
	RSSBytes   int64
}

// Config configures a [Ring]. Every field is optional.
type Config struct {
	// Interval between samples; zero means 5 s.
	Interval time.Duration
	// Window is how long samples are kept; zero means 10 minutes.
	Window time.Duration
	// ProcDir is where stat and meminfo are read; empty means /proc.
	ProcDir string
	// Workloads returns the counters of the running workloads; nil means
	// node samples only. An error skips this interval's workload samples.
	Workloads func(ctx context.Context) ([]WorkloadStat, error)
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Ring samples every interval and keeps the samples of the window in
// memory. Safe for concurrent use: [Ring.Run] writes, [Ring.Query] reads.
type Ring struct {
	cfg Config

	mu       sync.Mutex
	node     []node.NodeSample
	work     map[string][]node.WorkloadSample
	prevBusy uint64
	prevAll  uint64
	prevCPU  map[string]float64
	prevAt   time.Time
}

// New returns a Ring; nothing is sampled until [Ring.Run] or [Ring.Sample].
func New(cfg Config) *Ring {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Ring{cfg: cfg, work: map[string][]node.WorkloadSample{}, prevCPU: map[string]float64{}}
}

// Run samples every interval until ctx ends.
func (r *Ring) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	r.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Sample(ctx)
		}
	}
}

// Sample takes one sample now and drops samples older than the window. The
// first sample only primes the CPU counters: usage needs two readings.
func (r *Ring) Sample(ctx context.Context) {
	now := r.cfg.Now().UTC()
	busy, all, cpus, errCPU := readStat(r.cfg.ProcDir)
	total, avail, errMem := readMeminfo(r.cfg.ProcDir)
	var stats []WorkloadStat
	if r.cfg.Workloads != nil {
		stats, _ = r.cfg.Workloads(ctx)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	primed := !r.prevAt.IsZero()
	elapsed := now.Sub(r.prevAt).Seconds()
	if errCPU == nil && errMem == nil && primed && all > r.prevAll {
		r.node = append(r.node, node.NodeSample{
			Time: now, CPUUsage: float64(busy-r.prevBusy) / float64(all-r.prevAll), CPUCount: cpus,
			MemoryTotalBytes: total, MemoryUsedBytes: total - avail,
		})
	}
	if errCPU == nil {
		r.prevBusy, r.prevAll = busy, all
	}
	seen := map[string]bool{}
	for _, st := range stats {
		seen[st.WorkloadID] = true
		prev, ok := r.prevCPU[st.WorkloadID]
		r.prevCPU[st.WorkloadID] = st.CPUSeconds
		if !ok || !primed || elapsed <= 0 || st.CPUSeconds < prev {
			continue
		}
		r.work[st.WorkloadID] = append(r.work[st.WorkloadID], node.WorkloadSample{
			Time: now, CPUUsage: (st.CPUSeconds - prev) / elapsed, MemoryRSSBytes: st.RSSBytes,
		})
	}
	for id := range r.prevCPU {
		if !seen[id] {
			delete(r.prevCPU, id)
		}
	}
	r.prevAt = now
	cut := now.Add(-r.cfg.Window)
	r.node = trim(r.node, func(s node.NodeSample) time.Time { return s.Time }, cut)
	for id, ss := range r.work {
		if ss = trim(ss, func(s node.WorkloadSample) time.Time { return s.Time }, cut); len(ss) == 0 {
			delete(r.work, id)
		} else {
			r.work[id] = ss
		}
	}
}

func trim[T any](ss []T, at func(T) time.Time, cut time.Time) []T {
	i := 0
	for i < len(ss) && at(ss[i]).Before(cut) {
		i++
	}
	return append(ss[:0:0], ss[i:]...)
}

// Query answers metrics_query: copies of the kept samples, oldest first.
func (r *Ring) Query(q node.MetricsQuery) node.Metrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := node.Metrics{IntervalS: r.cfg.Interval.Seconds()}
	if q.Node {
		out.Node = append([]node.NodeSample{}, r.node...)
	}
	for _, id := range q.WorkloadIDs {
		out.Workloads = append(out.Workloads, node.WorkloadSamples{WorkloadID: id, Samples: append([]node.WorkloadSample{}, r.work[id]...)})
	}
	return out
}

// readStat returns the busy and total jiffies of all CPUs and the CPU count
// from stat: busy is everything but idle and iowait.
func readStat(dir string) (busy, all uint64, cpus int, err error) {
	raw, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("metrics: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	found := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "cpu":
			found = true
			for i, v := range f[1:] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, 0, 0, fmt.Errorf("metrics: stat cpu field %d: %w", i, err)
				}
				if i >= 8 { // guest and guest_nice are already in user and nice
					break
				}
				all += n
				if i != 3 && i != 4 { // idle, iowait
					busy += n
				}
			}
		case strings.HasPrefix(f[0], "cpu"):
			cpus++
		}
	}
	if !found {
		return 0, 0, 0, fmt.Errorf("metrics: no cpu line in %s/stat", dir)
	}
	return busy, all, cpus, nil
}

// readMeminfo returns MemTotal and MemAvailable in bytes.
func readMeminfo(dir string) (total, avail int64, err error) {
	raw, err := os.ReadFile(dir + "/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = n * 1024
		case "MemAvailable:":
			avail = n * 1024
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("metrics: no MemTotal in %s/meminfo", dir)
	}
	return total, avail, nil
}
