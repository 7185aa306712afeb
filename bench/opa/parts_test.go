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
//   - eval: Berth's EvaluateJSON (call plus the decision read).
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
	own, err := interrupt.InstrumentWith(wasm, interrupt.Options{NoFuel: !fuel})
	if err != nil {
		b.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	b.Cleanup(func() { _ = rt.Close(ctx) })
	if fuel {
		fuelHost(b, rt)
	}
	mod, err := rt.InstantiateWithConfig(ctx, own, wazero.NewModuleConfig().WithName("policy"))
	if err != nil {
		b.Fatal(err)
	}
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
