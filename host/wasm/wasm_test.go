package wasm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

func newRuntime(t *testing.T, cfg wasm.Config) *wasm.Runtime {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = wasmtest.CacheDir(t)
	}
	r, err := wasm.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

func TestAssembledPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{Timeout: 200 * time.Millisecond, MaxInstances: 2})
	m, err := r.Load(ctx, wasmtest.Policy(wasmtest.PolicyOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if m.Metadata().Name != "asm-policy" || m.Metadata().Kind != abiwasm.KindPolicy {
		t.Fatalf("metadata %+v", m.Metadata())
	}
	out, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply})
	if err != nil || out.Decision != abiwasm.Allow {
		t.Fatalf("Evaluate = %+v, %v", out, err)
	}
	if again, err := r.Load(ctx, wasmtest.Policy(wasmtest.PolicyOptions{})); err != nil || again != m {
		t.Fatalf("loading the same bytes twice gave another module (err %v)", err)
	}

	// Allocation past the memory fails cleanly, and the module still works.
	if _, err := m.Call(ctx, make([]byte, 3*65536)); !errors.Is(err, wasm.ErrMemory) {
		t.Fatalf("oversized input: %v, want ErrMemory", err)
	}
	if _, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply}); err != nil {
		t.Fatalf("after a failed allocation: %v", err)
	}
}

func TestRefusesModulesThatBreakTheABI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{})
	cases := map[string]struct {
		wasm []byte
		want string
	}{
		"not wasm":          {[]byte("hello"), "compile"},
		"no deallocate":     {wasmtest.Policy(wasmtest.PolicyOptions{NoDealloc: true}), "does not export deallocate"},
		"ABI 2":             {wasmtest.Policy(wasmtest.PolicyOptions{ABIVersion: abiwasm.Version(2, 0)}), "speaks ABI 2.0"},
		"bad metadata name": {wasmtest.Policy(wasmtest.PolicyOptions{Name: ""}), ""},
	}
	delete(cases, "bad metadata name") // an empty Name takes the default
	for name, c := range cases {
		_, err := r.Load(ctx, c.wasm)
		if !errors.Is(err, wasm.ErrBadModule) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load = %v, want ErrBadModule mentioning %q", name, err, c.want)
		}
	}
}

func TestEndlessLoopStoppedAtDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{Timeout: 100 * time.Millisecond, MaxInstances: 1})
	m, err := r.Load(ctx, wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Loop}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // the second call proves the stopped instance was replaced
		start := time.Now()
		_, err := m.Call(ctx, []byte(`{}`))
		if !errors.Is(err, wasm.ErrDeadline) {
			t.Fatalf("call %d: %v, want ErrDeadline", i, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("call %d took %s", i, d)
		}
	}
}

func TestTrapDiscardsInstance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{MaxInstances: 1})
	m, err := r.Load(ctx, wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Unreachable}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := m.Call(ctx, []byte(`{}`)); !errors.Is(err, wasm.ErrTrap) {
			t.Fatalf("call %d: %v, want ErrTrap", i, err)
		}
	}
}

func TestGoGuestPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{})
	m, err := r.Load(ctx, wasmtest.BuildGo(t, "examples/policies/require-digest"))
	if err != nil {
		t.Fatal(err)
	}
	svc := func(bundle string) json.RawMessage {
		b, _ := json.Marshal(abiwasm.Service{Project: "default", Name: "hello", Bundle: bundle, Replicas: 1})
		return b
	}
	out, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: svc("hello")})
	if err != nil || out.Decision != abiwasm.Deny || !strings.Contains(out.Reasons[0], "not named by digest") {
		t.Fatalf("bundle by name: %+v, %v", out, err)
	}
	out, err = m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: svc("sha256:" + strings.Repeat("a", 64))})
	if err != nil || out.Decision != abiwasm.Allow {
		t.Fatalf("bundle by digest: %+v, %v", out, err)
	}

	// Same input, same bytes.
	in := []byte(`{"hook":"service.apply","actor":{"kind":"token"},"object":{"name":"x","bundle":"x"},"old_object":null,"config":null}`)
	a, err := m.Call(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Call(ctx, in)
	if !bytes.Equal(a, b) {
		t.Fatalf("same input, different output:\n%s\n%s", a, b)
	}

	// Malformed input is answered with the error convention, not a trap.
	_, err = m.EvaluateJSON(ctx, []byte(`{"hook":`))
	var ge *abiwasm.GuestError
	if !errors.Is(err, wasm.ErrGuest) || !errors.As(err, &ge) || ge.Code != abiwasm.ErrCodeBadInput {
		t.Fatalf("malformed input: %v", err)
	}
}

func TestGoGuestMemoryLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{MemoryLimitPages: 256, MaxInputBytes: 32 << 20, MaxInstances: 1})
	m, err := r.Load(ctx, wasmtest.BuildGo(t, "examples/policies/require-digest"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Call(ctx, make([]byte, 20<<20))
	if !errors.Is(err, wasm.ErrTrap) && !errors.Is(err, wasm.ErrMemory) {
		t.Fatalf("20 MiB input into a 16 MiB module: %v, want ErrTrap or ErrMemory", err)
	}
	t.Logf("allocation past the limit: %v", err)
	if _, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceDelete}); err != nil {
		t.Fatalf("after running out of memory: %v", err)
	}
}

// TestCompileRoutesChecksTheTable: a route compiler's table must pass
// routes.Table.Validate; one that does not is refused as the module's bug
// (ErrBadOutput, naming the module), and a valid one comes back normalized.
func TestCompileRoutesChecksTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{})
	answer := func(rs []routes.Route) string {
		raw, err := json.Marshal(abiwasm.RoutesOutput{Routes: rs, SHA256: routes.Table{Routes: rs}.Digest()})
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	up := routes.Upstream{WorkloadID: "wl_1", Address: "10.0.0.1:80", Healthy: true}
	for name, tc := range map[string]struct {
		rs   []routes.Route
		want string
	}{
		"ok":          {[]routes.Route{{Hostname: "b.test", Upstreams: []routes.Upstream{up}}, {Hostname: "a.test", TLSMode: "none", AllowSources: []string{"10.0.0.0/8"}}}, ""},
		"tls mode":    {[]routes.Route{{Hostname: "a.test", TLSMode: "https"}}, `unknown tls_mode "https"`},
		"allow":       {[]routes.Route{{Hostname: "a.test", AllowSources: []string{"everyone"}}}, "not a CIDR prefix"},
		"upper case":  {[]routes.Route{{Hostname: "A.test"}}, "lower case"},
		"repeated":    {[]routes.Route{{Hostname: "a.test"}, {Hostname: "a.test"}}, "repeated hostname"},
		"bad address": {[]routes.Route{{Hostname: "a.test", Upstreams: []routes.Upstream{{WorkloadID: "wl_1", Address: "nowhere"}}}}, "not host:port"},
		"bad prefix":  {[]routes.Route{{Hostname: "a.test", PathPrefix: "/a/../b"}}, routes.CodePathPrefixInvalid},
		"bad header":  {[]routes.Route{{Hostname: "a.test", Headers: []routes.HeaderMatch{{Name: "X-A", Value: ""}}}}, routes.CodeHeaderInvalid},
	} {
		m, err := r.Load(ctx, wasmtest.Routes("asm-routes", answer(tc.rs)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.CompileRoutes(ctx, abiwasm.RoutesInput{})
		if tc.want == "" {
			if err != nil || len(got.Routes) != 2 || got.Routes[0].Hostname != "a.test" {
				t.Errorf("%s: %+v, %v", name, got, err)
			}
			continue
		}
		if !errors.Is(err, wasm.ErrBadOutput) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "asm-routes") {
			t.Errorf("%s: %v, want ErrBadOutput with %q", name, err, tc.want)
		}
		// Refused match conditions keep their code in the error chain.
		var ie *routes.InvalidError
		if strings.HasPrefix(tc.want, "route_") && (!errors.As(err, &ie) || ie.Code != tc.want) {
			t.Errorf("%s: %v, want an *routes.InvalidError with code %s", name, err, tc.want)
		}
	}
}

// TestEndlessLoopStoppedByFuel: without any wall-clock limit, an endless
// loop ends when its fuel is spent, and the next call gets a fresh
// instance.
func TestEndlessLoopStoppedByFuel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRuntime(t, wasm.Config{Fuel: 1 << 24, MaxInstances: 1})
	m, err := r.Load(ctx, wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Loop}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		_, err := m.Call(ctx, []byte(`{}`))
		if !errors.Is(err, wasm.ErrDeadline) || !strings.Contains(err.Error(), "fuel") {
			t.Fatalf("call %d: %v, want ErrDeadline for fuel", i, err)
		}
	}
}
