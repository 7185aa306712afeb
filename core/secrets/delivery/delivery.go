// Package delivery resolves a node's workload secrets and seals their values to the node's
// X25519 key inside its desired state (docs/node-protocol.md section 6.6).
package delivery

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
)

// BoxKeySize is the size of a node's X25519 public key.
const BoxKeySize = 32

// KeyID returns the id of an X25519 public key: the hex SHA-256 of its 32 bytes.
func KeyID(pub []byte) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])
}

// ParseBoxKey decodes a node's base64 X25519 public key. Errors: not base64 or not 32 bytes.
func ParseBoxKey(b64 string) (*[BoxKeySize]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != BoxKeySize {
		return nil, errors.New("berth: a node secret key is 32 bytes of base64")
	}
	var k [BoxKeySize]byte
	copy(k[:], raw)
	return &k, nil
}

// Sealer resolves and seals workload secrets for the reconciler. It is safe for concurrent use.
type Sealer struct {
	Secrets *secrets.Store
}

// Resolve fills each workload of spec with its secret references, resolved to versions now
// (the current version for an unpinned reference) and with the node key they will be sealed to,
// but no sealed value yet: what it writes is what the desired state's hash covers, so a new
// version, another reference or a new node key changes the hash and [Sealer.Seal] then runs.
// wls and svcs are the node's workloads and their services by id. A secret, version or set that
// does not exist any more, or a node without a key, leaves the entry's Version or RecipientKey
// empty: the agent then refuses to start the workload and says why. Errors: store failures.
func (s *Sealer) Resolve(ctx context.Context, n *nodes.Node, spec *node.Spec, wls map[string]*services.Workload, svcs map[string]*services.Service) error {
	recipient := ""
	if pub, err := ParseBoxKey(n.BoxPublicKey); err == nil {
		recipient = KeyID(pub[:])
	}
	for i := range spec.Workloads {
		ws := &spec.Workloads[i]
		w, svc := wls[ws.WorkloadID], svcs[ws.ServiceID]
		if w == nil || svc == nil {
			continue
		}
		run := w.Run
		if run == nil {
			run = services.InvocationOf(svc)
		}
		if len(run.Secrets) == 0 && len(run.SecretSets) == 0 && len(run.ResolvedSecrets) == 0 {
			continue
		}
		if len(run.ResolvedSecrets) > 0 {
			// What the attempt was admitted with, versions resolved at the service's change: a
			// new version reaches this workload only through a rollout.
			out, err := s.resolved(ctx, svc.ProjectID, run.ResolvedSecrets, recipient)
			if err != nil {
				return err
			}
			ws.Secrets = out
			continue
		}
		refs := maps.Clone(run.Secrets)
		if refs == nil {
			refs = map[string]secrets.Ref{}
		}
		var missing []node.WorkloadSecret
		for _, name := range run.SecretSets {
			set, err := s.Secrets.GetSet(ctx, svc.ProjectID, name)
			if errors.Is(err, secrets.ErrSetNotFound) {
				missing = append(missing, node.WorkloadSecret{Key: "set:" + name, As: node.SecretAsEnv, Secret: name})
				continue
			} else if err != nil {
				return err
			}
			for k, r := range set.Secrets {
				if _, dup := refs[k]; !dup {
					refs[k] = r
				}
			}
		}
		out := []node.WorkloadSecret{}
		for _, key := range slices.Sorted(maps.Keys(refs)) {
			r := refs[key]
			as := r.As
			if as == "" {
				as = node.SecretAsEnv
			}
			e := node.WorkloadSecret{Key: key, As: as, Secret: r.Secret, RecipientKey: recipient}
			_, v, err := s.Secrets.Resolve(ctx, svc.ProjectID, r.Secret, r.Version)
			switch {
			case errors.Is(err, secrets.ErrNotFound), errors.Is(err, secrets.ErrVersionNotFound):
				e.RecipientKey = "" // nothing to seal: the agent refuses the start
			case err != nil:
				return err
			default:
				e.Version = v.Version
			}
			out = append(out, e)
		}
		ws.Secrets = append(out, missing...)
	}
	return nil
}

// resolved turns refs with concrete versions into entries, leaving Version 0 (refused by the
// agent) for a version that no longer exists.
func (s *Sealer) resolved(ctx context.Context, projectID string, refs map[string]secrets.Ref, recipient string) ([]node.WorkloadSecret, error) {
	out := []node.WorkloadSecret{}
	for _, key := range slices.Sorted(maps.Keys(refs)) {
		r := refs[key]
		as := r.As
		if as == "" {
			as = node.SecretAsEnv
		}
		e := node.WorkloadSecret{Key: key, As: as, Secret: r.Secret, RecipientKey: recipient, Version: r.Version}
		if _, _, err := s.Secrets.Resolve(ctx, projectID, r.Secret, r.Version); errors.Is(err, secrets.ErrNotFound) || errors.Is(err, secrets.ErrVersionNotFound) {
			e.Version, e.RecipientKey = 0, ""
		} else if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Seal seals the value of every resolved secret of spec to n's X25519 key (the entries
// [Sealer.Resolve] gave a version and a recipient). A value that does not open under the
// keyring is left unsealed, so the workload is not started with a wrong value; the error names
// the secret and version. Errors: wrapping [secrets.ErrOpenFailed] or [secrets.ErrUnknownKEK]
// (the first such, after every entry was tried), store failures.
func (s *Sealer) Seal(ctx context.Context, n *nodes.Node, spec *node.Spec) error {
	pub, err := ParseBoxKey(n.BoxPublicKey)
	if err != nil {
		return nil // Resolve left every recipient empty: nothing to seal
	}
	var errs []error
	for i := range spec.Workloads {
		ws := &spec.Workloads[i]
		for j := range ws.Secrets {
			e := &ws.Secrets[j]
			if e.RecipientKey == "" || e.Version == 0 {
				continue
			}
			sec, v, err := s.Secrets.Resolve(ctx, ws.ProjectID, e.Secret, e.Version)
			if err != nil {
				errs = append(errs, fmt.Errorf("seal %s for workload %s: %w", e.Secret, ws.WorkloadID, err))
				continue
			}
			value, err := s.Secrets.Open(sec, v)
			if err != nil {
				errs = append(errs, fmt.Errorf("seal for workload %s: %w", ws.WorkloadID, err))
				continue
			}
			plain := node.SealedSecretPlaintext(ws.WorkloadID, *e, value)
			sealed, err := box.SealAnonymous(nil, plain, pub, rand.Reader)
			clear(value)
			clear(plain)
			if err != nil {
				return fmt.Errorf("seal for workload %s: %w", ws.WorkloadID, err)
			}
			e.Sealed = sealed
		}
	}
	return errors.Join(errs...)
}
