package corestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
)

var label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validate checks the request's names and generation.
func validateRequest(r bindings.Request) error {
	for _, f := range []struct{ name, v string }{{"project", r.Project}, {"service", r.Service}, {"binding", r.Binding}} {
		if !label.MatchString(f.v) {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("binding %s %q is not a DNS label", f.name, f.v))
		}
	}
	if r.Generation <= 0 {
		return abierrors.New(abierrors.ValidationFailed, "binding generation must be positive")
	}
	return nil
}

// decodeDesired decodes and checks a binding's attributes (a bindings.Desired or a
// bindings.State; the plugin's own fields are recomputed, never trusted) for type
// typ and id, and verifies the grant.
func decodeDesired(typ, id string, attrs json.RawMessage) (bindings.Desired, error) {
	var d bindings.Desired
	if len(attrs) == 0 {
		attrs = json.RawMessage("{}")
	}
	var st bindings.State
	dec := json.NewDecoder(bytes.NewReader(attrs))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return d, abierrors.Wrap(abierrors.ValidationFailed, "binding attributes do not decode", err)
	}
	d = st.Desired
	if err := validateRequest(d.Request); err != nil {
		return d, err
	}
	if d.ID() != id {
		return d, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("resource id %q is not the request's %q", id, d.ID()))
	}
	if d.Grant == "" {
		return d, abierrors.New(abierrors.BindingNotGranted, "the request carries no grant")
	}
	want, err := bindings.Digest(typ, d.Request)
	if err != nil {
		return d, err
	}
	if !strings.EqualFold(d.Grant, want) {
		return d, abierrors.New(abierrors.BindingNotGranted, "the grant does not cover this exact request")
	}
	return d, nil
}

// serverName is the database, bucket and user name of a binding id: readable
// and unique (a hash of the id ends it), at most maxLen bytes, of [a-z0-9_]
// (sep is the separator: "_" for databases, "-" for buckets).
func serverName(id string, sep byte, maxLen int) string {
	sum := sha256.Sum256([]byte(id))
	tail := hex.EncodeToString(sum[:])[:10]
	var b strings.Builder
	b.WriteString("berth")
	b.WriteByte(sep)
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteByte(c)
		default:
			b.WriteByte(sep)
		}
	}
	head := b.String()
	if len(head) > maxLen-len(tail)-1 {
		head = head[:maxLen-len(tail)-1]
	}
	return head + string(sep) + tail
}
