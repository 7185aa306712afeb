package secrets

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/crypto/chacha20poly1305"
)

// OwnerProject is the owner of a secret that belongs to its project as a whole (every secret
// of the API today); other owners (one service) may come later and bind differently.
const OwnerProject = "project"

// MaxValueBytes bounds one secret value: 64 KiB.
const MaxValueBytes = 64 << 10

// ErrOpenFailed is wrapped by [Open] and [Rewrap] when a sealed value does not open: a
// ciphertext or wrapped key that was changed, moved to another secret or version, or sealed
// under another KEK than it names. No part of the value is ever returned with it.
var ErrOpenFailed = errors.New("berth: secret value does not open (tampered, moved or wrong key)")

// Binding is what a sealed secret version is bound to: its additional data. A sealed value
// opens only under the same binding, so a ciphertext copied to another project, owner, secret
// or version fails to open.
type Binding struct {
	ProjectID string
	Owner     string
	Name      string
	Version   int
}

// Sealed is one sealed secret version as stored (docs/secrets.md section 3): the value under a
// random 32-byte data key with XChaCha20-Poly1305, and the data key wrapped by the KEK KEKID
// with XChaCha20-Poly1305. Each byte slice is the 24-byte nonce followed by the ciphertext and
// its 16-byte tag.
type Sealed struct {
	KEKID      string `bson:"kek_id" json:"-"`
	WrappedKey []byte `bson:"wrapped_key" json:"-"`
	Ciphertext []byte `bson:"ciphertext" json:"-"`
}

// valueAD is the additional data of the value ciphertext.
func (b Binding) valueAD() []byte {
	return adOf("berth.secret.value.v1", b.ProjectID, b.Owner, b.Name, strconv.Itoa(b.Version))
}

// keyAD is the additional data of the wrapped data key, which also binds the KEK id.
func (b Binding) keyAD(kekID string) []byte {
	return adOf("berth.secret.dek.v1", b.ProjectID, b.Owner, b.Name, strconv.Itoa(b.Version), kekID)
}

// adOf joins parts, each preceded by its length, so no two part lists encode alike.
func adOf(parts ...string) []byte {
	var out []byte
	for _, p := range parts {
		out = strconv.AppendInt(out, int64(len(p)), 10)
		out = append(out, ':')
		out = append(out, p...)
	}
	return out
}

func sealWith(key, plain, ad []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, fmt.Errorf("secrets: cipher: %w", err)
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, plain, ad), nil
}

func openWith(key, sealed, ad []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, fmt.Errorf("secrets: cipher: %w", err)
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, ErrOpenFailed
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], ad)
	if err != nil {
		return nil, ErrOpenFailed
	}
	return plain, nil
}

// Seal seals value for b under a fresh data key wrapped by k's active KEK. Errors: a value
// over [MaxValueBytes]; a cipher failure.
func Seal(k *Keyring, b Binding, value []byte) (Sealed, error) {
	if len(value) > MaxValueBytes {
		return Sealed{}, fmt.Errorf("secrets: value is larger than %d bytes", MaxValueBytes)
	}
	id := k.ActiveKEK()
	kek, _ := k.kek(id)
	dek := randomKey()
	defer clear(dek)
	ct, err := sealWith(dek, value, b.valueAD())
	if err != nil {
		return Sealed{}, err
	}
	wk, err := sealWith(kek, dek, b.keyAD(id))
	if err != nil {
		return Sealed{}, err
	}
	return Sealed{KEKID: id, WrappedKey: wk, Ciphertext: ct}, nil
}

// openKey unwraps s's data key. Errors: wrapping ErrUnknownKEK or ErrOpenFailed.
func openKey(k *Keyring, b Binding, s Sealed) ([]byte, error) {
	kek, ok := k.kek(s.KEKID)
	if !ok {
		return nil, fmt.Errorf("%w: %q (secret %s version %d)", ErrUnknownKEK, s.KEKID, b.Name, b.Version)
	}
	dek, err := openWith(kek, s.WrappedKey, b.keyAD(s.KEKID))
	if err != nil {
		return nil, fmt.Errorf("open data key of secret %s version %d: %w", b.Name, b.Version, err)
	}
	if len(dek) != KeySize {
		clear(dek)
		return nil, fmt.Errorf("open data key of secret %s version %d: %w", b.Name, b.Version, ErrOpenFailed)
	}
	return dek, nil
}

// Open returns the value sealed in s for b. It fails closed: a changed byte anywhere, another
// binding, or a KEK id other than the one the data key was wrapped under gives an error
// wrapping [ErrOpenFailed], and a KEK id the keyring does not hold one wrapping
// [ErrUnknownKEK]; the value is nil with every error. The caller owns the returned bytes and
// should clear them when done.
func Open(k *Keyring, b Binding, s Sealed) ([]byte, error) {
	dek, err := openKey(k, b, s)
	if err != nil {
		return nil, err
	}
	defer clear(dek)
	v, err := openWith(dek, s.Ciphertext, b.valueAD())
	if err != nil {
		return nil, fmt.Errorf("open secret %s version %d: %w", b.Name, b.Version, err)
	}
	return v, nil
}

// Rewrap returns s with its data key wrapped by k's active KEK, the value ciphertext unchanged;
// s itself when it already is. It checks that the value opens before it answers, so a
// re-wrap never carries a broken ciphertext forward. Errors: those of [Open].
func Rewrap(k *Keyring, b Binding, s Sealed) (Sealed, error) {
	active := k.ActiveKEK()
	dek, err := openKey(k, b, s)
	if err != nil {
		return Sealed{}, err
	}
	defer clear(dek)
	v, err := openWith(dek, s.Ciphertext, b.valueAD())
	if err != nil {
		return Sealed{}, fmt.Errorf("open secret %s version %d: %w", b.Name, b.Version, err)
	}
	clear(v)
	if s.KEKID == active {
		return s, nil
	}
	kek, _ := k.kek(active)
	wk, err := sealWith(kek, dek, b.keyAD(active))
	if err != nil {
		return Sealed{}, err
	}
	return Sealed{KEKID: active, WrappedKey: wk, Ciphertext: s.Ciphertext}, nil
}
