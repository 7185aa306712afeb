// Package identity owns who may call Berth: users with roles and argon2id password verifiers,
// human sessions with credential generations, named machine tokens bounded by project and
// service, the one check of every bearer (stored only as SHA-256 digests), scopes and
// principals, the cluster's signing key and id, and typed object ids (DESIGN.md section 5,
// docs/api.md section 9).
package identity

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// Bearer prefixes tell the kinds of bearer apart at a glance and in logs of refusals.
const (
	PrefixToken   = "brt_" // admin and machine API tokens
	PrefixSession = "brs_" // human session tokens, issued by login
	PrefixNode    = "brn_" // node credentials, issued at enrollment
	PrefixJoin    = "brj_" // node join tokens
	PrefixRunner  = "bre_" // runner enrollment tokens
	PrefixRelay   = "brr_" // cluster relay credentials (docs/relay.md section 10)

	tokenRawBytes = 32
	tokenBodyLen  = 43 // base64url without padding of 32 bytes
)

// NewToken returns a new bearer: prefix followed by 32 bytes from crypto/rand in base64url
// without padding (43 characters), and its [Digest]. The token is shown to its holder once;
// only the digest is stored. It fails only when the system's randomness source fails.
func NewToken(prefix string) (token, digest string, err error) {
	var b [tokenRawBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("identity: new token: read random bytes: %w", err)
	}
	token = prefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, Digest(token), nil
}

// Digest returns the lower-case hex SHA-256 (64 characters) of the whole token, prefix included.
func Digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// WellFormed reports whether token has the given prefix followed by exactly 43 base64url
// characters, the shape [NewToken] produces. It says nothing about whether the token is valid.
func WellFormed(token, prefix string) bool {
	body, ok := strings.CutPrefix(token, prefix)
	if !ok || len(body) != tokenBodyLen {
		return false
	}
	_, err := base64.RawURLEncoding.Strict().DecodeString(body)
	return err == nil
}

// Equal reports whether a and b are equal, in time that depends only on their lengths. Use it
// to compare a presented secret or digest with a stored one.
func Equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// VerifyToken reports whether token hashes to the stored digest, comparing in constant time.
func VerifyToken(token, digest string) bool {
	return Equal(Digest(token), digest)
}

// CheckBearer is the one check of a presented bearer against a stored digest, for every
// credential kind (API tokens, sessions, node credentials, join and runner enrollment
// tokens): it reports whether presented has the given prefix and shape and hashes to
// storedDigest, comparing in constant time. Callers answer every false with
// [ErrUnauthenticated] and nothing more specific.
func CheckBearer(presented, prefix, storedDigest string) bool {
	return WellFormed(presented, prefix) && Equal(Digest(presented), storedDigest)
}
