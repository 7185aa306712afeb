package machines

import (
	"crypto/sha256"
	"encoding/base32"
)

var base32NoPad = base32.StdEncoding.WithPadding(base32.NoPadding)

// keySum derives 16 bytes from an idempotency key.
func keySum(key string) [16]byte {
	sum := sha256.Sum256([]byte("machine\x00" + key))
	var out [16]byte
	copy(out[:], sum[:16])
	return out
}
