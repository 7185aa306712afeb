package resources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/secrets"
)

// SecretPrefix marks a spec value taken from a secret of the resource's project: the JSON string
// "secret:NAME" anywhere in a spec (nested objects and arrays too) stands for the current value
// of secret NAME (docs/resources.md section 7). The stored spec keeps the reference.
const SecretPrefix = "secret:"

// maxSecretRefs bounds the references of one spec.
const maxSecretRefs = 64

// secretRef is one reference of a spec: where it is and which secret it names.
type secretRef struct {
	path []any // object keys (string) and array indexes (int) from the spec's root
	name string
}

// field is the reference's place as error messages name it: spec/a/b/0.
func (r secretRef) field() string {
	var b strings.Builder
	b.WriteString("spec")
	for _, p := range r.path {
		fmt.Fprintf(&b, "/%v", p)
	}
	return b.String()
}

// decodeJSON decodes a JSON document keeping numbers as written.
func decodeJSON(raw []byte) (any, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// secretRefs returns the secret references of a spec, in a stable order. Every string that
// starts with SecretPrefix is one; one whose name is not a secret name (a DNS label of this
// project: no "PROJECT/") is refused validation_failed naming the field.
func secretRefs(spec []byte) ([]secretRef, error) {
	if !bytes.Contains(spec, []byte(`"`+SecretPrefix)) {
		return nil, nil // no string starts with the prefix: the common case, without decoding
	}
	doc, err := decodeJSON(spec)
	if err != nil {
		return nil, abierrors.Wrap(abierrors.ValidationFailed, "spec", err)
	}
	var out []secretRef
	var walk func(path []any, v any) error
	walk = func(path []any, v any) error {
		switch x := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				if err := walk(append(slices.Clip(path), k), x[k]); err != nil {
					return err
				}
			}
		case []any:
			for i, e := range x {
				if err := walk(append(slices.Clip(path), i), e); err != nil {
					return err
				}
			}
		case string:
			name, ok := strings.CutPrefix(x, SecretPrefix)
			if !ok {
				return nil
			}
			ref := secretRef{path: path, name: name}
			if !secrets.ValidName(name) {
				return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: %q is not a secret reference: want secret:NAME, a secret of the resource's own project", ref.field(), x))
			}
			if len(out) == maxSecretRefs {
				return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("spec: more than %d secret references", maxSecretRefs))
			}
			out = append(out, ref)
		}
		return nil
	}
	if err := walk(nil, doc); err != nil {
		return nil, err
	}
	return out, nil
}

// checkSecrets refuses a spec that refers to a secret its project does not have: 422
// validation_failed naming the field and the secret. It opens no value.
func (m *Manager) checkSecrets(ctx context.Context, projectID, project string, refs []secretRef) error {
	for _, ref := range refs {
		if m.cfg.Secrets == nil {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: refers to secret %s, and this berthd has no secret store", ref.field(), ref.name))
		}
		if projectID == "" {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: project %s has no secret %s", ref.field(), project, ref.name))
		}
		_, _, err := m.cfg.Secrets.Resolve(ctx, projectID, ref.name, 0)
		if errors.Is(err, secrets.ErrNotFound) || errors.Is(err, secrets.ErrVersionNotFound) {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: project %s has no secret %s", ref.field(), project, ref.name))
		}
		if err != nil {
			return fmt.Errorf("resources: %s: secret %s: %w", ref.field(), ref.name, err)
		}
	}
	return nil
}

// opened is a spec with its secret references opened: Spec is what the provider receives and
// must never be stored, logged or answered; its values mask what the provider returns.
type opened struct {
	Spec      json.RawMessage
	projectID string
	refs      []secretRef
	values    []string // values[i] is the value refs[i] names
	kr        *secrets.Keyring
}

// openSecrets returns r's spec with every secret reference replaced by the current value of its
// secret, opened through the secret store ([secrets.Store.Resolve] and [secrets.Store.Open],
// the path bindings and services use). A spec without references is returned as it is. Errors:
// validation_failed naming the field when a secret is missing or its value is not UTF-8 text.
func (m *Manager) openSecrets(ctx context.Context, r *Resource) (*opened, error) {
	out := &opened{Spec: r.SpecJSON(), projectID: r.ProjectID}
	refs, err := secretRefs(out.Spec)
	if err != nil || len(refs) == 0 {
		return out, err
	}
	if m.cfg.Secrets == nil || r.ProjectID == "" {
		return nil, m.checkSecrets(ctx, r.ProjectID, r.Project, refs) // refuses, naming the first
	}
	doc, err := decodeJSON(out.Spec)
	if err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "the stored spec does not decode", err)
	}
	for _, ref := range refs {
		sec, v, err := m.cfg.Secrets.Resolve(ctx, r.ProjectID, ref.name, 0)
		if errors.Is(err, secrets.ErrNotFound) || errors.Is(err, secrets.ErrVersionNotFound) {
			return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: project %s has no secret %s", ref.field(), r.Project, ref.name))
		}
		if err != nil {
			return nil, fmt.Errorf("resources: %s: secret %s: %w", ref.field(), ref.name, err)
		}
		val, err := m.cfg.Secrets.Open(sec, v)
		if err != nil {
			return nil, fmt.Errorf("resources: %s: open secret %s: %w", ref.field(), ref.name, err)
		}
		if !utf8.Valid(val) {
			clear(val)
			return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: secret %s is not UTF-8 text, which a spec's string cannot carry", ref.field(), ref.name))
		}
		doc = setAt(doc, ref.path, string(val))
		out.values = append(out.values, string(val))
		clear(val)
	}
	out.refs, out.kr = refs, m.cfg.Secrets.Keyring()
	if out.Spec, err = json.Marshal(doc); err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "encode the spec", err)
	}
	return out, nil
}

// setAt returns doc with the value at path replaced by v (path exists: it came from doc).
func setAt(doc any, path []any, v any) any {
	if len(path) == 0 {
		return v
	}
	switch x := doc.(type) {
	case map[string]any:
		if k, ok := path[0].(string); ok {
			if e, ok := x[k]; ok {
				x[k] = setAt(e, path[1:], v)
			}
		}
	case []any:
		if i, ok := path[0].(int); ok && i < len(x) {
			x[i] = setAt(x[i], path[1:], v)
		}
	}
	return doc
}

// getAt returns the value at path of doc and whether it exists.
func getAt(doc any, path []any) (any, bool) {
	for _, p := range path {
		switch x := doc.(type) {
		case map[string]any:
			k, ok := p.(string)
			if !ok {
				return nil, false
			}
			if doc, ok = x[k]; !ok {
				return nil, false
			}
		case []any:
			i, ok := p.(int)
			if !ok || i >= len(x) {
				return nil, false
			}
			doc = x[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// Mask returns a state the provider returned (Plan, Apply, Read) with the secret values in it
// masked, so that it may be stored, compared and answered:
//   - at the place of a reference, the value the secret holds now reads "secret:NAME", and any
//     other value "secret:NAME (differs, hmac-sha256:<16 hex>)", a keyed digest of what is
//     there (docs/secrets.md section 1): the value stays hidden, and a value changed behind
//     Berth's back or a secret with a new version still shows as drift;
//   - every other string holding a value has it replaced by "secret:NAME".
//
// A spec without references returns raw as it is. Errors: raw is not JSON.
func (o *opened) Mask(raw json.RawMessage) (json.RawMessage, error) {
	if o == nil || len(o.refs) == 0 || len(bytes.TrimSpace(raw)) == 0 {
		return raw, nil
	}
	doc, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	placed := map[string]bool{}
	for i, ref := range o.refs {
		got, ok := getAt(doc, ref.path)
		if !ok {
			continue
		}
		placed[fmt.Sprint(ref.path)] = true
		mark := SecretPrefix + ref.name
		if s, isString := got.(string); !isString || s != o.values[i] {
			b, _ := json.Marshal(got) // decoded JSON: cannot fail
			if isString {
				b = []byte(s)
			}
			d := o.kr.Digest(secrets.Binding{ProjectID: o.projectID, Owner: secrets.OwnerProject, Name: ref.name}, b)
			mark += " (differs, " + d[:len("hmac-sha256:")+16] + ")"
		}
		doc = setAt(doc, ref.path, mark)
	}
	var walk func(path []any, v any) any
	walk = func(path []any, v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(append(slices.Clip(path), k), e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(append(slices.Clip(path), i), e)
			}
		case string:
			if placed[fmt.Sprint(path)] {
				return x
			}
			return o.Text(x)
		}
		return v
	}
	return json.Marshal(walk(nil, doc))
}

// Text returns s with every secret value in it replaced by "secret:NAME": for the provider's
// error messages before they are recorded, logged or answered.
func (o *opened) Text(s string) string {
	if o == nil {
		return s
	}
	for i, v := range o.values {
		if v != "" {
			s = strings.ReplaceAll(s, v, SecretPrefix+o.refs[i].name)
		}
	}
	return s
}

// maskErr returns err with the secret values in its message masked, keeping its code.
func (o *opened) maskErr(err error) error {
	if err == nil || o == nil || len(o.values) == 0 {
		return err
	}
	msg := err.Error()
	masked := o.Text(msg)
	if masked == msg {
		return err
	}
	return abierrors.New(abierrors.CodeOf(err), masked)
}
