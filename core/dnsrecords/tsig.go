package dnsrecords

import (
	"context"
	"encoding/json"

	"github.com/berthhq/berth/core/secrets"
)

// TSIGRef names the project secret holding the DNS plugin's TSIG secret, as the
// tsig_secret_ref of its configuration (docs/dns.md section 9).
type TSIGRef = secrets.ConfigRef

// ResolveTSIG returns the DNS plugin configuration obj with its tsig_secret_ref (rawRef)
// replaced by the value of that secret as tsig_secret; projectID names a project's id by its
// name. A reference beside an inline tsig_secret, a malformed one, and a missing project or
// secret are errors; the value is never logged or quoted.
func ResolveTSIG(ctx context.Context, obj map[string]json.RawMessage, rawRef json.RawMessage, sec *secrets.Store, projectID func(ctx context.Context, name string) (string, error)) (json.RawMessage, error) {
	obj["tsig_secret_ref"] = rawRef
	return secrets.ResolveConfigRef(ctx, obj, "tsig_secret_ref", "tsig_secret", sec, projectID)
}
