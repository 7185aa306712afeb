// Package bindings is the contract of service bindings between berthd and the
// Corestore provider: resource types, the value-free binding request, its
// grant digest, and the states and inventories the provider reports
// (docs/bindings.md).
package bindings

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"
)

// Resource types of the Corestore provider (docs/bindings.md section 2).
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

// Inventory is the state of a TypeInventory resource: what one server holds
// (docs/bindings.md section 6). An unreachable server is Reachable false
// with the Reason, never an empty list.
type Inventory struct {
	Kind      string          `json:"kind"`
	Reachable bool            `json:"reachable"`
	Reason    string          `json:"reason,omitempty"`
	Resources []InventoryItem `json:"resources"`
}

// InventoryItem is one database or bucket the plugin made.
type InventoryItem struct {
	Name string `json:"name"`         // database or bucket
	ID   string `json:"id,omitempty"` // the binding id, when the plugin's records know it
	// State is "bound" (a binding uses it), "released" (deleted without
	// purge: the data is kept) or "unknown" (made by the plugin, no record).
	State string `json:"state"`
}
