package runners

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"strings"
)

// MinLegacySecretBytes is the shortest legacy registration secret accepted.
const MinLegacySecretBytes = 32

// LegacySecret is the legacy shared registration secret of docs/runner-protocol.md section 6.4
// (BERTH_RUNNER_REGISTRATION_TOKEN on berthd): it lets whoever holds it register, or rotate the
// credential of, any named node. Only its SHA-256 digest is kept; a presented value is compared by
// digest in constant time. Off unless configured.
type LegacySecret struct {
	digest [sha256.Size]byte
}

// ErrLegacySecretWeak is returned by [NewLegacySecret] for a secret shorter than
// [MinLegacySecretBytes] or one shaped like a Berth token (it must be a dedicated secret, not a
// reused token).
var ErrLegacySecretWeak = errors.New("berth: the legacy registration secret must be a dedicated random secret of at least 32 bytes")

// NewLegacySecret keeps the digest of secret. Errors: [ErrLegacySecretWeak].
func NewLegacySecret(secret string) (*LegacySecret, error) {
	if len(secret) < MinLegacySecretBytes {
		return nil, ErrLegacySecretWeak
	}
	for _, p := range []string{"brt_", "brn_", "brj_", "bre_", "brl_"} {
		if strings.HasPrefix(secret, p) {
			return nil, ErrLegacySecretWeak
		}
	}
	return &LegacySecret{digest: sha256.Sum256([]byte(secret))}, nil
}

// Matches reports whether presented is the secret, in time independent of where they differ.
func (l *LegacySecret) Matches(presented string) bool {
	if l == nil || presented == "" {
		return false
	}
	d := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(d[:], l.digest[:]) == 1
}
