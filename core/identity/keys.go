package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/internal/securefile"
)

// SigningKeyFile is the cluster signing key's path under the data directory.
const SigningKeyFile = "keys/signing.key"

// ClusterIDFile is the cluster id's path under the data directory.
const ClusterIDFile = "cluster-id"

// LoadOrCreateSigningKey returns the cluster's Ed25519 signing key from dataDir/keys/signing.key,
// generating and writing it (0600 in a 0700 directory, via [securefile.WriteFile]) when the file
// does not exist; created reports the latter. The file is PEM, block type "PRIVATE KEY", holding
// the PKCS #8 DER encoding (what `openssl pkey` reads and writes).
//
// Errors: wrapping [securefile.ErrInsecure] for an unsafe file; an error when the file holds
// no PEM block, another key type or trailing data. The caller holds the data directory lock
// ([store.LockDir]), so no two processes create the key at once.
func LoadOrCreateSigningKey(dataDir string) (ed25519.PrivateKey, bool, error) {
	path := filepath.Join(dataDir, SigningKeyFile)
	data, err := securefile.ReadFile(path)
	switch {
	case err == nil:
		key, err := parseSigningKey(data)
		if err != nil {
			return nil, false, fmt.Errorf("identity: load signing key %s: %w", path, err)
		}
		return key, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("identity: load signing key: %w", err)
	}

	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("identity: generate signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, false, fmt.Errorf("identity: encode signing key: %w", err)
	}
	if err := securefile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return nil, false, fmt.Errorf("identity: write signing key: %w", err)
	}
	return key, true, nil
}

func parseSigningKey(data []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM \"PRIVATE KEY\" block")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("data after the PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PKCS #8: %w", err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want ed25519", k)
	}
	return key, nil
}

// ClusterID returns the cluster id (cls_ followed by an upper-case ULID) kept in
// dataDir/cluster-id, creating the file (0600, one line) on first call; created reports that.
// The id is written once and never changes. Errors: an unsafe file (wrapping
// [securefile.ErrInsecure]), a malformed id, or an I/O failure. The caller holds the data
// directory lock.
func ClusterID(dataDir string) (id string, created bool, err error) {
	path := filepath.Join(dataDir, ClusterIDFile)
	data, err := securefile.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(data))
		if !ValidID(id, IDPrefixCluster) {
			return "", false, fmt.Errorf("identity: cluster id in %s is malformed: %q", path, id)
		}
		return id, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", false, fmt.Errorf("identity: load cluster id: %w", err)
	}
	id = NewID(IDPrefixCluster)
	if err := securefile.WriteFile(path, []byte(id+"\n")); err != nil {
		return "", false, fmt.Errorf("identity: write cluster id: %w", err)
	}
	return id, true, nil
}

// RetiredKeysDir holds signing keys replaced by [RotateSigningKey], one file
// per key named by its key id (hex SHA-256 of the public key), so that a
// node that was away during a rotation can still be handed the new key
// under the signature of the one it pins (docs/node-protocol.md section 5.21).
const RetiredKeysDir = "keys/retired"

// RotateSigningKey generates a new cluster signing key, keeps the current
// one under [RetiredKeysDir], and makes the new one current (written 0600
// like the first). It returns the previous and the new key. The caller holds
// the data directory lock, and then hands the new key to every node signed by
// the previous one before it signs anything with the new key.
func RotateSigningKey(dataDir string) (prev, next ed25519.PrivateKey, err error) {
	prev, _, err = LoadOrCreateSigningKey(dataDir)
	if err != nil {
		return nil, nil, err
	}
	if err := writeSigningKey(filepath.Join(dataDir, RetiredKeysDir, keyID(prev)+".key"), prev); err != nil {
		return nil, nil, fmt.Errorf("identity: keep the retired signing key: %w", err)
	}
	_, next, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("identity: generate signing key: %w", err)
	}
	if err := writeSigningKey(filepath.Join(dataDir, SigningKeyFile), next); err != nil {
		return nil, nil, fmt.Errorf("identity: write the new signing key: %w", err)
	}
	return prev, next, nil
}

// RetiredSigningKeys returns the keys [RotateSigningKey] retired, by key id;
// an empty map when there are none.
func RetiredSigningKeys(dataDir string) (map[string]ed25519.PrivateKey, error) {
	dir := filepath.Join(dataDir, RetiredKeysDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]ed25519.PrivateKey{}, nil
	} else if err != nil {
		return nil, fmt.Errorf("identity: read retired signing keys: %w", err)
	}
	out := map[string]ed25519.PrivateKey{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".key")
		if !ok {
			continue
		}
		data, err := securefile.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("identity: read retired signing key %s: %w", id, err)
		}
		key, err := parseSigningKey(data)
		if err != nil {
			return nil, fmt.Errorf("identity: retired signing key %s: %w", id, err)
		}
		out[keyID(key)] = key
	}
	return out, nil
}

func writeSigningKey(path string, key ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode signing key: %w", err)
	}
	return securefile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// keyID is the hex SHA-256 of key's public half (node.KeyID's rule).
func keyID(key ed25519.PrivateKey) string {
	sum := sha256.Sum256(key.Public().(ed25519.PublicKey))
	return hex.EncodeToString(sum[:])
}
