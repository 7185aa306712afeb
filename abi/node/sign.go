package node

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"
)

// ErrBadSignature is returned by [Verify] when the signature is missing, malformed or wrong.
var ErrBadSignature = errors.New("berth: desired_state signature does not verify against the cluster signing key")

// Sign sets d.Signature to the Ed25519 signature of d's RFC 8785 form without the
// signature member (docs/node-protocol.md section 5.11).
func Sign(d *DesiredState, key ed25519.PrivateKey) error {
	msg, err := signedBytes(d)
	if err != nil {
		return err
	}
	d.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))
	return nil
}

// Verify checks the signature of a desired_state body as received, before
// anything else of it is trusted: raw is the body's JSON. It returns the parsed
// snapshot, or an error wrapping [ErrBadSignature].
func Verify(raw []byte, pub ed25519.PublicKey) (*DesiredState, error) {
	if err := verifyRaw(raw, pub); err != nil {
		return nil, err
	}
	var d DesiredState
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("parse verified desired_state: %w", err)
	}
	return &d, nil
}

// SignRotate sets r.Signature to the signature by key (the currently pinned
// signing key) over r's RFC 8785 form without the signature member, and fills
// KeyID from PublicKey when empty (docs/node-protocol.md section 5.21).
func SignRotate(r *SigningKeyRotate, key ed25519.PrivateKey) error {
	if r.KeyID == "" {
		pub, err := base64.StdEncoding.DecodeString(r.PublicKey)
		if err != nil || len(pub) != ed25519.PublicKeySize {
			return errors.New("signing_key_rotate: public_key is not a base64 Ed25519 public key")
		}
		r.KeyID = KeyID(pub)
	}
	c := *r
	c.Signature = ""
	raw, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("marshal signing_key_rotate: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return fmt.Errorf("canonical form of signing_key_rotate: %w", err)
	}
	r.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(key, canon))
	return nil
}

// VerifyRotate checks a signing_key_rotate body as received against the
// currently pinned key and returns the new public key. Errors wrap
// [ErrBadSignature] (also for a malformed key or a key_id that does not match it).
func VerifyRotate(raw []byte, pinned ed25519.PublicKey) (ed25519.PublicKey, *SigningKeyRotate, error) {
	if err := verifyRaw(raw, pinned); err != nil {
		return nil, nil, err
	}
	var r SigningKeyRotate
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, nil, fmt.Errorf("%w: parse signing_key_rotate: %w", ErrBadSignature, err)
	}
	pub, err := base64.StdEncoding.DecodeString(r.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return nil, nil, fmt.Errorf("%w: public_key is not a base64 Ed25519 public key", ErrBadSignature)
	}
	if r.KeyID != KeyID(pub) {
		return nil, nil, fmt.Errorf("%w: key_id does not match public_key", ErrBadSignature)
	}
	return ed25519.PublicKey(pub), &r, nil
}

// KeyID is the id of a signing key: lowercase hex SHA-256 of its 32 bytes.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])
}

// verifyRaw checks the signature member of a JSON object against pub over
// the RFC 8785 form of the object without it.
func verifyRaw(raw []byte, pub ed25519.PublicKey) error {
	var generic map[string]json.RawMessage
	if err := json.Unmarshal(raw, &generic); err != nil {
		return fmt.Errorf("%w: body is not a JSON object", ErrBadSignature)
	}
	sigJSON, ok := generic["signature"]
	if !ok {
		return fmt.Errorf("%w: no signature", ErrBadSignature)
	}
	var sigText string
	if err := json.Unmarshal(sigJSON, &sigText); err != nil {
		return fmt.Errorf("%w: signature is not a string", ErrBadSignature)
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("%w: malformed signature", ErrBadSignature)
	}
	delete(generic, "signature")
	unsigned, err := json.Marshal(generic)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	canon, err := jcs.Transform(unsigned)
	if err != nil {
		return fmt.Errorf("%w: canonical form: %w", ErrBadSignature, err)
	}
	if !ed25519.Verify(pub, canon, sig) {
		return ErrBadSignature
	}
	return nil
}

func signedBytes(d *DesiredState) ([]byte, error) {
	c := *d
	c.Signature = ""
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("marshal desired_state: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canonical form of desired_state: %w", err)
	}
	return canon, nil
}
