//go:build wasip1

// Command loopguest is require-digest's decision for the call-cost
// benchmark (bench/opa BenchmarkGoGuestCallVsLoop): policy_evaluate as
// usual, and policy_evaluate_n, which handles the same input n times in one
// call, so the cost of entering and leaving the guest can be told apart
// from the cost of the work.
package main

import (
	"strings"
	"unsafe"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "loopguest", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

//go:wasmexport policy_evaluate_n
func evaluateN(ptr, size, n uint32) uint64 {
	input := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(ptr))), size)
	for range max(n, 1) - 1 {
		wasm.HandlePolicy(input, decide)
	}
	return wasm.Policy(ptr, size, decide)
}

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookServiceApply {
		return wasm.Allow()
	}
	s, _, err := wasm.Object[abiwasm.Service](in.Object)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	var reasons []string
	if s.Bundle != "" && !strings.HasPrefix(s.Bundle, "sha256:") {
		reasons = append(reasons, "bundle "+s.Bundle+" is not named by digest; use sha256:<hex>")
	}
	if s.Image != "" && !strings.Contains(s.Image, "@sha256:") {
		reasons = append(reasons, "image "+s.Image+" is not pinned by digest")
	}
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func main() {}
