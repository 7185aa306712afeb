package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/services"
)

// BenchmarkNext measures one fire-time search of a daily wall-clock schedule in a zone with
// daylight saving, from instants spread over a year.
func BenchmarkNext(b *testing.B) {
	c, err := jobs.Schedule{Cron: "30 2 * * *", TimeZone: "Europe/Berlin"}.Compile()
	if err != nil {
		b.Fatal(err)
	}
	t0 := utc("2026-01-01T00:00:00Z")
	i := 0
	for b.Loop() {
		_ = c.Next(t0.Add(time.Duration(i%8760) * time.Hour))
		i++
	}
}

// BenchmarkPassPlaces100 measures the controller's pass (docs/jobs.md section 7) over 100 jobs
// that fire at the same instant, on the embedded store with one node, in the steady state: the
// node has reported the previous minute's 100 runs succeeded, so the pass ends those (outcome,
// workload removed, history pruned), records the 100 new fire times and places them. It
// reports the pass (ns/op) and its share per job (ms/run): the fire-to-placed half of the start
// latency bench/ measures end to end, without berthd's other work.
func BenchmarkPassPlaces100(b *testing.B) {
	const n = 100
	t0 := utc("2026-12-02T10:00:30Z")
	f := newControllerFixture(b, "forbid", t0)
	p, _, err := f.cat.EnsureProject(testCtx(b), "default")
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		f.addJob(b, p, fmt.Sprintf("job-%03d", i), "@every 1m", "forbid")
	}
	f.pass(b, t0) // starts the cursors
	i := 0
	for b.Loop() {
		b.StopTimer()
		ws, err := f.cat.ListWorkloads(testCtx(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		zero := 0
		for _, w := range ws {
			if w.JobRun != "" {
				f.report(b, jobs.Run{ID: w.JobRun, WorkloadID: w.ID}, services.JobOutcome{Result: node.JobSucceeded, Attempts: 1, ExitCode: &zero})
			}
		}
		i++
		b.StartTimer()
		f.pass(b, t0.Add(time.Duration(i)*time.Minute).Add(-30*time.Second))
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(i)/n, "ms/run")
}
