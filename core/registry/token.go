package registry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// TokenTTL is how long a registry bearer issued by /v2/token is good for.
const TokenTTL = 5 * time.Minute

// claims are what a registry bearer says: who asked, and for each
// repository it asked about, the actions it was granted (possibly none).
type claims struct {
	Subject string `json:"sub"`            // principal id (tok_..., nod_...)
	Kind    string `json:"kind"`           // identity kind: admin, machine, human, node
	Node    string `json:"node,omitempty"` // node id when Kind is node
	// Access maps "repository:<name>" or "registry:catalog" to the granted
	// actions ("pull", "push", "delete", "*").
	Access    map[string][]string `json:"access"`
	ExpiresAt int64               `json:"exp"` // Unix seconds
	IssuedAt  int64               `json:"iat"`
}

var errBadToken = errors.New("berth: registry token invalid or expired")

// sign returns the compact form "<base64url claims>.<base64url HMAC-SHA256>".
func sign(key []byte, c claims) (string, error) {
	raw, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	body := base64.RawURLEncoding.EncodeToString(raw)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(body))
	return body + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

// verify checks a bearer's MAC and expiry and returns its claims.
func verify(key []byte, tok string, now time.Time) (claims, error) {
	body, mac, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > 16<<10 {
		return claims{}, errBadToken
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil {
		return claims{}, errBadToken
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(body))
	if !hmac.Equal(got, m.Sum(nil)) {
		return claims{}, errBadToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return claims{}, errBadToken
	}
	var c claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return claims{}, errBadToken
	}
	if now.Unix() >= c.ExpiresAt {
		return claims{}, errBadToken
	}
	return c, nil
}
