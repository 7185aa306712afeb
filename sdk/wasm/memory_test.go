package wasm_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestGoGuestMemoryStaysBounded: the collector is off inside a Go guest and
// runs between calls (exports_wasip1.go), reading the heap's size only now
// and then. A guest that allocates a lot per call, after a long run of calls
// that allocate little (so the readings are sparse), and a run of large
// legal inputs must all be served within a 32 MiB memory: none runs out of
// memory, so the memory does not grow with the number of calls.
func TestGoGuestMemoryStaysBounded(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{MemoryLimitPages: 512, MaxInstances: 1, CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Close(ctx) }()
	m, err := rt.Load(ctx, wasmtest.BuildGo(t, "sdk/wasm/testdata/allocguest"))
	if err != nil {
		t.Fatal(err)
	}
	small, _ := json.Marshal(abiwasm.Service{Name: "cart", Image: "x"})
	big, _ := json.Marshal(abiwasm.Service{Name: "cart", Env: map[string]string{"BLOB": strings.Repeat("x", 3<<20)}})
	for i, step := range []struct {
		calls, garbageMiB int
		object            []byte
	}{
		{100, 0, small}, // readings fall to one per sampling period
		{40, 6, small},  // 240 MiB of garbage in all, 6 MiB a call
		{100, 0, small},
		{20, 0, big}, // 3 MiB inputs, near the default input limit
		{20, 5, big},
	} {
		cfg, _ := json.Marshal(map[string]int{"garbage_mib": step.garbageMiB})
		in := abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: step.object, Config: cfg}
		for n := range step.calls {
			out, err := m.Evaluate(ctx, in)
			if err != nil {
				t.Fatalf("step %d, call %d (%d MiB of garbage, %d-byte object): %v", i, n, step.garbageMiB, len(step.object), err)
			}
			if out.Decision != abiwasm.Allow {
				t.Fatalf("step %d, call %d: %+v", i, n, out)
			}
		}
	}
}

// TestGoGuestReusesInputBuffers: allocate hands out the last input buffer
// again when it is big enough (exports_wasip1.go), so inputs of sizes going
// up and down through one instance must each be read as written: a longer
// earlier input's tail must not change the decision on a shorter one.
func TestGoGuestReusesInputBuffers(t *testing.T) {
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{MaxInstances: 1, CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Close(ctx) }()
	m, err := rt.Load(ctx, wasmtest.BuildGo(t, "examples/policies/require-digest"))
	if err != nil {
		t.Fatal(err)
	}
	pinned := "registry.example/app@sha256:" + strings.Repeat("ab", 32)
	for i, c := range []struct {
		image string
		pad   int
		deny  bool
	}{
		{pinned, 40 << 10, false}, {"app:1", 0, true}, {pinned, 0, false}, {"app:1", 20 << 10, true},
		{pinned, 100, false}, {"app:latest", 50 << 10, true}, {pinned, 70 << 10, false}, {"a", 0, true},
	} {
		obj, _ := json.Marshal(abiwasm.Service{Name: "cart", Image: c.image, Env: map[string]string{"PAD": strings.Repeat("p", c.pad)}})
		out, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: obj})
		if err != nil {
			t.Fatalf("input %d: %v", i, err)
		}
		if got := out.Decision == abiwasm.Deny; got != c.deny {
			t.Fatalf("input %d (image %q, %d bytes of padding): %+v", i, c.image, c.pad, out)
		}
	}
}
