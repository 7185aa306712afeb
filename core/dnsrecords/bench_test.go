package dnsrecords_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/knottest"
)

// BenchmarkPresentTXT is the time from PresentTXT to the DNS server holding the value, through
// the store, the operation queue, the real plugin process and a real knot: what a DNS-01 order
// waits per challenge before it asks the CA to validate. Figures: p50_ms and max_ms.
func BenchmarkPresentTXT(b *testing.B) {
	k := knottest.Start(b, "example.test")
	dir := b.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unlock() })
	st, err := store.Open(context.Background(), store.Config{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close(context.Background()) })
	g := addBerthd(b, k, st)
	var each []time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("_acme-challenge.h%d.example.test.", i)
		start := time.Now()
		if err := g.r.PresentTXT(b.Context(), name, "value"); err != nil {
			b.Fatal(err)
		}
		each = append(each, time.Since(start))
	}
	slices.Sort(each)
	b.ReportMetric(float64(each[len(each)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(each[len(each)-1].Microseconds())/1000, "max_ms")
}
