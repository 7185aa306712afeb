package resources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/secrets"
)

// maxOutputs bounds the outputs one Apply may publish.
const maxOutputs = 32

// outputKeyRE is an output key: what a service's environment variable could be named.
var outputKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// OutputSecretName is the project secret holding output key of the resource typ/name: a DNS
// label "res-<type>-<name>-<key>", the type's dots and underscores as '-' and the key in lower
// case with '-' for '_' (hello.greeting w1 TOKEN: res-hello-greeting-w1-token), or
// "res-<24 hex of a digest of type and name>-<key>" when that is too long. It follows the
// binding convention (bnd-<service>-<binding>-<key>, docs/bindings.md section 10).
func OutputSecretName(typ, name, key string) string {
	k := strings.ReplaceAll(strings.ToLower(key), "_", "-")
	t := strings.NewReplacer(".", "-", "_", "-").Replace(strings.ToLower(typ))
	n := "res-" + t + "-" + name + "-" + k
	if secrets.ValidName(n) {
		return n
	}
	sum := sha256.Sum256([]byte(typ + "/" + name))
	return "res-" + hex.EncodeToString(sum[:])[:24] + "-" + k
}

// publish seals each output of an Apply (a JSON object of strings) as a version of its project
// secret ([OutputSecretName]), a new version only when the value changed so that a replayed
// Apply adds none, the way bindings publish credentials (core/bindings), and returns the
// references by output key. Outputs that are not such an object are a bug in the plugin.
func (m *Manager) publish(ctx context.Context, r *Resource, raw json.RawMessage) (map[string]secrets.Ref, error) {
	plugin := r.Type
	if e, ok := m.cfg.Types.Lookup(r.Type); ok {
		plugin = e.Plugin
	}
	var outs map[string]string
	if err := json.Unmarshal(raw, &outs); err != nil {
		return nil, abierrors.New(abierrors.Internal, fmt.Sprintf("the outputs of plugin %s are not a JSON object of strings (a bug in the plugin)", plugin))
	}
	if len(outs) == 0 {
		return nil, nil
	}
	if len(outs) > maxOutputs {
		return nil, abierrors.New(abierrors.Internal, fmt.Sprintf("plugin %s returned %d outputs, more than %d (a bug in the plugin)", plugin, len(outs), maxOutputs))
	}
	if m.cfg.Secrets == nil {
		return nil, abierrors.New(abierrors.Unavailable, "the provider returned outputs and this berthd has no secret store to publish them in")
	}
	refs := map[string]secrets.Ref{}
	for _, key := range slices.Sorted(maps.Keys(outs)) {
		if !outputKeyRE.MatchString(key) {
			return nil, abierrors.New(abierrors.Internal, fmt.Sprintf("plugin %s returned output key %q, not a shell identifier (a bug in the plugin)", plugin, key))
		}
		name := OutputSecretName(r.Type, r.Name, key)
		sec, v, err := m.cfg.Secrets.Resolve(ctx, r.ProjectID, name, 0)
		if err == nil {
			cur, err := m.cfg.Secrets.Open(sec, v)
			same := err == nil && string(cur) == outs[key]
			clear(cur)
			if same {
				refs[key] = secrets.Ref{Secret: name, Version: v.Version}
				continue
			}
		} else if !errors.Is(err, secrets.ErrNotFound) && !errors.Is(err, secrets.ErrVersionNotFound) {
			return nil, fmt.Errorf("resources: publish %s of %s: %w", key, r.ID, err)
		}
		_, nv, err := m.cfg.Secrets.Put(ctx, r.ProjectID, r.Project, name, []byte(outs[key]), "resource:"+r.ID)
		if err != nil {
			return nil, fmt.Errorf("resources: publish %s of %s: %w", key, r.ID, err)
		}
		refs[key] = secrets.Ref{Secret: name, Version: nv.Version}
	}
	return refs, nil
}
