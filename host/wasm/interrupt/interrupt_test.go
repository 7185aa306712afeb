package interrupt_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
	"github.com/berthhq/berth/internal/wasmtest"
)

// host is a runtime with the refill import: each refill hands out fuel
// units and counts itself; once stop is closed it traps.
type host struct {
	rt      wazero.Runtime
	fuel    uint32
	refills atomic.Int64
	stop    chan struct{}
}

var errStop = errors.New("stopped by the test")

func newHost(t *testing.T, fuel uint32) *host {
	t.Helper()
	ctx := context.Background()
	h := &host{rt: wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig()), fuel: fuel, stop: make(chan struct{})}
	t.Cleanup(func() { _ = h.rt.Close(ctx) })
	_, err := h.rt.NewHostModuleBuilder(interrupt.ImportModule).NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			h.refills.Add(1)
			select {
			case <-h.stop:
				panic(errStop)
			default:
			}
			stack[0] = uint64(h.fuel)
		}), nil, []api.ValueType{api.ValueTypeI32}).Export(interrupt.ImportName).Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *host) instantiate(t *testing.T, wasm []byte) api.Module {
	t.Helper()
	ctx := context.Background()
	out, err := interrupt.Instrument(wasm)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := h.rt.InstantiateWithConfig(ctx, out, wazero.NewModuleConfig().WithName(""))
	if err != nil {
		t.Fatalf("instantiate the instrumented module: %v", err)
	}
	t.Cleanup(func() { _ = mod.Close(ctx) })
	return mod
}

// sumTo returns 0+1+...+(n-1) with a loop: the instrumented module must
// compute the same as the original.
var sumTo = wasmtest.Func{Name: "sum", Params: []byte{wasmtest.I32}, Results: []byte{wasmtest.I32},
	Body: wasmtest.Cat(
		[]byte{0x02, 0x40, 0x03, 0x40},                                      // block loop
		[]byte{0x20, 0x00, 0x45, 0x0d, 0x01},                                // local.get 0; i32.eqz; br_if 1
		[]byte{0x20, 0x00}, wasmtest.I32Const(-1), []byte{0x6a, 0x21, 0x00}, // n--
		[]byte{0x23, 0x00}, []byte{0x20, 0x00, 0x6a, 0x24, 0x00}, // acc += n
		[]byte{0x0c, 0x00, 0x0b, 0x0b}, // br 0; end; end
		[]byte{0x23, 0x00},             // global.get 0
	)}

// moduleWithGlobal is an assembled module plus one mutable i32 global (the
// accumulator of sumTo), so the added global must get index 1.
func moduleWithGlobal(funcs ...wasmtest.Func) []byte {
	base := wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: funcs})
	// Insert a global section (id 6) before the export section (id 7).
	global := []byte{0x06, 0x06, 0x01, 0x7f, 0x01, 0x41, 0x00, 0x0b}
	i := sectionOffset(base, 7)
	return append(append(append([]byte{}, base[:i]...), global...), base[i:]...)
}

func sectionOffset(b []byte, id byte) int {
	off := 8
	for off < len(b) {
		if b[off] == id {
			return off
		}
		n, k := uvarint(b[off+1:])
		off += 1 + k + int(n)
	}
	return off
}

func uvarint(b []byte) (uint64, int) {
	var v uint64
	for i, c := range b {
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}

func TestInstrumentedModuleComputesTheSame(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wasm := moduleWithGlobal(sumTo)
	plain, err := wazero.NewRuntime(ctx).Instantiate(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	h := newHost(t, 100)
	mod := h.instantiate(t, wasm)
	for _, n := range []uint64{0, 1, 10, 1000, 5000} {
		want, err := plain.ExportedFunction("sum").Call(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := mod.ExportedFunction("sum").Call(ctx, n)
		if err != nil {
			t.Fatalf("sum(%d): %v", n, err)
		}
		if got[0] != want[0] {
			t.Fatalf("sum(%d) = %d instrumented, %d plain", n, got[0], want[0])
		}
	}
	// 6011 loop iterations and 5 calls at 100 fuel a refill: at least 60
	// refills, at most one per 100 sites plus one per call.
	if r := h.refills.Load(); r < 60 || r > 70 {
		t.Fatalf("%d refills for 6016 checks at 100 fuel each", r)
	}
}

// TestEachRefillPaysForItsUnits: a refill of k units pays for exactly k
// sites, the first of them the site that asked for it, and what is left
// of the fuel carries over to the instance's next call.
func TestEachRefillPaysForItsUnits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 3)
	mod := h.instantiate(t, moduleWithGlobal(sumTo))
	// sum(n) runs its loop's header n+1 times and has no check at entry.
	for _, c := range []struct{ n, refills int64 }{
		{8, 3}, // 9 sites: refills at the 1st, 4th and 7th, none left
		{0, 4}, // 1 site: a refill, 2 left
		{1, 4}, // 2 sites: paid by what was left
		{0, 5}, // 1 site: a refill
		{5, 7}, // 6 sites: refills at the 1st and 4th, none left
	} {
		if _, err := mod.ExportedFunction("sum").Call(ctx, uint64(c.n)); err != nil {
			t.Fatalf("sum(%d): %v", c.n, err)
		}
		if got := h.refills.Load(); got != c.refills {
			t.Fatalf("after sum(%d): %d refills in all, want %d", c.n, got, c.refills)
		}
	}
}

func TestStopEndsEndlessLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 1000)
	loop := wasmtest.Func{Name: "spin", Body: []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}} // loop br 0 end
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{loop}}))
	done := make(chan error, 1)
	go func() { _, err := mod.ExportedFunction("spin").Call(ctx); done <- err }()
	// Stop only after the loop has been refilled a few times: only the check
	// inside it can end the call.
	deadline := time.Now().Add(30 * time.Second)
	for h.refills.Load() < 3 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	close(h.stop)
	select {
	case err := <-done:
		if !errors.Is(err, errStop) {
			t.Fatalf("spin = %v, want the refill's trap", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stop did not end the loop")
	}
}

func TestStopEndsRecursionWithoutLoops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 10)
	// rec calls itself: only the check at function entry sees it.
	rec := wasmtest.Func{Name: "rec", Body: []byte{0x10, 0x00}}
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{rec}}))
	close(h.stop)
	if _, err := mod.ExportedFunction("rec").Call(ctx); !errors.Is(err, errStop) {
		t.Fatalf("rec = %v, want the refill's trap", err)
	}
}

func TestStopEndsMutualRecursion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 10)
	// ping calls pong calls ping: each body calls, so each has the check.
	ping := wasmtest.Func{Name: "ping", Body: []byte{0x10, 0x01}}
	pong := wasmtest.Func{Name: "pong", Body: []byte{0x10, 0x00}}
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{ping, pong}}))
	close(h.stop)
	if _, err := mod.ExportedFunction("ping").Call(ctx); !errors.Is(err, errStop) {
		t.Fatalf("ping = %v, want the refill's trap", err)
	}
}

func TestSmallFunctionsOffCyclesAreNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 1)
	// leaf adds one to its argument; caller calls it: both are small and on
	// no cycle of calls, so neither needs a check of its own.
	leaf := wasmtest.Func{Name: "leaf", Params: []byte{wasmtest.I32}, Results: []byte{wasmtest.I32},
		Body: wasmtest.Cat([]byte{0x20, 0x00}, wasmtest.I32Const(1), []byte{0x6a})}
	caller := wasmtest.Func{Name: "caller", Results: []byte{wasmtest.I32},
		Body: wasmtest.Cat(wasmtest.I32Const(41), []byte{0x10, 0x00})}
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{leaf, caller}}))
	close(h.stop)
	for range 3 {
		if res, err := mod.ExportedFunction("leaf").Call(ctx, 1); err != nil || res[0] != 2 {
			t.Fatalf("leaf(1) = %v, %v; want 2 without a visit to the host", res, err)
		}
		if res, err := mod.ExportedFunction("caller").Call(ctx); err != nil || res[0] != 42 {
			t.Fatalf("caller() = %v, %v; want 42 without a visit to the host", res, err)
		}
	}
	if n := h.refills.Load(); n != 0 {
		t.Fatalf("small functions visited the host %d times, want 0", n)
	}
}

func TestChainOfDoublingCallsIsCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 1)
	// f0 is empty, and each f(k) calls f(k-1) twice: no loop, no cycle, but
	// f40 would make 2^40 calls. Past MaxUncheckedCost the chain must be
	// counted, so the stopped host ends the call.
	const depth = 40
	funcs := []wasmtest.Func{{Name: "f0"}}
	for k := 1; k <= depth; k++ {
		prev := binary.AppendUvarint(nil, uint64(k-1))
		funcs = append(funcs, wasmtest.Func{Name: fmt.Sprintf("f%d", k), Body: wasmtest.Cat([]byte{0x10}, prev, []byte{0x10}, prev)})
	}
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: funcs}))
	close(h.stop)
	done := make(chan error, 1)
	go func() { _, err := mod.ExportedFunction(fmt.Sprintf("f%d", depth)).Call(ctx); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, errStop) {
			t.Fatalf("f%d = %v, want the refill's trap", depth, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the chain of calls was never counted")
	}
}

func TestInstrumentsRealGuests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wasm := wasmtest.BuildGo(t, "examples/policies/require-digest")
	out, err := interrupt.Instrument(wasm)
	if err != nil {
		t.Fatal(err)
	}
	again, err := interrupt.Instrument(wasm)
	if err != nil || !bytes.Equal(out, again) {
		t.Fatalf("Instrument is not deterministic (err %v)", err)
	}
	compiled, err := newHost(t, 1).rt.CompileModule(ctx, out)
	if err != nil {
		t.Fatalf("compile the instrumented Go guest: %v", err)
	}
	imported := false
	for _, f := range compiled.ImportedFunctions() {
		if mod, name, _ := f.Import(); mod == interrupt.ImportModule && name == interrupt.ImportName {
			imported = true
		}
	}
	if !imported {
		t.Fatalf("no import of %s.%s", interrupt.ImportModule, interrupt.ImportName)
	}
	if _, err := interrupt.Instrument(out); !errors.Is(err, interrupt.ErrMalformed) {
		t.Fatalf("instrumenting twice = %v, want ErrMalformed", err)
	}
}

func TestRefusesMalformed(t *testing.T) {
	t.Parallel()
	good := moduleWithGlobal(sumTo)
	for name, b := range map[string][]byte{
		"empty":          nil,
		"not wasm":       []byte("\x7fELF\x01\x00\x00\x00"),
		"version 2":      []byte("\x00asm\x02\x00\x00\x00"),
		"truncated":      good[:sectionOffset(good, 10)+4],
		"unknown opcode": wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{{Name: "f", Body: []byte{0xff}}}}),
		"bad section":    append(append([]byte{}, good...), 0x42, 0x00),
	} {
		if _, err := interrupt.Instrument(b); !errors.Is(err, interrupt.ErrMalformed) {
			t.Errorf("%s: Instrument = %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzInstrument feeds arbitrary bytes: Instrument never panics, and what it
// accepts from a module wazero compiles, wazero compiles too.
func FuzzInstrument(f *testing.F) {
	f.Add(moduleWithGlobal(sumTo))
	f.Add(wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{{Name: "spin", Body: []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}}}}))
	f.Add(wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Loop}))
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { _ = rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := interrupt.Instrument(b)
		if err != nil {
			return
		}
		if c, cerr := rt.CompileModule(ctx, b); cerr == nil {
			_ = c.Close(ctx)
			c2, err := rt.CompileModule(ctx, out)
			if err != nil {
				t.Fatalf("the module compiles, its instrumented copy does not: %v", err)
			}
			_ = c2.Close(ctx)
		}
	})
}

// goShaped is a function in the shape Go's compiler emits (dispatch.go): a
// loop around two blocks and a br_table on local 0, the jump selector.
// seg1 and seg2 are the code after the inner and the outer block's end;
// the function returns 7 when it leaves the loop.
func goShaped(name string, seg1, seg2 []byte) wasmtest.Func {
	return wasmtest.Func{Name: name, Params: []byte{wasmtest.I32}, Results: []byte{wasmtest.I32}, Body: wasmtest.Cat(
		[]byte{0x03, 0x40, 0x02, 0x40, 0x02, 0x40},       // loop block block
		[]byte{0x20, 0x00, 0x0e, 0x02, 0x00, 0x01, 0x01}, // local.get 0; br_table 0 1 (default 1)
		[]byte{0x0b}, seg1, // end: segment 1
		[]byte{0x0b}, seg2, // end: segment 2
		[]byte{0x0b}, // end of the loop
		wasmtest.I32Const(7),
	)}
}

// jump is "i32.const k; local.set 0; br depth", Go's jump to block k.
func jump(k int32, depth byte) []byte {
	return wasmtest.Cat(wasmtest.I32Const(k), []byte{0x21, 0x00, 0x0c, depth})
}

// TestGoDispatchForwardJumpsAreNotCounted: in Go's dispatch loop the jumps
// to later blocks pass no check (the loop's header has none either), and
// the function computes what it did.
func TestGoDispatchForwardJumpsAreNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHost(t, 1)
	// Segment 1 jumps forward to segment 2 (selector 1), which falls out of the loop.
	f := goShaped("f", jump(1, 1), nil)
	mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{f}}))
	for i := range 100 {
		res, err := mod.ExportedFunction("f").Call(ctx, uint64(i%3))
		if err != nil || res[0] != 7 {
			t.Fatalf("f(%d) = %v, %v; want 7", i%3, res, err)
		}
	}
	if r := h.refills.Load(); r != 0 {
		t.Fatalf("%d refills for forward jumps only, want 0", r)
	}
}

// TestGoDispatchBackwardJumpsAreCounted: every way back into Go's dispatch
// loop that can repeat a block passes a check, so each endless variant is
// stopped.
func TestGoDispatchBackwardJumpsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, f := range map[string]wasmtest.Func{
		// segment 2 jumps to itself
		"to the same block": goShaped("f", jump(1, 1), jump(1, 0)),
		// segment 2 jumps back to segment 1, which jumps forward again
		"to an earlier block": goShaped("f", jump(1, 1), jump(0, 0)),
		// a selector the pass cannot see (local.tee)
		"unknown selector": goShaped("f", jump(1, 1), wasmtest.Cat(wasmtest.I32Const(1), []byte{0x22, 0x00, 0x1a, 0x0c, 0x00})),
		// br_if back into the loop
		"br_if": goShaped("f", jump(1, 1), wasmtest.Cat(wasmtest.I32Const(1), []byte{0x21, 0x00, 0x41, 0x01, 0x0d, 0x00})),
		// a selector past the table takes the default, segment 2 again
		"default of the table": goShaped("f", jump(1, 1), jump(9, 0)),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHost(t, 1000)
			mod := h.instantiate(t, wasmtest.Assemble(wasmtest.Module{Pages: 1, Funcs: []wasmtest.Func{f}}))
			done := make(chan error, 1)
			go func() { _, err := mod.ExportedFunction("f").Call(ctx, 0); done <- err }()
			deadline := time.Now().Add(30 * time.Second)
			for h.refills.Load() < 3 && time.Now().Before(deadline) {
				runtime.Gosched()
			}
			close(h.stop)
			select {
			case err := <-done:
				if !errors.Is(err, errStop) {
					t.Fatalf("f = %v, want the refill's trap", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the stop did not end the loop")
			}
		})
	}
}

// TestStopsEndlessGoGuests: a real Go guest spinning in a loop, and one
// making calls without end but no loop, are stopped by their fuel through
// the host, and the module answers the next legal call.
func TestStopsEndlessGoGuests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t), Fuel: 1 << 24, MaxInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	m, err := rt.Load(ctx, wasmtest.BuildGo(t, "host/wasm/interrupt/testdata/goendless"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"loop", "calls"} {
		input := fmt.Sprintf(`{"hook":"service.apply","config":{"mode":%q}}`, mode)
		done := make(chan error, 1)
		go func() { _, err := m.Call(ctx, []byte(input)); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, hostwasm.ErrDeadline) || !strings.Contains(err.Error(), "fuel") {
				t.Fatalf("mode %s: %v, want ErrDeadline for fuel", mode, err)
			}
		case <-time.After(2 * time.Minute): // 1<<24 units take well under a second
			t.Fatalf("mode %s: the guest was never stopped", mode)
		}
	}
	out, err := m.Call(ctx, []byte(`{"hook":"service.apply","config":{"mode":""}}`))
	if err != nil || !strings.Contains(string(out), `"allow"`) {
		t.Fatalf("a legal call after the stopped ones: %s, %v", out, err)
	}
}
