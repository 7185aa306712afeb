package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ConfigRef names the project secret a plugin configuration refers to instead
// of holding the value: {"project": ..., "secret": ..., "version": 0}.
type ConfigRef struct {
	Project string `json:"project"`
	Secret  string `json:"secret"`
	Version int    `json:"version,omitempty"` // 0: the current version
}

// ResolveConfigRef returns the plugin configuration obj with its member
// refKey (a [ConfigRef]) replaced by the value of that secret, trimmed, as the
// string member valueKey (the DNS plugin's tsig_secret, the Hetzner plugin's
// token); projectID names a project's id by its name. A reference beside an
// inline value, a malformed one, and a missing project or secret are errors;
// the value is never logged or quoted.
func ResolveConfigRef(ctx context.Context, obj map[string]json.RawMessage, refKey, valueKey string, sec *Store, projectID func(ctx context.Context, name string) (string, error)) (json.RawMessage, error) {
	var ref ConfigRef
	if err := json.Unmarshal(obj[refKey], &ref); err != nil || ref.Project == "" || ref.Secret == "" {
		return nil, fmt.Errorf(`%s must be {"project": ..., "secret": ...}`, refKey)
	}
	if _, both := obj[valueKey]; both {
		return nil, fmt.Errorf("give %s or %s, not both", refKey, valueKey)
	}
	if sec == nil {
		return nil, errors.New(refKey + ": berthd has no secrets store")
	}
	pid, err := projectID(ctx, ref.Project)
	if err != nil {
		return nil, fmt.Errorf("%s: project %s: %w", refKey, ref.Project, err)
	}
	s, v, err := sec.Resolve(ctx, pid, ref.Secret, ref.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", refKey, err)
	}
	value, err := sec.Open(s, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", refKey, err)
	}
	delete(obj, refKey)
	obj[valueKey], _ = json.Marshal(strings.TrimSpace(string(value))) // a string: cannot fail
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode the configuration: %w", err)
	}
	return out, nil
}
