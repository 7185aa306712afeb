package routes

import (
	"context"
	"fmt"
	"reflect"
	"testing"

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
			want.Routes[i].TLSMode = "none"
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

func sampleInput(n int) Input {
	var in Input
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("svc_%04d", i)
		in.Services = append(in.Services, Service{ID: id, Project: "p", Name: fmt.Sprintf("s%d", i), Domains: []string{fmt.Sprintf("S%d.Example.com.", i), "shared.example.com"}})
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
