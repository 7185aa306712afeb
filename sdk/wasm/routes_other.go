//go:build !wasip1

package wasm

import "crypto/sha256"

// routesSHA256 is the SHA-256 of b; in a guest the host computes it
// (routes_wasip1.go).
func routesSHA256(b []byte) [32]byte { return sha256.Sum256(b) }
