package caddy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/plugins/caddy"
	"github.com/berthhq/berth/sdk/provider"
)

// benchRoutes is the size of the tables BenchmarkCaddyApply applies.
const benchRoutes = 1000

// BenchmarkCaddyApply: how long putting a route table of 1,000 hostnames in
// force in the real Caddy takes (render, POST /load, Caddy's reload), each
// Apply a table whose upstreams moved, so every one is a real change.
func BenchmarkCaddyApply(b *testing.B) {
	ctx := context.Background()
	listen := freeAddrB(b)
	p, err := caddy.Open(ctx, caddy.Config{Admin: srv.Admin, Listen: listen, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	table := func(rev int) provider.Resource {
		tb := routes.Table{Revision: int64(rev)}
		for i := range benchRoutes {
			tb.Routes = append(tb.Routes, routes.Route{Hostname: fmt.Sprintf("s%d.bench.test", i), Project: "bench", Service: fmt.Sprintf("s%d", i),
				Upstreams: []routes.Upstream{{WorkloadID: fmt.Sprintf("wl_%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 10000+(i+rev)%5000), Healthy: true}}})
		}
		return tableResourceB(b, tb)
	}
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := table(i + 1)
		start := time.Now()
		if _, err := p.Apply(ctx, &provider.ApplyRequest{Planned: r, Mutation: pluginapi.Mutation{IdempotencyKey: fmt.Sprint("k", i), FencingToken: uint64(i + 1)}}); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "apply_1000_routes_ms")
}
