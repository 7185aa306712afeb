package routes

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	abiroutes "github.com/berthhq/berth/abi/routes"
	wasmconf "github.com/berthhq/berth/conformance/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestWasmMatchesNative proves the default module routes exactly as Native.
func TestWasmMatchesNative(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, DefaultModule())
	if err != nil {
		t.Fatal(err)
	}
	w := Wasm{Module: m}
	for _, in := range []Input{{}, sampleInput(3), sampleInput(100)} {
		want, err := Native{}.Compile(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want.Routes { // the module fills in the TLS default
			if want.Routes[i].TLSMode == "" {
				want.Routes[i].TLSMode = "none"
			}
		}
		got, err := w.Compile(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if len(want.Routes) == 0 && len(got.Routes) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("wasm and native differ for %d services:\n%+v\n%+v", len(in.Services), got, want)
		}
	}
}

// TestWasmMatchesNativeOnRandomServices: on seeded random service sets
// (bounded count: 40 sets of up to 60 services) the default module's table
// equals Native's: shared and differently cased domains, trailing dots,
// services without workloads, workloads without addresses or on other
// services, every health and status.
func TestWasmMatchesNativeOnRandomServices(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, DefaultModule())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(21, 6))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for round := range 40 {
		var in Input
		n := rng.IntN(61)
		for i := range n {
			s := Service{ID: fmt.Sprintf("svc_%03d", rng.IntN(1000)*100+i), Project: pick("p", "p-x", "q", "shop"),
				Name: fmt.Sprintf("%s%d", pick("a", "b", "web"), i), TLSMode: pick("", "none", abiroutes.TLSACME, "manual")}
			for range rng.IntN(4) {
				s.Domains = append(s.Domains, pick("", "x.", "X.example.com", "shared.example.com", fmt.Sprintf("h%d.Example.com.", rng.IntN(80))))
			}
			in.Services = append(in.Services, s)
		}
		for j := range rng.IntN(3 * (n + 1)) {
			w := Workload{ID: fmt.Sprintf("wl_%04d", rng.IntN(10000)*10+j%10), NodeID: "nod_1",
				ObservedStatus: pick("running", "starting", "exited"), Health: pick("passing", "failing", "unknown")}
			if n > 0 && rng.IntN(8) > 0 {
				w.ServiceID = in.Services[rng.IntN(n)].ID
			} else {
				w.ServiceID = "svc_gone"
			}
			if rng.IntN(6) > 0 {
				w.Address = fmt.Sprintf("10.0.%d.%d:%d", rng.IntN(4), rng.IntN(250), 1024+rng.IntN(60000))
			}
			in.Workloads = append(in.Workloads, w)
		}
		want, err := Native{}.Compile(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want.Routes { // the module fills in the TLS default
			if want.Routes[i].TLSMode == "" {
				want.Routes[i].TLSMode = "none"
			}
		}
		if want.Routes == nil {
			want.Routes = []abiroutes.Route{}
		}
		got, err := Wasm{Module: m}.Compile(ctx, in)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Native leaves a route without upstreams nil, the module writes [].
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round %d (%d services, %d workloads): wasm and native differ (-native +wasm):\n%s", round, n, len(in.Workloads), diff)
		}
	}
}

func sampleInput(n int) Input {
	var in Input
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("svc_%04d", i)
		s := Service{ID: id, Project: "p", Name: fmt.Sprintf("s%d", i), Domains: []string{fmt.Sprintf("S%d.Example.com.", i), "shared.example.com"}}
		if i%3 == 1 { // some acme services, a wildcard among their domains
			s.TLSMode, s.Domains = abiroutes.TLSACME, append(s.Domains, fmt.Sprintf("*.w%d.example.com", i))
		}
		in.Services = append(in.Services, s)
		for j := 0; j < 2; j++ {
			health := "passing"
			if j == 1 {
				health = "failing"
			}
			in.Workloads = append(in.Workloads, Workload{ID: fmt.Sprintf("wl_%04d_%d", i, j), ServiceID: id, NodeID: "nod_1",
				Address: fmt.Sprintf("10.0.0.%d:%d", j+1, 8000+i), ObservedStatus: "running", Health: health})
		}
	}
	return in
}

// TestInternalRoutesExample: the example route compiler operators bind in
// place of the default passes the conformance suite and restricts .internal
// domains to private networks, routing the rest as the default does.
func TestInternalRoutesExample(t *testing.T) {
	ctx := context.Background()
	raw := wasmtest.BuildGo(t, "examples/routes-internal")
	// A route compiler's deadline in berthd is 30 s (server.RouteCompileTimeout);
	// the memory limit is the one the example policies are checked with.
	results, err := wasmconf.Check(ctx, raw, wasmconf.Options{CacheDir: wasmtest.CacheDir(t), Timeout: 30 * time.Second, MemoryLimitPages: 256})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Err != nil {
			t.Errorf("conformance %s: %v", r.Name, r.Err)
		}
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	in := sampleInput(3)
	in.Services = append(in.Services, Service{ID: "svc_admin", Project: "ops", Name: "admin", Domains: []string{"Admin.Internal."}})
	got, err := Wasm{Module: m}.Compile(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Native{}.Compile(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want.Routes {
		if want.Routes[i].TLSMode == "" {
			want.Routes[i].TLSMode = "none"
		}
		if want.Routes[i].Hostname == "admin.internal" {
			want.Routes[i].AllowSources = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"}
			want.Routes[i].Upstreams = []abiroutes.Upstream{}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
