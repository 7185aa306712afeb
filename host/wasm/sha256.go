package wasm

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// hostSHA256 implements berth.sha256(ptr, len, out) (docs/wasm-abi.md
// section 3.1, ABI 1.2): the SHA-256 of the len bytes at ptr, written as 32
// bytes at out. Hashing inside a Go guest runs at about 20 MB/s, here at
// native speed. The bytes count against the call's fuel, one unit each,
// so a module cannot buy unmetered time with it; a range outside the
// module's memory traps.
func hostSHA256(ctx context.Context, mod api.Module, stack []uint64) {
	ptr, n, out := uint32(stack[0]), uint32(stack[1]), uint32(stack[2])
	if st, ok := ctx.Value(callKey{}).(*callState); ok {
		if st.fuel -= int64(n); st.fuel < 0 {
			panic(errNoFuel)
		}
	}
	b, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(fmt.Errorf("berth.sha256: %d bytes at %#x lie outside the module's memory", n, ptr))
	}
	sum := sha256.Sum256(b)
	if !mod.Memory().Write(out, sum[:]) {
		panic(fmt.Errorf("berth.sha256: output at %#x lies outside the module's memory", out))
	}
}
