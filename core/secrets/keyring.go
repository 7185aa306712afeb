// Package secrets owns project secrets: the keyring of key-encryption keys, the envelope that
// seals each secret version, the value-free secret and secret-set documents, and key rotation.
package secrets

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/internal/securefile"
)

// KeyringFile is the keyring's default path under berthd's data directory.
const KeyringFile = "keys/secrets.keyring"

// KeyringVersion is the format version of the keyring file (docs/secrets.md section 2).
const KeyringVersion = 1

// MaxKeyringBytes bounds the keyring file read: 64 KiB.
const MaxKeyringBytes = 64 << 10

// KeySize is the size of every key of the keyring: a KEK and the digest key are 32 bytes.
const KeySize = 32

// IDPrefixKEK prefixes key-encryption key ids.
const IDPrefixKEK = "kek_"

// Errors of keyring functions.
var (
	// ErrKeyringInvalid is wrapped by [LoadKeyring] and [Keyring.Check] for a keyring file that
	// is unsafe (see securefile), malformed, of another version, too large, or whose active KEK
	// is missing.
	ErrKeyringInvalid = errors.New("berth: secrets keyring is invalid")
	// ErrKeyringMissing is wrapped by [LoadKeyring] when the file does not exist.
	ErrKeyringMissing = errors.New("berth: secrets keyring is missing")
	// ErrUnknownKEK is wrapped by [Open] and [Rewrap] for a sealed value whose KEK id the keyring
	// does not hold.
	ErrUnknownKEK = errors.New("berth: sealed under an unknown key-encryption key")
	// ErrKEKInUse is wrapped by [Keyring.Retire] when asked to retire the active KEK.
	ErrKEKInUse = errors.New("berth: the key-encryption key is in use")
)

var kekIDRE = regexp.MustCompile(`^kek_[0-9A-Z]{26}$`)

// keyringDoc is the keyring file: JSON, 0600 (docs/secrets.md section 2).
type keyringDoc struct {
	Version     int       `json:"version"`
	ActiveKEKID string    `json:"active_kek_id"`
	KEKs        []kekDoc  `json:"keks"`
	DigestKey   string    `json:"digest_key"`
	CreatedAt   time.Time `json:"created_at"`
}

type kekDoc struct {
	ID        string    `json:"id"`
	Key       string    `json:"key"` // base64, 32 bytes
	CreatedAt time.Time `json:"created_at"`
}

// KEKInfo describes one key-encryption key without its bytes.
type KEKInfo struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	Active    bool      `json:"active"`
}

// Keyring holds the key-encryption keys (KEKs) and the digest key of one berthd. It is safe for
// concurrent use; [Keyring.Rotate] and [Keyring.Retire] rewrite the file before they change
// what the Keyring holds, so a crash leaves the file and the store consistent with one another.
type Keyring struct {
	path string

	mu        sync.RWMutex
	active    string
	keks      map[string][]byte
	created   map[string]time.Time
	digestKey []byte
	createdAt time.Time
}

// LoadKeyring reads the keyring at path. The file must be a regular, non-symlink file with no
// group or other permission, at most [MaxKeyringBytes], of format [KeyringVersion], with an
// active KEK among its KEKs and every key 32 bytes. Errors: wrapping [ErrKeyringMissing] when
// the file does not exist, [ErrKeyringInvalid] otherwise.
func LoadKeyring(path string) (*Keyring, error) {
	data, err := securefile.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w: %s", ErrKeyringMissing, path)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrKeyringInvalid, err)
	case len(data) > MaxKeyringBytes:
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrKeyringInvalid, path, MaxKeyringBytes)
	}
	k, err := parseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrKeyringInvalid, path, err)
	}
	k.path = path
	return k, nil
}

// LoadOrCreateKeyring returns the keyring at path, generating it (one KEK, active, and a digest
// key) when the file does not exist and create is true; created reports that it did. berthd
// passes create only while the store holds no secret, so a keyring lost after secrets exist is
// never silently replaced (no keyless mode). Errors: those of [LoadKeyring], and an I/O error
// writing the new file.
func LoadOrCreateKeyring(path string, create bool) (k *Keyring, created bool, err error) {
	k, err = LoadKeyring(path)
	if err == nil || !errors.Is(err, ErrKeyringMissing) || !create {
		return k, false, err
	}
	now := time.Now().UTC()
	k = &Keyring{path: path, keks: map[string][]byte{}, created: map[string]time.Time{}, createdAt: now}
	id := identity.NewID(IDPrefixKEK)
	k.keks[id], k.created[id], k.active = randomKey(), now, id
	k.digestKey = randomKey()
	if err := k.writeLocked(k.keks, k.created, k.active); err != nil {
		return nil, false, err
	}
	return k, true, nil
}

func randomKey() []byte {
	b := make([]byte, KeySize)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return b
}

func parseKeyring(data []byte) (*Keyring, error) {
	var doc keyringDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a keyring: %w", err)
	}
	if dec.More() {
		return nil, errors.New("data after the keyring object")
	}
	if doc.Version != KeyringVersion {
		return nil, fmt.Errorf("version %d, want %d", doc.Version, KeyringVersion)
	}
	k := &Keyring{keks: map[string][]byte{}, created: map[string]time.Time{}, active: doc.ActiveKEKID, createdAt: doc.CreatedAt}
	for _, e := range doc.KEKs {
		if !kekIDRE.MatchString(e.ID) {
			return nil, fmt.Errorf("KEK id %q is not kek_ followed by a ULID", e.ID)
		}
		if _, dup := k.keks[e.ID]; dup {
			return nil, fmt.Errorf("KEK %s is listed twice", e.ID)
		}
		key, err := base64.StdEncoding.DecodeString(e.Key)
		if err != nil || len(key) != KeySize {
			return nil, fmt.Errorf("KEK %s is not %d bytes of base64", e.ID, KeySize)
		}
		k.keks[e.ID], k.created[e.ID] = key, e.CreatedAt
	}
	if _, ok := k.keks[k.active]; !ok {
		return nil, fmt.Errorf("active KEK %q is not among the keyring's keys", k.active)
	}
	dk, err := base64.StdEncoding.DecodeString(doc.DigestKey)
	if err != nil || len(dk) != KeySize {
		return nil, fmt.Errorf("digest_key is not %d bytes of base64", KeySize)
	}
	k.digestKey = dk
	return k, nil
}

// writeLocked writes the keyring with keks, created and active atomically (securefile). mu must
// be held for writing, or k not yet shared.
func (k *Keyring) writeLocked(keks map[string][]byte, created map[string]time.Time, active string) error {
	doc := keyringDoc{Version: KeyringVersion, ActiveKEKID: active, DigestKey: base64.StdEncoding.EncodeToString(k.digestKey), CreatedAt: k.createdAt, KEKs: []kekDoc{}}
	ids := make([]string, 0, len(keks))
	for id := range keks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		doc.KEKs = append(doc.KEKs, kekDoc{ID: id, Key: base64.StdEncoding.EncodeToString(keks[id]), CreatedAt: created[id]})
	}
	raw, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("secrets: encode keyring: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(k.path), securefile.DirMode); err != nil {
		return fmt.Errorf("secrets: write keyring %s: %w", k.path, err)
	}
	if err := securefile.WriteFile(k.path, append(raw, '\n')); err != nil {
		return fmt.Errorf("secrets: write keyring: %w", err)
	}
	return nil
}

// Path returns the keyring file's path.
func (k *Keyring) Path() string { return k.path }

// ActiveKEK returns the id of the KEK new data keys are wrapped by.
func (k *Keyring) ActiveKEK() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.active
}

// KEKs lists the keyring's KEKs, oldest first, without their bytes.
func (k *Keyring) KEKs() []KEKInfo {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]KEKInfo, 0, len(k.keks))
	for id := range k.keks {
		out = append(out, KEKInfo{ID: id, CreatedAt: k.created[id], Active: id == k.active})
	}
	slices.SortFunc(out, func(a, b KEKInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Has reports whether the keyring holds the KEK id.
func (k *Keyring) Has(id string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	_, ok := k.keks[id]
	return ok
}

func (k *Keyring) kek(id string) ([]byte, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	key, ok := k.keks[id]
	return key, ok
}

// Rotate adds a new KEK and makes it active, writing the file first; the previous KEKs stay
// until [Keyring.Retire]. It returns the new KEK's id. Errors: an I/O error writing the file
// (a keyring mounted read-only cannot rotate), after which nothing changed.
func (k *Keyring) Rotate() (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id := identity.NewID(IDPrefixKEK)
	keks, created := cloneMap(k.keks), cloneMap(k.created)
	keks[id], created[id] = randomKey(), time.Now().UTC()
	if err := k.writeLocked(keks, created, id); err != nil {
		return "", err
	}
	k.keks, k.created, k.active = keks, created, id
	return id, nil
}

// Retire removes the KEK id from the keyring file and memory. The caller has verified that
// nothing is wrapped by it any more. Retiring an absent KEK is a no-op. Errors: wrapping
// [ErrKEKInUse] for the active KEK; an I/O error writing the file.
func (k *Keyring) Retire(id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if id == k.active {
		return fmt.Errorf("%w: %s is the active key", ErrKEKInUse, id)
	}
	if _, ok := k.keks[id]; !ok {
		return nil
	}
	keks, created := cloneMap(k.keks), cloneMap(k.created)
	delete(keks, id)
	delete(created, id)
	if err := k.writeLocked(keks, created, k.active); err != nil {
		return err
	}
	k.keks, k.created = keks, created
	return nil
}

// Check reads the keyring file again and reports whether it still holds every KEK this Keyring
// uses, with the same bytes and the same active KEK. Errors: those of [LoadKeyring], and one
// wrapping [ErrKeyringInvalid] when the file no longer matches.
func (k *Keyring) Check() error {
	disk, err := LoadKeyring(k.path)
	if err != nil {
		return err
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	if disk.active != k.active {
		return fmt.Errorf("%w: the file's active KEK is %s, berthd uses %s", ErrKeyringInvalid, disk.active, k.active)
	}
	for id, key := range k.keks {
		if !hmac.Equal(disk.keks[id], key) {
			return fmt.Errorf("%w: KEK %s differs from the one berthd uses or is missing", ErrKeyringInvalid, id)
		}
	}
	if !hmac.Equal(disk.digestKey, k.digestKey) {
		return fmt.Errorf("%w: the digest key differs from the one berthd uses", ErrKeyringInvalid)
	}
	return nil
}

// Digest returns the keyed digest of a secret value as reads show it:
// "hmac-sha256:<64 hex>" of HMAC-SHA-256 under the keyring's digest key over the binding's
// project id, owner and name and the value. Without the keyring a digest cannot be checked
// against guesses, so short values cannot be brute-forced from it; two versions of one secret
// with equal values have equal digests.
func (k *Keyring) Digest(b Binding, value []byte) string {
	k.mu.RLock()
	key := k.digestKey
	k.mu.RUnlock()
	m := hmac.New(sha256.New, key)
	for _, p := range []string{"berth.secret.digest.v1", b.ProjectID, b.Owner, b.Name} {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	m.Write(value)
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil))
}

func cloneMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}
