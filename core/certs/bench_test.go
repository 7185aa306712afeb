package certs_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	abiroutes "github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/core/store"
)

// benchRounds is the number of hostnames one op certifies, one after the
// other, so one run yields a median.
const benchRounds = 5

// BenchmarkIssueWithPebble: the time from a table asking a certificate for a
// new hostname (HTTP-01, answered from the table) to the table carrying a
// certificate for it, against the package's pebble and the embedded store.
// Figures: cert_p50_ms and cert_max_ms over benchRounds hostnames per op.
func BenchmarkIssueWithPebble(b *testing.B) {
	dir := b.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = unlock() }()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close(context.Background()) }()
	s := newSink(b)
	m := newManager(b, st, keyring(b), "brd_bench", s, nil)
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N * benchRounds {
		host := fmt.Sprintf("bench-%d-%d.example.com", time.Now().UnixNano(), i)
		start := time.Now()
		if err := m.SetRoutes(ctx, table(route(host, abiroutes.TLSACME))); err != nil {
			b.Fatal(err)
		}
		s.await(b, "the certificate of "+host, func(t abiroutes.Table) bool { _, ok := certFor(t, host); return ok })
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "cert_p50_ms")
	b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "cert_max_ms")
}
