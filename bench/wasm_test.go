// Package bench measures Berth: run with make bench, which prints one
// "name value unit" figure per line.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/routes"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/prometheus/client_golang/prometheus"
)

// policyInput is a typical service.apply input of about 1 KB.
func policyInput(b *testing.B) []byte {
	b.Helper()
	svc := abiwasm.Service{
		Project: "shop", Name: "cart", Revision: 7, Bundle: "cart", BundleDigest: "sha256:" + strings.Repeat("ab", 32),
		Command: []string{"./cart", "--listen", ":8080"}, Env: map[string]string{"LOG_LEVEL": "info", "REGION": "eu-1", "FEATURE_X": "on"},
		Port: 8080, Domains: []string{"cart.shop.example.com", "www.shop.example.com"}, Replicas: 3, CapacityUnits: 2,
		Labels: map[string]string{"team": "checkout", "tier": "backend"},
	}
	obj, _ := json.Marshal(svc)
	cfg := json.RawMessage(`{"labels":["team","tier"],"max_replicas":50,"max_capacity_units":100,"zones":{"shop":["shop.example.com"]}}`)
	in, _ := json.Marshal(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_01"},
		Project: &abiwasm.Project{Name: "shop", Services: 4, Replicas: 9, CapacityUnits: 18}, Object: obj, OldObject: obj, Config: cfg})
	return in
}

// measure runs fn b.N times and reports evaluations per second and p99.
func measure(b *testing.B, fn func() error) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	total := time.Since(start)
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(b.N)/total.Seconds(), "evals/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func newRuntime(b *testing.B) *hostwasm.Runtime {
	b.Helper()
	rt, err := hostwasm.New(context.Background(), hostwasm.Config{CacheDir: wasmtest.CacheDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt
}

// BenchmarkPolicy evaluates each example policy, Go and AssemblyScript
// guests, through host/wasm on one goroutine, and the same require-digest
// policy written natively in Go.
func BenchmarkPolicy(b *testing.B) {
	ctx := context.Background()
	in := policyInput(b)
	modules := map[string][]byte{}
	for _, p := range []string{"require-digest", "require-labels", "cap-replicas", "domain-zones"} {
		modules[p+"/go"] = wasmtest.BuildGo(b, "examples/policies/"+p)
	}
	as, err := os.ReadFile(wasmtest.RepoRoot(b) + "/examples/policies/require-digest-as/policy.wasm")
	if err != nil {
		b.Fatal(err)
	}
	modules["require-digest/assemblyscript"] = as
	names := make([]string, 0, len(modules))
	for n := range modules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			rt := newRuntime(b)
			m, err := rt.Load(ctx, modules[name])
			if err != nil {
				b.Fatal(err)
			}
			measure(b, func() error { _, err := m.EvaluateJSON(ctx, in); return err })
		})
	}
	b.Run("require-digest/native", func(b *testing.B) {
		measure(b, func() error { _, err := nativeRequireDigest(in); return err })
	})
}

// nativeRequireDigest is examples/policies/require-digest written as plain Go
// over the same JSON, for the ratio.
func nativeRequireDigest(input []byte) ([]byte, error) {
	var in abiwasm.PolicyInput
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	var s abiwasm.Service
	if err := json.Unmarshal(in.Object, &s); err != nil {
		return nil, err
	}
	out := abiwasm.PolicyOutput{Decision: abiwasm.Allow}
	if s.Bundle != "" && !strings.HasPrefix(s.Bundle, "sha256:") {
		out = abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: []string{"bundle " + s.Bundle + " is not named by digest; use sha256:<hex>"}}
	}
	if s.Image != "" && !strings.Contains(s.Image, "@sha256:") {
		out.Decision = abiwasm.Deny
		out.Reasons = append(out.Reasons, "image "+s.Image+" is not pinned by digest")
	}
	return json.Marshal(out)
}

// BenchmarkInstantiate measures loading a Go guest whose machine code is in
// the on-disk compilation cache (a fresh runtime each time, as after a
// restart), and creating one more instance of a loaded module.
func BenchmarkInstantiate(b *testing.B) {
	ctx := context.Background()
	mod := wasmtest.BuildGo(b, "examples/policies/require-digest")
	warm := newRuntime(b)
	if _, err := warm.Load(ctx, mod); err != nil { // fills the cache
		b.Fatal(err)
	}
	b.Run("load-from-cache", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(b)})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := rt.Load(ctx, mod); err != nil {
				b.Fatal(err)
			}
			_ = rt.Close(ctx)
		}
	})
	b.Run("instance", func(b *testing.B) {
		// MaxInstances 1 and a trap per call would measure the same thing;
		// instead, concurrency forces new instances: each op holds one more.
		rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(b), MaxInstances: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		defer rt.Close(ctx)
		m, err := rt.Load(ctx, mod)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := hostwasm.InstantiateForBench(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRoutes compiles the route table of 1,000 services with two
// workloads each, with the default WebAssembly compiler and natively.
func BenchmarkRoutes(b *testing.B) {
	ctx := context.Background()
	var in routes.Input
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("svc_%04d", i)
		in.Services = append(in.Services, routes.Service{ID: id, Project: "p", Name: fmt.Sprintf("s%d", i), Domains: []string{fmt.Sprintf("s%d.example.com", i)}})
		for j := 0; j < 2; j++ {
			in.Workloads = append(in.Workloads, routes.Workload{ID: fmt.Sprintf("wl_%04d_%d", i, j), ServiceID: id, NodeID: "nod_1",
				Address: fmt.Sprintf("10.0.%d.%d:%d", j, i%250, 8000+i), ObservedStatus: "running", Health: "passing"})
		}
	}
	var wasmNs, nativeNs float64 // per compilation, for the ratio
	b.Run("1000-services/wasm", func(b *testing.B) {
		rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(b), Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		defer rt.Close(ctx)
		m, err := rt.Load(ctx, routes.DefaultModule())
		if err != nil {
			b.Fatal(err)
		}
		c := routes.Wasm{Module: m}
		// berthd compiles on pooled instances: the first call, which
		// instantiates the module and grows its memory, is not the figure.
		if _, err := c.Compile(ctx, in); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		measure(b, func() error { _, err := c.Compile(ctx, in); return err })
		wasmNs = float64(time.Since(start).Nanoseconds()) / float64(b.N)
	})
	b.Run("1000-services/native", func(b *testing.B) {
		if _, err := (routes.Native{}).Compile(ctx, in); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		measure(b, func() error { _, err := routes.Native{}.Compile(ctx, in); return err })
		nativeNs = float64(time.Since(start).Nanoseconds()) / float64(b.N)
	})
	// The goal's figure: how many times longer WebAssembly takes (<= 10).
	b.Run("1000-services/wasm-over-native", func(b *testing.B) {
		if wasmNs == 0 || nativeNs == 0 {
			b.Fatal("no figure for one of the two compilers")
		}
		b.ReportMetric(wasmNs/nativeNs, "x")
	})
}

// BenchmarkAdmission64 measures admission as the API runs it
// (policy.Engine.Admit with the embedded store, decisions recorded in the
// index and the change log, whose Run goroutine appends as in berthd) with
// the example cap-replicas and require-digest policies bound: rounds of 64
// concurrent applies of small (~1 KB) inputs. It reports the p50 and p99
// latency of one admission, how many were refused (the goal is 0), and
// where the store's one connection spends a round: write commands per round
// by collection (each a round trip: an InsertMany or a bulk update is one)
// and the milliseconds the store took per round for the decision index, the
// change log and its head hint; and the mean milliseconds one admission
// spent in each stage of policy.Engine.Admit (berth_policy_admission_stage_seconds).
func BenchmarkAdmission64(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	st := openStoreWith(b, reg)
	blobs, err := bundles.New(filepath.Join(b.TempDir(), "blobs"), st.Collection("bundles"), 64<<20)
	if err != nil {
		b.Fatal(err)
	}
	clog := changelog.New(st, 1, nil) // as berthd runs it: every decision is an entry
	clog.TrackOutbox(policy.DecisionsCollection, "seq")
	runDone := make(chan struct{})
	go func() { defer close(runDone); clog.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	e := policy.New(policy.Config{Store: st, Blobs: blobs, Runtime: newRuntime(b), Changelog: clog, Metrics: reg})
	if err := e.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	for _, p := range []struct{ dir, config string }{
		{"examples/policies/cap-replicas", `{"max_replicas": 1000, "max_capacity_units": 100000}`},
		{"examples/policies/require-digest", ""},
	} {
		m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.BuildGo(b, p.dir)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Bind(ctx, policy.Binding{Hook: abiwasm.HookServiceApply, ModuleDigest: m.Digest, Config: p.config}); err != nil {
			b.Fatal(err)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	refused, seq := 0, 0
	before := storeWrites(b, reg)
	stagesBefore := admissionStages(b, reg)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for range 64 {
			seq++
			obj, _ := json.Marshal(abiwasm.Service{Project: "shop", Name: fmt.Sprintf("svc-%d", seq), Bundle: "sha256:" + strings.Repeat("ab", 32),
				Replicas: 1, CapacityUnits: 1, Env: map[string]string{"LOG_LEVEL": "info"}, Labels: map[string]string{"team": "checkout"}})
			in := abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_1"},
				Project: &abiwasm.Project{Name: "shop", Services: 1, Replicas: 1, CapacityUnits: 1}, Object: obj}
			wg.Go(func() {
				start := time.Now()
				v, err := e.Admit(ctx, "shop", in)
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				lat = append(lat, d)
				if err != nil || !v.Allowed {
					refused++
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	// What the rounds left to the log's housekeeping is counted too: it
	// occupies the same connection as the next round's writes.
	if err := clog.Cleared(ctx); err != nil {
		b.Fatal(err)
	}
	after := storeWrites(b, reg)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(refused), "refused")
	rounds := float64(b.N)
	total := 0.0
	for _, c := range []string{policy.DecisionsCollection, changelog.Collection, changelog.HeadCollection} {
		n := after[c].n - before[c].n
		total += n
		b.ReportMetric(n/rounds, c+"-writes/round")
		b.ReportMetric((after[c].seconds-before[c].seconds)*1000/rounds, c+"-store-ms/round")
	}
	b.ReportMetric(total/rounds, "writes/round")
	stagesAfter := admissionStages(b, reg)
	for stage, u := range stagesAfter {
		if n := u.n - stagesBefore[stage].n; n > 0 {
			b.ReportMetric((u.seconds-stagesBefore[stage].seconds)*1000/n, stage+"-mean-ms")
		}
	}
}

// admissionStages reads berth_policy_admission_stage_seconds from reg: per
// stage, how many admissions passed it and the seconds they spent there.
func admissionStages(b *testing.B, reg *prometheus.Registry) map[string]storeUse {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]storeUse{}
	for _, mf := range mfs {
		if mf.GetName() != "berth_policy_admission_stage_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					out[l.GetValue()] = storeUse{n: float64(m.GetHistogram().GetSampleCount()), seconds: m.GetHistogram().GetSampleSum()}
				}
			}
		}
	}
	return out
}

// storeUse is how many write commands the store was sent for one
// collection, and the seconds they took, as the store's metrics count them.
type storeUse struct{ n, seconds float64 }

// storeWrites reads the write commands (insert, update, delete,
// findAndModify) so far from reg, by collection.
func storeWrites(b *testing.B, reg *prometheus.Registry) map[string]storeUse {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	write := map[string]bool{"insert": true, "update": true, "delete": true, "findAndModify": true}
	out := map[string]storeUse{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if !write[labels["command"]] {
				continue
			}
			u := out[labels["collection"]]
			switch mf.GetName() {
			case "berth_store_operations_total":
				u.n += m.GetCounter().GetValue()
			case "berth_store_operation_duration_seconds":
				u.seconds += m.GetHistogram().GetSampleSum()
			}
			out[labels["collection"]] = u
		}
	}
	return out
}
