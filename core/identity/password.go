package identity

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"
)

// Password bounds (docs/api.md section "Identity"): at least 20 characters, at most 1,024 bytes
// of UTF-8.
const (
	MinPasswordChars = 20
	MaxPasswordBytes = 1024
)

// ErrPasswordPolicy is returned (wrapped) when a new password is shorter than
// [MinPasswordChars] characters, longer than [MaxPasswordBytes] bytes or not valid UTF-8.
var ErrPasswordPolicy = errors.New("berth: password must be 20 characters to 1024 bytes of UTF-8")

// Argon2Params are the argon2id cost parameters written into every verifier, so that raising
// them later leaves older verifiers readable. Memory is in KiB.
type Argon2Params struct {
	Memory  uint32
	Time    uint32
	Threads uint8
	KeyLen  uint32
	SaltLen uint32
}

// DefaultArgon2Params are 64 MiB, 2 passes, 1 lane. BenchmarkIdentity/verify
// (bench/identity_test.go) measured about 116 ms of CPU per verification on this project's
// machine; its wall-clock p50 depends on what else runs.
var DefaultArgon2Params = Argon2Params{Memory: 64 * 1024, Time: 2, Threads: 1, KeyLen: 32, SaltLen: 16}

// CheckPassword returns an error wrapping [ErrPasswordPolicy] unless pw is valid UTF-8 of at
// least [MinPasswordChars] characters and at most [MaxPasswordBytes] bytes.
func CheckPassword(pw string) error {
	if !utf8.ValidString(pw) || utf8.RuneCountInString(pw) < MinPasswordChars || len(pw) > MaxPasswordBytes {
		return fmt.Errorf("identity: %w", ErrPasswordPolicy)
	}
	return nil
}

// HashPassword returns an argon2id verifier of pw in the PHC string form
// "$argon2id$v=19$m=<KiB>,t=<passes>,p=<lanes>$<salt>$<key>" (salt and key in unpadded
// standard base64). It does not apply [CheckPassword]; it fails only when the randomness
// source does.
func HashPassword(pw string, p Argon2Params) (string, error) {
	salt := make([]byte, p.SaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("identity: password salt: %w", err)
	}
	key := argon2.IDKey([]byte(pw), salt, p.Time, p.Memory, p.Threads, p.KeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.Memory, p.Time, p.Threads,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

// VerifyPassword reports whether pw matches verifier (a [HashPassword] string with any
// parameters), comparing in constant time. A malformed verifier never matches.
func VerifyPassword(pw, verifier string) bool {
	p, salt, key, ok := parseVerifier(verifier)
	if !ok {
		return false
	}
	got := argon2.IDKey([]byte(pw), salt, p.Time, p.Memory, p.Threads, uint32(len(key)))
	return subtle.ConstantTimeCompare(got, key) == 1
}

// parseVerifier splits a PHC argon2id string. Bounds keep a corrupt record from asking for
// gigabytes of memory.
func parseVerifier(v string) (Argon2Params, []byte, []byte, bool) {
	parts := strings.Split(v, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != fmt.Sprintf("v=%d", argon2.Version) {
		return Argon2Params{}, nil, nil, false
	}
	var p Argon2Params
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.Memory, &p.Time, &p.Threads); err != nil {
		return Argon2Params{}, nil, nil, false
	}
	if p.Memory < 8 || p.Memory > 4<<20 || p.Time < 1 || p.Time > 64 || p.Threads < 1 {
		return Argon2Params{}, nil, nil, false
	}
	b64 := base64.RawStdEncoding
	salt, err1 := b64.DecodeString(parts[4])
	key, err2 := b64.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(salt) < 8 || len(key) < 16 || len(key) > 128 {
		return Argon2Params{}, nil, nil, false
	}
	return p, salt, key, true
}
