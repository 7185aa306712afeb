// Package wasm is the WebAssembly extension ABI, version 1: the names and
// signatures of the exports a module provides, and the JSON it reads and writes.
//
// A module is one of two kinds: an admission policy ([KindPolicy]) or a route
// compiler ([KindRoutes]). Every module exports, in the words of
// docs/wasm-abi.md section 2:
//
//	memory                                 the linear memory the host reads and writes
//	berth_abi_version() -> i32             (major << 16) | minor, see [Version]
//	berth_metadata() -> i64                packed pointer and length of [Metadata] as JSON
//	allocate(size i32) -> i32              a pointer to size fresh bytes; 0 when it cannot
//	deallocate(ptr i32, size i32)          gives back what allocate or an entry point returned
//	policy_evaluate(ptr i32, len i32) -> i64   KindPolicy: [PolicyInput] in, [PolicyOutput] out
//	routes_compile(ptr i32, len i32) -> i64    KindRoutes: [RoutesInput] in, [RoutesOutput] out
//
// A packed i64 holds a pointer in its high 32 bits and a length in its low 32
// bits ([Pack], [Unpack]). This package imports only the standard library, so
// Go guests (GOOS=wasip1) and the host share it.
package wasm

import "fmt"

// Version 1.3 of the ABI.
//
// Changelog (a new major is a breaking change; a new minor only adds optional
// fields, exports or host imports):
//   - 1.3 (2026-12): routes may carry path_prefix, strip_prefix and
//     headers (request matching, docs/routes.md section 3); the service.apply
//     input carries cause ([InputSchemaVersion] "1.2").
//   - 1.2 (2026-12): the host import berth.sha256 ([HostSHA256]).
//   - 1.1 (2026-12): the policy input carries schema_version and the whole
//     service ([InputSchemaVersion] "1.1").
//   - 1.0 (2025-11): first version: policy_evaluate and routes_compile.
const (
	Major = 1
	Minor = 3
)

// Version packs a major and minor ABI version the way berth_abi_version
// returns it: (major << 16) | minor.
func Version(major, minor int) uint32 { return uint32(major)<<16 | uint32(minor)&0xffff }

// SplitVersion is the inverse of [Version].
func SplitVersion(v uint32) (major, minor int) { return int(v >> 16), int(v & 0xffff) }

// Export names (docs/wasm-abi.md section 2).
const (
	ExportMemory         = "memory"
	ExportABIVersion     = "berth_abi_version"
	ExportMetadata       = "berth_metadata"
	ExportAllocate       = "allocate"
	ExportDeallocate     = "deallocate"
	ExportPolicyEvaluate = "policy_evaluate"
	ExportRoutesCompile  = "routes_compile"
)

// Host imports a module may use (docs/wasm-abi.md section 3). HostModule is
// the import module name; HostLog is log(level i32, ptr i32, len i32), which
// writes one bounded line to the host's log; HostSHA256 (since 1.2) is
// sha256(ptr i32, len i32, out i32), which writes the 32-byte SHA-256 of the
// len bytes at ptr to out, each byte costing one unit of the call's fuel,
// and traps on a range outside memory. Besides these a module may import
// wasi_snapshot_preview1, where the host provides no clock, no randomness, no
// files, no environment and no network: the clock is fixed and random_get is a
// fixed sequence, so the same input gives the same output bytes.
const (
	HostModule = "berth"
	HostLog    = "log"
	HostSHA256 = "sha256"
)

// Log levels of the host log import.
const (
	LogDebug int32 = 0
	LogInfo  int32 = 1
	LogWarn  int32 = 2
	LogError int32 = 3
)

// Kind says what a module does and therefore which entry point it exports.
type Kind string

// Module kinds.
const (
	KindPolicy Kind = "policy"
	KindRoutes Kind = "routes"
)

// EntryPoint returns the export that carries k's calls, or "" for an unknown kind.
func (k Kind) EntryPoint() string {
	switch k {
	case KindPolicy:
		return ExportPolicyEvaluate
	case KindRoutes:
		return ExportRoutesCompile
	}
	return ""
}

// Metadata is what berth_metadata returns (docs/wasm-abi.md section 2.2).
// ABIMajor and ABIMinor must equal what berth_abi_version reports. Name is
// a DNS label; Version is free text, for example a semantic version.
type Metadata struct {
	Kind     Kind   `json:"kind"`
	ABIMajor int    `json:"abi_major"`
	ABIMinor int    `json:"abi_minor"`
	Name     string `json:"name"`
	Version  string `json:"version"`
}

// Validate reports what is wrong with m, or nil.
func (m Metadata) Validate() error {
	if m.Kind.EntryPoint() == "" {
		return fmt.Errorf("metadata: unknown kind %q (want %q or %q)", m.Kind, KindPolicy, KindRoutes)
	}
	if m.Name == "" {
		return fmt.Errorf("metadata: name is empty")
	}
	if m.ABIMajor != Major {
		return fmt.Errorf("metadata: ABI major %d, this host speaks %d", m.ABIMajor, Major)
	}
	return nil
}

// Pack puts a pointer and a length into one i64 result.
func Pack(ptr, length uint32) uint64 { return uint64(ptr)<<32 | uint64(length) }

// Unpack is the inverse of [Pack].
func Unpack(v uint64) (ptr, length uint32) { return uint32(v >> 32), uint32(v) }

// GuestError is the error convention (docs/wasm-abi.md section 4): an entry
// point that cannot answer (malformed input, an unknown hook) returns an
// output object whose only field is "error". A trap is also an error, but a
// module should trap only on a bug. Codes are the module's own; the host
// reports them with the module's name and digest.
type GuestError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes a module should use for the common cases.
const (
	// ErrCodeBadInput: the input is not JSON or not of the documented shape.
	ErrCodeBadInput = "bad_input"
	// ErrCodeUnsupported: a hook or field the module does not handle.
	ErrCodeUnsupported = "unsupported"
)

// Error formats e as "code: message".
func (e *GuestError) Error() string { return e.Code + ": " + e.Message }
