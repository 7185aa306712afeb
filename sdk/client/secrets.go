package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// SecretRef is one reference from a service (or a secret set) to a secret (docs/api.md section
// 10): its name, a pinned version (0: the current one, so a new version rolls the service) and
// how the workload receives it, As "env" (an environment variable; also when empty), "file"
// (a file of that name in the directory $BERTH_SECRETS_DIR) or "registry" (the key is a registry
// host, the value "user:password" pulls the service's image from it; the workload never sees
// it, docs/secrets.md section 5). In JSON it is either the secret's
// name as a string or an object {"secret", "version", "as"}.
type SecretRef struct {
	Secret  string `json:"secret"`
	Version int    `json:"version,omitempty"`
	As      string `json:"as,omitempty"`
}

// UnmarshalJSON accepts a name ("stripe-key") or an object with only the fields above.
func (r *SecretRef) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var name string
		if err := json.Unmarshal(b, &name); err != nil {
			return err
		}
		*r = SecretRef{Secret: name}
		return nil
	}
	type plain SecretRef
	var p plain
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("a secret reference is a name or {\"secret\", \"version\", \"as\"}: %w", err)
	}
	if p.Secret == "" {
		return errors.New("a secret reference object needs \"secret\"")
	}
	*r = SecretRef(p)
	return nil
}

// MarshalJSON writes the short form (the name) when only the name is set.
func (r SecretRef) MarshalJSON() ([]byte, error) {
	if r.Version == 0 && r.As == "" {
		return json.Marshal(r.Secret)
	}
	type plain SecretRef
	return json.Marshal(plain(r))
}

// SecretVersion describes one immutable version of a secret, without its value.
type SecretVersion struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	// Author names who wrote it: "<kind>:<id>" of the principal.
	Author string `json:"author"`
	// Digest is "hmac-sha256:<hex>", keyed by the cluster's keyring: equal values of one secret
	// have equal digests, and a digest cannot be checked against guesses without the keyring.
	Digest string `json:"digest"`
}

// SecretUse names a service that references a secret (directly or through a set) and how.
type SecretUse struct {
	Service string `json:"service"`
	// Keys are the environment variables or files it maps the secret to.
	Keys []string `json:"keys"`
	// Via is the secret set the reference comes through; empty for a direct one.
	Via string `json:"via,omitempty"`
}

// Secret is a secret as the API shows it: never its value.
type Secret struct {
	Project   string          `json:"project"`
	Name      string          `json:"name"`
	Revision  int64           `json:"revision"`
	Current   int             `json:"current"`
	Versions  []SecretVersion `json:"versions"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	UsedBy    []SecretUse     `json:"used_by"`
}

// SecretSet is a named group of references attached to services with `secret_sets`.
type SecretSet struct {
	Project   string               `json:"project"`
	Name      string               `json:"name"`
	Revision  int64                `json:"revision"`
	Secrets   map[string]SecretRef `json:"secrets"`
	CreatedAt time.Time            `json:"created_at"`
	UpdatedAt time.Time            `json:"updated_at"`
	UsedBy    []SecretUse          `json:"used_by"`
}

// SecretSetSpec is the body of PUT /projects/{p}/secret-sets/{name}. ExpectedRevision, when
// set, is the revision the caller read (0: the set must not exist yet).
type SecretSetSpec struct {
	Secrets          map[string]SecretRef `json:"secrets"`
	ExpectedRevision *int64               `json:"expected_revision,omitempty"`
}

// KEKStatus is one key-encryption key of the keyring: never its bytes.
type KEKStatus struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	Active    bool      `json:"active"`
	// Wraps counts the secret versions whose data key it wraps.
	Wraps int `json:"wraps"`
}

// KeyringRotation is the progress of the latest keyring rotation.
type KeyringRotation struct {
	State      string     `json:"state"` // "running" or "done"
	TargetKEK  string     `json:"target_kek"`
	RetireOld  bool       `json:"retire_old"`
	Secrets    int        `json:"secrets"`   // secrets re-wrapped so far
	Rewrapped  int        `json:"rewrapped"` // versions whose data key moved
	Retired    []string   `json:"retired,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// KeyringStatus is GET /secrets/keyring: the keyring file checked again, its KEKs and the
// latest rotation.
type KeyringStatus struct {
	Path      string           `json:"path"`
	OK        bool             `json:"ok"`
	Problem   string           `json:"problem,omitempty"`
	ActiveKEK string           `json:"active_kek"`
	KEKs      []KEKStatus      `json:"keks"`
	Rotation  *KeyringRotation `json:"rotation,omitempty"`
}

// PutSecret writes value, any bytes, as a new version of secret project/name (PUT
// /projects/{p}/secrets/{name}, body {"value_base64"}, so that bytes that are not UTF-8 text
// arrive exactly); the answer names the version, never the value.
func (c *Client) PutSecret(ctx context.Context, project, name string, value []byte) (*Secret, error) {
	var out Secret
	body := struct {
		ValueBase64 string `json:"value_base64"`
	}{base64.StdEncoding.EncodeToString(value)}
	if err := c.doJSON(ctx, http.MethodPut, "/projects/"+pathEscape(project)+"/secrets/"+pathEscape(name), body, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSecret reads a secret's versions and users (GET /projects/{p}/secrets/{name}).
func (c *Client) GetSecret(ctx context.Context, project, name string) (*Secret, error) {
	var out Secret
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/secrets/"+pathEscape(name), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSecrets lists a project's secrets (GET /projects/{p}/secrets).
func (c *Client) ListSecrets(ctx context.Context, project string) ([]Secret, error) {
	var out List[Secret]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/secrets", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// DeleteSecret deletes a secret and every version (DELETE /projects/{p}/secrets/{name}); a
// secret a service still uses answers 409 secret_in_use naming the services.
func (c *Client) DeleteSecret(ctx context.Context, project, name string) error {
	return c.do(ctx, http.MethodDelete, "/projects/"+pathEscape(project)+"/secrets/"+pathEscape(name), nil, nil, "", true, nil)
}

// PutSecretSet writes a secret set (PUT /projects/{p}/secret-sets/{name}).
func (c *Client) PutSecretSet(ctx context.Context, project, name string, spec SecretSetSpec) (*SecretSet, error) {
	var out SecretSet
	if err := c.doJSON(ctx, http.MethodPut, "/projects/"+pathEscape(project)+"/secret-sets/"+pathEscape(name), spec, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSecretSet reads a secret set (GET /projects/{p}/secret-sets/{name}).
func (c *Client) GetSecretSet(ctx context.Context, project, name string) (*SecretSet, error) {
	var out SecretSet
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/secret-sets/"+pathEscape(name), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSecretSets lists a project's secret sets (GET /projects/{p}/secret-sets).
func (c *Client) ListSecretSets(ctx context.Context, project string) ([]SecretSet, error) {
	var out List[SecretSet]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/secret-sets", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// DeleteSecretSet deletes a secret set (DELETE /projects/{p}/secret-sets/{name}); 409
// secret_in_use while a service attaches it.
func (c *Client) DeleteSecretSet(ctx context.Context, project, name string) error {
	return c.do(ctx, http.MethodDelete, "/projects/"+pathEscape(project)+"/secret-sets/"+pathEscape(name), nil, nil, "", true, nil)
}

// KeyringStatus checks the keyring and reports its KEKs and rotation (GET /secrets/keyring).
func (c *Client) KeyringStatus(ctx context.Context) (*KeyringStatus, error) {
	var out KeyringStatus
	if err := c.do(ctx, http.MethodGet, "/secrets/keyring", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RotateKeyring adds a KEK, makes it active and starts the background re-wrap (POST
// /secrets/keyring/rotate); retireOld retires the older KEKs once nothing is wrapped by them.
// A rotation still running answers 409 keyring_rotation_running.
func (c *Client) RotateKeyring(ctx context.Context, retireOld bool) (*KeyringStatus, error) {
	var out KeyringStatus
	body := struct {
		RetireOld bool `json:"retire_old"`
	}{retireOld}
	if err := c.doJSON(ctx, http.MethodPost, "/secrets/keyring/rotate", body, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NodeSecretKey answers POST /nodes/{id}/secret-key/rotate: the node's new X25519 public key.
type NodeSecretKey struct {
	NodeID    string `json:"node_id"`
	SecretKey string `json:"secret_key"`
}

// RotateNodeSecretKey asks node id for a new key for the secrets sealed to it (POST
// /nodes/{id}/secret-key/rotate); 503 unavailable when the node has no live session.
func (c *Client) RotateNodeSecretKey(ctx context.Context, id string) (*NodeSecretKey, error) {
	var out NodeSecretKey
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/"+pathEscape(id)+"/secret-key/rotate", struct{}{}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
