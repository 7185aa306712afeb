//go:build wasip1

package wasm

import "unsafe"

//go:wasmimport berth sha256
func hostSHA256(ptr unsafe.Pointer, size uint32, out unsafe.Pointer)

// routesSHA256 is the SHA-256 of b, computed by the host's berth.sha256
// (docs/wasm-abi.md section 3.1): Go's crypto/sha256 runs at about 20 MB/s
// inside a guest, a third of a 1,000-service compilation.
func routesSHA256(b []byte) [32]byte {
	sum := new([32]byte)
	hostSHA256(unsafe.Pointer(unsafe.SliceData(b)), uint32(len(b)), unsafe.Pointer(sum))
	return *sum
}
