package opa

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
	"github.com/berthhq/berth/internal/wasmtest"
)

// BenchmarkHostPath splits one evaluation of the side-by-side rule into the
// layers Berth adds, for OPA's module and the AssemblyScript guest, in CPU
// microseconds per evaluation of the evaluating thread (name-cpu-µs):
//
//   - bare: the module as compiled, run in wazero with nothing of Berth's;
//   - fuel: the same module after the fuel pass (package interrupt), run
//     bare with a refill that never stops it: the pass's own cost;
//   - call: Berth's Module.Call (pool, limits, input copy, output read);
//   - eval: Berth's EvaluateJSON (call plus the decision read);
//   - reuse (Go guest only): bare, but one input buffer allocated once and
//     written over each call, so two exports run per evaluation, not four;
//   - exports (Go guest only): allocate(1) and deallocate alone, the cost
//     of entering and leaving the guest twice with no work.
//
// The differences between consecutive layers are what each one costs. The
// layers take turns in rounds of 64 evaluations, so a neighbour's load on
// a shared machine falls on all of them alike.
func BenchmarkHostPath(b *testing.B) {
	ctx := context.Background()
	in := policyInput()
	_, opaWasm := wasmtest.BuildRego(b, requireDigest, "berth/deny")
	as, err := os.ReadFile(wasmtest.RepoRoot(b) + "/examples/policies/require-digest-as/policy.wasm")
	if err != nil {
		b.Fatal(err)
	}
	goWasm := wasmtest.BuildGo(b, "examples/policies/require-digest")
	for _, kind := range []struct {
		name string
		wasm []byte
		bare func(b *testing.B, wasm []byte, fuel bool) func([]byte) ([]byte, error)
	}{
		{"opa", opaWasm, func(b *testing.B, wasm []byte, fuel bool) func([]byte) ([]byte, error) {
			r := newBareOPAWith(b, wasm, fuel)
			return func(in []byte) ([]byte, error) { return r.eval(ctx, in) }
		}},
		{"assemblyscript", as, newBareBerth},
		{"go", goWasm, newBareBerth},
	} {
		b.Run(kind.name, func(b *testing.B) {
			m := loadBerth(b, kind.wasm)
			layers := []struct {
				name string
				fn   func([]byte) ([]byte, error)
			}{
				{"bare", kind.bare(b, kind.wasm, false)},
				{"fuel", kind.bare(b, kind.wasm, true)},
				{"call", func(in []byte) ([]byte, error) { return m.Call(ctx, in) }},
				{"eval", func(in []byte) ([]byte, error) {
					out, err := m.EvaluateJSON(ctx, in)
					if err == nil && (out.Decision != abiwasm.Deny || len(out.Reasons) != 1) {
						err = fmt.Errorf("decided %+v", out)
					}
					return nil, err
				}},
			}
			if kind.name == "go" {
				layers = append(layers, struct {
					name string
					fn   func([]byte) ([]byte, error)
				}{"reuse", newBareReuse(b, kind.wasm)}, struct {
					name string
					fn   func([]byte) ([]byte, error)
				}{"exports", newBareExports(b, kind.wasm)})
			}
			for _, l := range layers[:2] {
				if out, err := l.fn(in); err != nil || !bytes.Contains(out, []byte("bundle cart")) {
					b.Fatalf("%s answered %s, %v", l.name, out, err)
				}
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			const round = 64
			used := make([]time.Duration, len(layers))
			b.ResetTimer()
			for range b.N {
				for i, l := range layers {
					start := threadCPU(b)
					for range round {
						if _, err := l.fn(in); err != nil {
							b.Fatalf("%s: %v", l.name, err)
						}
					}
					used[i] += threadCPU(b) - start
				}
			}
			b.StopTimer()
			for i, l := range layers {
				b.ReportMetric(float64(used[i])/float64(time.Microsecond)/float64(b.N*round), l.name+"-cpu-µs")
			}
		})
	}
}

// threadCPU is the CPU time the calling thread has used; the caller locks
// its goroutine to the thread.
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

func loadBerth(b *testing.B, wasm []byte) *hostwasm.Module {
	b.Helper()
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rt.Close(ctx) })
	m, err := rt.Load(ctx, wasm)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// fuelHost gives an instrumented module, run bare, a refill that never
// stops it.
func fuelHost(b *testing.B, rt wazero.Runtime) {
	b.Helper()
	if _, err := rt.NewHostModuleBuilder(interrupt.ImportModule).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, st []uint64) { st[0] = hostwasm.FuelPerRefill }),
		nil, []api.ValueType{api.ValueTypeI32}).Export(interrupt.ImportName).
		Instantiate(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// newBareBerth runs a module of Berth's ABI without Berth's host: allocate,
// write, policy_evaluate, read, deallocate both, on one instance.
func newBareBerth(b *testing.B, wasm []byte, fuel bool) func([]byte) ([]byte, error) {
	b.Helper()
	ctx := context.Background()
	mod := bareInstance(b, wasm, fuel)
	alloc, eval, dealloc := mod.ExportedFunction("allocate"), mod.ExportedFunction("policy_evaluate"), mod.ExportedFunction("deallocate")
	mem := mod.Memory()
	st := make([]uint64, 2)
	return func(in []byte) ([]byte, error) {
		st[0] = uint64(len(in))
		if err := alloc.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		ptr := uint32(st[0])
		mem.Write(ptr, in)
		st[0], st[1] = uint64(ptr), uint64(len(in))
		if err := eval.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		optr, n := abiwasm.Unpack(st[0])
		raw, _ := mem.Read(optr, n)
		out := bytes.Clone(raw)
		st[0], st[1] = uint64(optr), uint64(n)
		if err := dealloc.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		st[0], st[1] = uint64(ptr), uint64(len(in))
		if err := dealloc.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// newBareReuse is newBareBerth with one input buffer for the instance's
// life: allocate runs once, and each evaluation writes over the buffer.
func newBareReuse(b *testing.B, wasm []byte) func([]byte) ([]byte, error) {
	b.Helper()
	ctx := context.Background()
	mod := bareInstance(b, wasm, false)
	alloc, eval, dealloc := mod.ExportedFunction("allocate"), mod.ExportedFunction("policy_evaluate"), mod.ExportedFunction("deallocate")
	mem := mod.Memory()
	st := make([]uint64, 2)
	st[0] = 64 << 10
	if err := alloc.CallWithStack(ctx, st); err != nil {
		b.Fatal(err)
	}
	ptr := uint32(st[0])
	return func(in []byte) ([]byte, error) {
		mem.Write(ptr, in)
		st[0], st[1] = uint64(ptr), uint64(len(in))
		if err := eval.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		optr, n := abiwasm.Unpack(st[0])
		raw, _ := mem.Read(optr, n)
		out := bytes.Clone(raw)
		st[0], st[1] = uint64(optr), uint64(n)
		if err := dealloc.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// newBareExports calls allocate(1) and deallocate on it and nothing else:
// two entries into the guest that do no work.
func newBareExports(b *testing.B, wasm []byte) func([]byte) ([]byte, error) {
	b.Helper()
	ctx := context.Background()
	mod := bareInstance(b, wasm, false)
	alloc, dealloc := mod.ExportedFunction("allocate"), mod.ExportedFunction("deallocate")
	st := make([]uint64, 2)
	return func([]byte) ([]byte, error) {
		st[0] = 1
		if err := alloc.CallWithStack(ctx, st); err != nil {
			return nil, err
		}
		st[1] = 1
		return nil, dealloc.CallWithStack(ctx, st)
	}
}

// bareInstance instantiates wasm, after the fuel pass, in a runtime of its
// own with WASI (a Go guest imports it) and runs _initialize when the module
// is a reactor.
func bareInstance(b *testing.B, wasm []byte, fuel bool) api.Module {
	b.Helper()
	ctx := context.Background()
	own, err := interrupt.InstrumentWith(wasm, interrupt.Options{NoFuel: !fuel})
	if err != nil {
		b.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	b.Cleanup(func() { _ = rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	if fuel {
		fuelHost(b, rt)
	}
	compiled, err := rt.CompileModule(ctx, own)
	if err != nil {
		b.Fatal(err)
	}
	cfg := wazero.NewModuleConfig().WithName("policy")
	if _, ok := compiled.ExportedFunctions()["_initialize"]; ok {
		cfg = cfg.WithStartFunctions("_initialize")
	}
	mod, err := rt.InstantiateModule(ctx, compiled, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return mod
}

// BenchmarkGoGuestCallVsLoop tells a Go guest's per-call cost from the cost
// of its work, in CPU microseconds per evaluation of the side-by-side rule
// (name-cpu-µs), on one bare instance (no fuel pass):
//
//   - calls: one evaluation per call, as Berth calls a policy (allocate,
//     write, policy_evaluate, read, deallocate both);
//   - loop-N: one call that evaluates the same input N times
//     (policy_evaluate_n of sdk/wasm/testdata/loopguest).
//
// calls minus loop-64 is what entering and leaving the guest costs per
// evaluation, collections included; BenchmarkHostPath's exports row is the
// bare crossing.
func BenchmarkGoGuestCallVsLoop(b *testing.B) {
	ctx := context.Background()
	in := policyInput()
	wasm := wasmtest.BuildGo(b, "sdk/wasm/testdata/loopguest")
	mod := bareInstance(b, wasm, false)
	alloc, evalN, dealloc := mod.ExportedFunction("allocate"), mod.ExportedFunction("policy_evaluate_n"), mod.ExportedFunction("deallocate")
	calls := newBareBerth(b, wasm, false)
	mem := mod.Memory()
	st := make([]uint64, 3)
	loop := func(n int) func([]byte) ([]byte, error) {
		return func(in []byte) ([]byte, error) {
			st[0] = uint64(len(in))
			if err := alloc.CallWithStack(ctx, st); err != nil {
				return nil, err
			}
			ptr := uint32(st[0])
			mem.Write(ptr, in)
			st[0], st[1], st[2] = uint64(ptr), uint64(len(in)), uint64(n)
			if err := evalN.CallWithStack(ctx, st); err != nil {
				return nil, err
			}
			optr, size := abiwasm.Unpack(st[0])
			raw, _ := mem.Read(optr, size)
			out := bytes.Clone(raw)
			st[0], st[1] = uint64(optr), uint64(size)
			if err := dealloc.CallWithStack(ctx, st); err != nil {
				return nil, err
			}
			st[0], st[1] = uint64(ptr), uint64(len(in))
			return out, dealloc.CallWithStack(ctx, st)
		}
	}
	const round = 64
	layers := []struct {
		name  string
		per   int // evaluations per call of fn
		fn    func([]byte) ([]byte, error)
		calls int // calls of fn per round
	}{
		{"calls", 1, calls, round},
		{"loop-8", 8, loop(8), round / 8},
		{"loop-64", 64, loop(64), 1},
	}
	for _, l := range layers {
		if out, err := l.fn(in); err != nil || !bytes.Contains(out, []byte("bundle cart")) {
			b.Fatalf("%s answered %s, %v", l.name, out, err)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	used := make([]time.Duration, len(layers))
	b.ResetTimer()
	for range b.N {
		for i, l := range layers {
			start := threadCPU(b)
			for range l.calls {
				if _, err := l.fn(in); err != nil {
					b.Fatalf("%s: %v", l.name, err)
				}
			}
			used[i] += threadCPU(b) - start
		}
	}
	b.StopTimer()
	for i, l := range layers {
		b.ReportMetric(float64(used[i])/float64(time.Microsecond)/float64(b.N*l.calls*l.per), l.name+"-cpu-µs")
	}
}
