package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/reconciler"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/rollout/rollouttest"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/core/store"
)

// Shape of BenchmarkSweep1000x3 (docs/reconciliation.md section 6).
const (
	sweepNodes    = 10
	sweepReplicas = 3
	// sweepMaxPasses bounds every wait for convergence, in reconcile passes.
	sweepMaxPasses = 60
	// sweepPhaseLimit bounds every wait for convergence, in wall time.
	sweepPhaseLimit = 30 * time.Minute
)

// sweepServices is the number of services BenchmarkSweep1000x3 declares: 1,000, or
// BERTH_BENCH_SWEEP_SERVICES.
func sweepServices(b *testing.B) int {
	b.Helper()
	v := os.Getenv("BERTH_BENCH_SWEEP_SERVICES")
	if v == "" {
		return 1000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("BERTH_BENCH_SWEEP_SERVICES=%q: want a positive count", v)
	}
	return n
}

// sweepFleet is the real reconciler and producer on the embedded store, with nodes simulated
// the way an agent reports: after each pass every node reads its stored desired state, reports
// each desired running workload running and passing and each desired stopped one stopped,
// then acknowledges the desired revision it read.
type sweepFleet struct {
	b     *testing.B
	ctx   context.Context
	st    *store.Store
	reg   *nodes.Registry
	cat   *services.Catalog
	rs    *rollout.Store
	prod  *rollout.Producer
	rec   *reconciler.Reconciler
	p     *services.Project
	nodes []string
	svcs  []string // service names
}

func newSweepFleet(b *testing.B, nodeCount int) *sweepFleet {
	b.Helper()
	f := &sweepFleet{b: b, ctx: context.Background(), st: openStore(b)}
	f.reg = nodes.NewRegistry(f.st, nil)
	f.cat = services.NewCatalog(f.st, nil)
	f.rs = rollout.NewStore(f.st, f.cat, nil)
	f.prod = rollout.NewProducer(rollout.Config{Store: f.rs, Catalog: f.cat, Nodes: f.reg})
	f.rec = reconciler.New(reconciler.Config{Catalog: f.cat, Nodes: f.reg, Compiler: routes.Native{}, Rollout: f.prod})
	// The indexes berthd creates at start (core/server).
	if err := f.reg.EnsureIndexes(f.ctx); err != nil {
		b.Fatal(err)
	}
	if err := f.cat.EnsureIndexes(f.ctx); err != nil {
		b.Fatal(err)
	}
	for i := range nodeCount {
		tok, _, err := f.reg.CreateJoinToken(f.ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		n, _, err := f.reg.Enroll(f.ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub),
			Hostname: fmt.Sprintf("bench-%02d", i), Address: "127.0.0.1"})
		if err != nil {
			b.Fatal(err)
		}
		if err := f.reg.SessionStarted(f.ctx, n.ID, "ses_"+n.ID, "bench", []string{"process"}); err != nil {
			b.Fatal(err)
		}
		f.nodes = append(f.nodes, n.ID)
	}
	var err error
	if f.p, _, err = f.cat.EnsureProject(f.ctx, "default"); err != nil {
		b.Fatal(err)
	}
	return f
}

// putAll creates or updates every service of the fleet with release digest.
func (f *sweepFleet) putAll(count int, release string) {
	f.b.Helper()
	for i := range count {
		name := fmt.Sprintf("svc-%04d", i)
		if _, _, err := f.cat.PutService(f.ctx, f.p, &services.Service{Name: name, BundleDigest: release, Command: []string{"./web"},
			Port: 8080, Replicas: sweepReplicas}, nil); err != nil {
			f.b.Fatalf("put %s: %v", name, err)
		}
		if len(f.svcs) < count {
			f.svcs = append(f.svcs, name)
		}
	}
}

// pass runs one reconcile pass and returns its duration.
func (f *sweepFleet) pass() time.Duration {
	f.b.Helper()
	start := time.Now()
	if err := f.rec.Pass(f.ctx); err != nil {
		f.b.Fatalf("pass: %v", err)
	}
	return time.Since(start)
}

// report lets every node apply its desired state and report on it; it returns the duration.
func (f *sweepFleet) report() time.Duration {
	f.b.Helper()
	start := time.Now()
	for _, id := range f.nodes {
		if err := rollouttest.Report(f.ctx, f.reg, f.cat, id, nil); err != nil {
			f.b.Fatal(err)
		}
	}
	return time.Since(start)
}

// verdicts returns every stored verdict by service id.
func (f *sweepFleet) verdicts() map[string]slots.Verdict {
	f.b.Helper()
	cur, err := f.st.Collection("runtime_status").Find(f.ctx, map[string]any{})
	if err != nil {
		f.b.Fatal(err)
	}
	var docs []rollout.StatusDoc
	if err := cur.All(f.ctx, &docs); err != nil {
		f.b.Fatal(err)
	}
	out := make(map[string]slots.Verdict, len(docs))
	for _, d := range docs {
		out[d.ServiceID] = d.Verdict
	}
	return out
}

// slotSets returns every stored slot set by service id.
func (f *sweepFleet) slotSets() map[string]rollout.SlotSet {
	f.b.Helper()
	cur, err := f.st.Collection("slots").Find(f.ctx, map[string]any{})
	if err != nil {
		f.b.Fatal(err)
	}
	var docs []rollout.SlotSet
	if err := cur.All(f.ctx, &docs); err != nil {
		f.b.Fatal(err)
	}
	out := make(map[string]rollout.SlotSet, len(docs))
	for _, d := range docs {
		out[d.ServiceID] = d
	}
	return out
}

// attempts returns the ids of every slot attempt standing now.
func (f *sweepFleet) attempts() map[string]bool {
	out := map[string]bool{}
	for _, set := range f.slotSets() {
		for _, r := range set.Slots {
			out[r.Attempt.ID] = true
		}
	}
	return out
}

// converged reports whether count services hold a converged verdict and, when old is not nil,
// every one of their slots runs an attempt that is not in old, at generation 1. It also
// returns how many services are converged in that sense.
func (f *sweepFleet) converged(count int, old map[string]bool) (bool, int) {
	vs := f.verdicts()
	var sets map[string]rollout.SlotSet
	if old != nil {
		sets = f.slotSets()
	}
	n := 0
	for id, v := range vs {
		if v.State != slots.Converged {
			continue
		}
		if old != nil {
			set := sets[id]
			fresh := len(set.Slots) == sweepReplicas
			for _, r := range set.Slots {
				if old[r.Attempt.ID] || r.Generation != int(slots.GenRun) {
					fresh = false
				}
			}
			if !fresh {
				continue
			}
		}
		n++
	}
	return n >= count, n
}

// untilConverged runs pass and report until converged holds, within sweepMaxPasses and
// sweepPhaseLimit. It returns the passes run, the total time and the longest pass.
func (f *sweepFleet) untilConverged(what string, count int, old map[string]bool) (passes int, total, longest time.Duration) {
	f.b.Helper()
	start := time.Now()
	for passes < sweepMaxPasses && time.Since(start) < sweepPhaseLimit {
		d := f.pass()
		longest = max(longest, d)
		r := f.report()
		passes++
		ok, n := f.converged(count, old)
		f.b.Logf("%s: pass %d took %.2f s, reports %.2f s, %d/%d converged", what, passes, d.Seconds(), r.Seconds(), n, count)
		if ok {
			return passes, time.Since(start), longest
		}
	}
	_, n := f.converged(count, old)
	f.b.Fatalf("%s: %d/%d services converged after %d passes and %s", what, n, count, passes, time.Since(start).Round(time.Second))
	return
}

// BenchmarkSweep1000x3 measures reconciliation of 1,000 portable services of 3 replicas
// (BERTH_BENCH_SWEEP_SERVICES overrides the count) on 10 simulated nodes, with the real
// reconciler and rollout producer on the embedded store (docs/reconciliation.md sections 5 to
// 7): the first pass that places every slot, the passes until every verdict is converged, a
// steady pass and a steady rollout sweep with nothing to do, and a new release of every service
// until all converged again. The scenario runs once whatever b.N; run with -benchtime 1x.
func BenchmarkSweep1000x3(b *testing.B) {
	count := sweepServices(b)
	f := newSweepFleet(b, sweepNodes)
	f.putAll(count, "sha256:aaaa")

	b.ResetTimer()
	firstStart := time.Now()
	firstPass := f.pass()
	f.report()
	firstPasses := 1
	if ok, n := f.converged(count, nil); !ok {
		b.Logf("first: pass 1 took %.2f s, %d/%d converged", firstPass.Seconds(), n, count)
		p, _, _ := f.untilConverged("first", count, nil)
		firstPasses += p
	}
	firstTotal := time.Since(firstStart)

	steady := f.pass()
	svcs, err := f.cat.ListServices(f.ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	ns, err := f.reg.List(f.ctx)
	if err != nil {
		b.Fatal(err)
	}
	wls, err := f.cat.ListWorkloads(f.ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	out, err := f.prod.Sweep(f.ctx, svcs, ns, placement.UsageOf(svcs, wls))
	steadyRollout := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	if out.Commits != 0 || out.Changed {
		b.Errorf("steady rollout sweep %+v: it should have had nothing to do", out)
	}

	old := f.attempts()
	putStart := time.Now()
	f.putAll(count, "sha256:bbbb")
	put := time.Since(putStart)
	rolloutPasses, rolloutTotal, rolloutLongest := f.untilConverged("rollout", count, old)
	b.StopTimer()

	b.ReportMetric(float64(count), "services")
	b.ReportMetric(float64(count*sweepReplicas), "slots")
	b.ReportMetric(firstPass.Seconds(), "first_pass_s")
	b.ReportMetric(firstTotal.Seconds(), "first_converge_s")
	b.ReportMetric(float64(firstPasses), "first_passes")
	b.ReportMetric(steady.Seconds(), "steady_sweep_s")
	b.ReportMetric(steadyRollout.Seconds(), "steady_rollout_sweep_s")
	b.ReportMetric(rolloutTotal.Seconds(), "rollout_all_s")
	b.ReportMetric(float64(rolloutPasses), "rollout_passes")
	b.ReportMetric(rolloutLongest.Seconds(), "rollout_longest_pass_s")
	b.Logf("%d services x %d replicas on %d nodes: first pass %.2f s, converged after %d passes in %.2f s; steady pass %.2f s, "+
		"steady rollout sweep %.2f s (%d services visited); release change written in %.2f s, all converged again after %d passes "+
		"in %.2f s (longest pass %.2f s; pass and node reports, without the writes)",
		count, sweepReplicas, sweepNodes, firstPass.Seconds(), firstPasses, firstTotal.Seconds(), steady.Seconds(), steadyRollout.Seconds(),
		out.Services, put.Seconds(), rolloutPasses, rolloutTotal.Seconds(), rolloutLongest.Seconds())
}
