package node

import (
	"crypto/ed25519"
	"encoding/base64"
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
	var generic map[string]json.RawMessage
	if err := json.Unmarshal(raw, &generic); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrBadSignature)
	}
	sigJSON, ok := generic["signature"]
	if !ok {
		return nil, fmt.Errorf("%w: no signature", ErrBadSignature)
	}
	var sigText string
	if err := json.Unmarshal(sigJSON, &sigText); err != nil {
		return nil, fmt.Errorf("%w: signature is not a string", ErrBadSignature)
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: malformed signature", ErrBadSignature)
	}
	delete(generic, "signature")
	unsigned, err := json.Marshal(generic)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	canon, err := jcs.Transform(unsigned)
	if err != nil {
		return nil, fmt.Errorf("%w: canonical form: %w", ErrBadSignature, err)
	}
	if !ed25519.Verify(pub, canon, sig) {
		return nil, ErrBadSignature
	}
	var d DesiredState
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("parse verified desired_state: %w", err)
	}
	return &d, nil
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
