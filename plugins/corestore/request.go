package corestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/gowebpki/jcs"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// Resource types the plugin manages (docs/bindings.md section 2).
const (
	TypePostgres = "corestore.postgres" // a database and a login role on the PostgreSQL server
	TypeMongoDB  = "corestore.mongodb"  // a database and, where the server can, a user on the MongoDB-wire server
	TypeS3       = "corestore.s3"       // a bucket and, where the server's admin API allows, its own access key
	// TypeInventory is read only: Read(TypeInventory, kind) with kind
	// "postgres", "mongodb" or "s3" reports what that server holds
	// ([Inventory]).
	TypeInventory = "corestore.inventory"
)

// Kinds are the binding kinds a service may declare, each served by one
// resource type.
var Kinds = map[string]string{"postgres": TypePostgres, "mongodb": TypeMongoDB, "s3": TypeS3}

// GrantPrefix starts every grant: the digest's algorithm.
const GrantPrefix = "sha256:"

// Request is the exact, value-free binding request a grant covers: which
// service binds which resource, at which generation of the binding
// (docs/bindings.md section 3). It is the desired state's attributes, with
// Grant beside it.
type Request struct {
	Project    string `json:"project"`
	Service    string `json:"service"`
	Binding    string `json:"binding"`
	Generation int64  `json:"generation"` // > 0; a new generation issues new credentials
}

// ID is the resource id of the request: "<project>/<service>/<binding>".
func (r Request) ID() string { return r.Project + "/" + r.Service + "/" + r.Binding }

var label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validate checks the request's names and generation.
func (r Request) validate() error {
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

// Digest is the grant digest of the request for resource type typ:
// "sha256:" and the hex SHA-256 of the RFC 8785 canonical JSON of
// {"type", "id", "project", "service", "binding", "generation"}. The core
// computes it when it grants, the plugin again before it acts.
func Digest(typ string, r Request) (string, error) {
	raw, err := json.Marshal(struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Request
	}{typ, r.ID(), r})
	if err != nil {
		return "", fmt.Errorf("grant digest: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("grant digest: %w", err)
	}
	sum := sha256.Sum256(canon)
	return GrantPrefix + hex.EncodeToString(sum[:]), nil
}

// Desired is the desired state's attributes of a binding resource: the
// request and the grant that covers it.
type Desired struct {
	Request
	Grant string `json:"grant"`
}

// DesiredAttributes returns the attributes of a granted request of type typ,
// as the core sends them to Plan.
func DesiredAttributes(typ string, r Request) (json.RawMessage, error) {
	g, err := Digest(typ, r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(Desired{Request: r, Grant: g})
}

// State is the planned and applied state's attributes of a binding
// resource: the desired attributes and what the plugin made of them. It
// carries no credential.
type State struct {
	Desired
	Database string `json:"database,omitempty"` // database or bucket name on the server
	User     string `json:"user,omitempty"`     // role, user or access key id; empty when the server cannot make users
	Endpoint string `json:"endpoint"`           // host:port (databases) or the S3 endpoint URL a workload dials
	// Users is "own" when the binding has its own user or key, or
	// "unsupported" when the server cannot make one (FerretDB v1, an S3
	// server without an admin API): the workload then gets no credential
	// of its own (docs/bindings.md section 4).
	Users string `json:"users"`
}

// Users values.
const (
	UsersOwn         = "own"
	UsersUnsupported = "unsupported"
)

// decodeDesired decodes and checks a binding's attributes (a Desired or a
// State; the plugin's own fields are recomputed, never trusted) for type
// typ and id, and verifies the grant.
func decodeDesired(typ, id string, attrs json.RawMessage) (Desired, error) {
	var d Desired
	if len(attrs) == 0 {
		attrs = json.RawMessage("{}")
	}
	var st State
	dec := json.NewDecoder(bytes.NewReader(attrs))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return d, abierrors.Wrap(abierrors.ValidationFailed, "binding attributes do not decode", err)
	}
	d = st.Desired
	if err := d.Request.validate(); err != nil {
		return d, err
	}
	if d.ID() != id {
		return d, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("resource id %q is not the request's %q", id, d.ID()))
	}
	if d.Grant == "" {
		return d, abierrors.New(abierrors.BindingNotGranted, "the request carries no grant")
	}
	want, err := Digest(typ, d.Request)
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
