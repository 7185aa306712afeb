//go:build wasip1

// Command goendless is a Go policy that never answers: with the
// configuration {"mode":"loop"} it spins in a loop, with {"mode":"calls"}
// it makes 2^62 calls without a loop, so only the fuel counter can stop
// it. The interrupt tests run it.
package main

import (
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "goendless", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

var spins uint64

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	cfg, err := wasm.Config[struct{ Mode string }](in)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	switch cfg.Mode {
	case "loop":
		for {
			spins++
		}
	case "calls":
		if tree(62) == 0 {
			return wasm.Deny("unreachable")
		}
	}
	return wasm.Allow()
}

// tree calls itself twice until depth n: 2^n calls, no loop.
func tree(n int) int {
	if n <= 0 {
		return 1
	}
	return tree(n-1) + tree(n-1)
}

func main() {}
