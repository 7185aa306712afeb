package dnsrecords

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/berthhq/berth/core/secrets"
)

// TSIGRef names the project secret holding the DNS plugin's TSIG secret, as the
// tsig_secret_ref of its configuration (docs/dns.md section 9).
type TSIGRef struct {
	Project string `json:"project"`
	Secret  string `json:"secret"`
	Version int    `json:"version,omitempty"` // 0: the current version
}

// ResolveTSIG returns the DNS plugin configuration obj with its tsig_secret_ref (rawRef)
// replaced by the value of that secret as tsig_secret; projectID names a project's id by its
// name. A reference beside an inline tsig_secret, a malformed one, and a missing project or
// secret are errors; the value is never logged or quoted.
func ResolveTSIG(ctx context.Context, obj map[string]json.RawMessage, rawRef json.RawMessage, sec *secrets.Store, projectID func(ctx context.Context, name string) (string, error)) (json.RawMessage, error) {
	var ref TSIGRef
	if err := json.Unmarshal(rawRef, &ref); err != nil || ref.Project == "" || ref.Secret == "" {
		return nil, errors.New(`tsig_secret_ref must be {"project": ..., "secret": ...}`)
	}
	if _, both := obj["tsig_secret"]; both {
		return nil, errors.New("give tsig_secret_ref or tsig_secret, not both")
	}
	pid, err := projectID(ctx, ref.Project)
	if err != nil {
		return nil, fmt.Errorf("tsig_secret_ref: project %s: %w", ref.Project, err)
	}
	s, v, err := sec.Resolve(ctx, pid, ref.Secret, ref.Version)
	if err != nil {
		return nil, fmt.Errorf("tsig_secret_ref: %w", err)
	}
	value, err := sec.Open(s, v)
	if err != nil {
		return nil, fmt.Errorf("tsig_secret_ref: %w", err)
	}
	delete(obj, "tsig_secret_ref")
	obj["tsig_secret"], _ = json.Marshal(strings.TrimSpace(string(value))) // a string: cannot fail
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode the dns configuration: %w", err)
	}
	return out, nil
}
