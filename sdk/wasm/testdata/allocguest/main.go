//go:build wasip1

// Command allocguest is a policy for the SDK's memory tests: on every call it
// allocates, fills and drops config.garbage_mib MiB besides decoding the
// input's service, then allows.
package main

import (
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "allocguest", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

type config struct {
	GarbageMiB int `json:"garbage_mib"`
}

// sink keeps the compiler from dropping the garbage unread.
var sink byte

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	cfg, err := wasm.Config[config](in)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	if _, _, err := wasm.Object[abiwasm.Service](in.Object); err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	for range cfg.GarbageMiB * 16 { // 64 KiB pieces, each its own allocation
		b := make([]byte, 64<<10)
		for i := range b {
			b[i] = byte(i)
		}
		sink ^= b[len(b)/2]
	}
	return wasm.Allow()
}

func main() {}
