package registry

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
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
	// Cred is the SHA-256 digest of the Berth credential the bearer was
	// issued to, sealed under a key derived from the registry key
	// ([sealCred]), so every request can check that credential is still
	// good without the bearer showing its digest. Bearers without it (issued
	// before it existed) are refused and the client fetches a new one.
	Cred string `json:"cred,omitempty"`
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

// credKey derives the key that seals [claims.Cred] from the registry key.
func credKey(key []byte) []byte {
	k := sha256.Sum256(append([]byte("berth registry credential seal v1\x00"), key...))
	return k[:]
}

// sealCred seals a credential digest for [claims.Cred]: base64url of a
// random 24-byte nonce followed by its XChaCha20-Poly1305 ciphertext.
func sealCred(key []byte, digest string) (string, error) {
	aead, err := chacha20poly1305.NewX(credKey(key))
	if err != nil {
		return "", fmt.Errorf("registry: seal credential: %w", err)
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(digest)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("registry: seal credential: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, []byte(digest), []byte("cred"))), nil
}

// openCred returns the digest [sealCred] sealed; errBadToken for anything
// else.
func openCred(key []byte, sealed string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return "", errBadToken
	}
	aead, err := chacha20poly1305.NewX(credKey(key))
	if err != nil || len(raw) < aead.NonceSize()+aead.Overhead() {
		return "", errBadToken
	}
	d, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte("cred"))
	if err != nil {
		return "", errBadToken
	}
	return string(d), nil
}
