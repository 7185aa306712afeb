package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
)

// leaseBacklog is how many stateful services already have a lease before measuring.
const leaseBacklog = 200

// BenchmarkLeases measures the lease authority on the embedded store (docs/node-protocol.md
// section 8): grants of new leases per second, and renewals per second of an expiring lease (each
// one compare-and-set on the lease document, what every lease_renew costs the core), and the
// fencing guard's checks per second.
func BenchmarkLeases(b *testing.B) {
	ctx := context.Background()
	st := openStore(b)
	auth := fencing.New(st, fencing.Config{})
	grant := func(i int) *fencing.Lease {
		l, _, err := auth.Grant(ctx, fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: fmt.Sprintf("svc_bench%06d", i),
			NodeID: "nod_bench", Mode: node.LeaseExpiring, Duration: 15 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	renew := func(b *testing.B) {
		l := grant(-1)
		for b.Loop() {
			if _, err := auth.Renew(ctx, l.ID, "nod_bench", l.FencingToken); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "renewals/s")
	}
	// Alone in its collection first: FerretDB v1 resolves a filter on _id alone through its
	// primary key, but a compare-and-set filter (_id and revision) scans the collection, so the
	// cost of a renewal grows with the number of leases.
	b.Run("renew_1_lease", renew)
	for i := range leaseBacklog {
		grant(i)
	}
	b.Run("grant", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			grant(leaseBacklog + i)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
	})
	b.Run(fmt.Sprintf("renew_%d_leases", leaseBacklog), renew)
	b.Run("guard", func(b *testing.B) {
		g := fencing.NewGuard(st, nil)
		for b.Loop() {
			if err := g.Check(ctx, "svc_bench", 1); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
	})
}
