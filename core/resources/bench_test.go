package resources_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/core/resources"
)

// BenchmarkApply1000 declares 1,000 greetings and works the queue until every one is ready:
// resources applied per second through the operation queue on the embedded store, the
// provider in process (docs/resources.md section 6). Then it times one drift pass that reads
// all 1,000.
func BenchmarkApply1000(b *testing.B) {
	const n = 1000
	for range b.N {
		e := newEnv(b)
		ctx := context.Background()
		start := time.Now()
		for i := range n {
			if _, err := e.m.Apply(ctx, "prj_a", "a", decl(fmt.Sprintf("g%04d", i), `{"message":"hi"}`)); err != nil {
				b.Fatal(err)
			}
		}
		declared := time.Since(start)
		for range 10 * n {
			k, err := e.m.Work(ctx, 64)
			if err != nil {
				b.Fatal(err)
			}
			if k == 0 {
				break
			}
		}
		total := time.Since(start)
		all, err := e.m.List(ctx, "")
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range all {
			if r.Status != resources.StatusReady {
				b.Fatalf("%s: %s", r.ID, r.Status)
			}
		}
		e.clk.add(time.Hour)
		t0 := time.Now()
		reads := 0
		for reads < n {
			k, err := e.m.DriftPass(ctx)
			if err != nil || k == 0 {
				b.Fatalf("drift pass: %d, %v", k, err)
			}
			reads += k
		}
		drift := time.Since(t0)
		b.ReportMetric(float64(n)/total.Seconds(), "resources/s")
		b.ReportMetric(float64(n)/declared.Seconds(), "declared/s")
		b.ReportMetric(drift.Seconds(), "drift-s/1000")
	}
}
