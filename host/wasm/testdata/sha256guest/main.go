//go:build wasip1

// Command sha256guest is a test module for the host import berth.sha256:
// its routes_compile hashes its input and answers the hex digest ("h..."),
// hashes it forever ("l..."), or names a range outside its memory ("o...").
package main

import (
	"encoding/hex"
	"unsafe"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmimport berth sha256
func hostSHA256(ptr unsafe.Pointer, size uint32, out unsafe.Pointer)

var answer []byte // reachable until the next call

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindRoutes, "sha256-guest", "1.0.0") }

//go:wasmexport routes_compile
func compile(ptr, size uint32) uint64 {
	in := unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), size)
	sum := new([32]byte)
	switch in[0] {
	case 'l':
		for {
			hostSHA256(unsafe.Pointer(&in[0]), size, unsafe.Pointer(sum))
		}
	case 'o':
		hostSHA256(unsafe.Pointer(uintptr(0xfffff000)), 1<<16, unsafe.Pointer(sum))
	}
	hostSHA256(unsafe.Pointer(&in[0]), size, unsafe.Pointer(sum))
	answer = []byte(hex.EncodeToString(sum[:]))
	return abiwasm.Pack(uint32(uintptr(unsafe.Pointer(&answer[0]))), uint32(len(answer)))
}

func main() {}
