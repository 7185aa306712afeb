package identity

import (
	"slices"
	"time"
)

// Scope names one permission carried by a bearer (docs/api.md section "Identity", the route
// table maps every route to one).
type Scope string

// Scopes. ScopeAdmin grants every scope, except that human-only scopes are never granted to a
// machine or node principal, whatever it holds. ScopeServicesWrite implies ScopeServiceDeploy,
// which implies ScopeServicesRead; ScopeSecretWrite implies ScopeSecretRead and ScopeSecretUse.
const (
	ScopeAdmin         Scope = "admin"
	ScopeNodeEnroll    Scope = "node:enroll"    // human-only: issue join tokens, accept nodes
	ScopeNodeRemove    Scope = "node:remove"    // human-only: remove a node
	ScopeNodeFenceAck  Scope = "node:fence_ack" // human-only: acknowledge a failed self-fence
	ScopeServicesRead  Scope = "services:read"
	ScopeServicesWrite Scope = "services:write"
	ScopeServiceDeploy Scope = "service:deploy" // apply one service, push its bundles, undo its rollout
	ScopeNodesRead     Scope = "nodes:read"
	ScopeTokensWrite   Scope = "tokens:write" // create, rotate and revoke one's own machine tokens
	// ScopeSecretRead lists and reads secrets and secret sets: names, versions, digests, never a
	// value (no scope reads a value).
	ScopeSecretRead Scope = "secret:read"
	// ScopeSecretWrite writes new secret versions and sets and deletes them; implies
	// ScopeSecretRead and ScopeSecretUse.
	ScopeSecretWrite Scope = "secret:write"
	// ScopeSecretUse lets a service write make the service take a secret it did not take
	// before (a reference, a set, a tls.secret), so that its value reaches the workload; a
	// write that keeps the references the service has needs no more than the write's own scope
	// (docs/api.md section 10.2). It reads nothing through the API.
	ScopeSecretUse Scope = "secret:use"
	// ScopeResourceRead lists, reads and plans declared resources (docs/resources.md section 5).
	ScopeResourceRead Scope = "resource:read"
	// ScopeResourceWrite applies and deletes declared resources; implies ScopeResourceRead.
	ScopeResourceWrite Scope = "resource:write"
)

// allScopes is every scope, in the order [Known] lists them.
var allScopes = []Scope{ScopeAdmin, ScopeNodeEnroll, ScopeNodeRemove, ScopeNodeFenceAck,
	ScopeServicesRead, ScopeServicesWrite, ScopeServiceDeploy, ScopeNodesRead, ScopeTokensWrite,
	ScopeSecretRead, ScopeSecretWrite, ScopeSecretUse, ScopeResourceRead, ScopeResourceWrite}

// HumanOnly reports whether s may only be held by a human or the admin principal, never by a
// machine token or a node.
func HumanOnly(s Scope) bool {
	switch s {
	case ScopeNodeEnroll, ScopeNodeRemove, ScopeNodeFenceAck:
		return true
	}
	return false
}

// Known reports whether s is one of the scopes defined by this package.
func Known(s Scope) bool { return slices.Contains(allScopes, s) }

// implies reports whether holding held satisfies a need for want, before human-only rules.
func implies(held, want Scope) bool {
	switch {
	case held == want, held == ScopeAdmin:
		return true
	case held == ScopeServicesWrite:
		return want == ScopeServiceDeploy || want == ScopeServicesRead
	case held == ScopeServiceDeploy:
		return want == ScopeServicesRead
	case held == ScopeSecretWrite:
		return want == ScopeSecretRead || want == ScopeSecretUse
	case held == ScopeResourceWrite:
		return want == ScopeResourceRead
	}
	return false
}

// Role is a named set of scopes given to a user, globally or for one project.
type Role string

// Roles (docs/api.md section "Identity"): admin holds everything; operator deploys and operates
// in every project (secrets included) and, when held by a human, the human-only node scopes, but
// administers no identities; viewer reads (secret metadata included, never a value).
const (
	RoleAdmin    Role = "admin"
	RoleOperator Role = "operator"
	RoleViewer   Role = "viewer"
)

// Valid reports whether r is one of the defined roles.
func (r Role) Valid() bool { return r == RoleAdmin || r == RoleOperator || r == RoleViewer }

// Scopes returns the scopes role r gives a user of kind k (human-only ones only to humans).
func (r Role) Scopes(k Kind) []Scope {
	switch r {
	case RoleAdmin:
		return []Scope{ScopeAdmin}
	case RoleOperator:
		s := []Scope{ScopeServicesRead, ScopeServicesWrite, ScopeNodesRead, ScopeTokensWrite, ScopeSecretWrite, ScopeResourceWrite}
		if k == KindHuman {
			s = append(s, ScopeNodeEnroll, ScopeNodeRemove, ScopeNodeFenceAck)
		}
		return s
	case RoleViewer:
		return []Scope{ScopeServicesRead, ScopeNodesRead, ScopeSecretRead, ScopeResourceRead}
	}
	return nil
}

// Grant gives a role within one project only.
type Grant struct {
	Project string `bson:"project" json:"project"`
	Role    Role   `bson:"role" json:"role"`
}

// Kind is what a principal is.
type Kind string

// Principal kinds.
const (
	KindAdmin   Kind = "admin"   // the bootstrap operator token (and tokens like it)
	KindMachine Kind = "machine" // automation: CI, scripts; never holds human-only scopes
	KindHuman   Kind = "human"   // a person's session
	KindNode    Kind = "node"    // an enrolled node's credential
)

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool {
	switch k {
	case KindAdmin, KindMachine, KindHuman, KindNode:
		return true
	}
	return false
}

// mayHoldHumanOnly reports whether principals of kind k may hold human-only scopes.
func (k Kind) mayHoldHumanOnly() bool { return k == KindAdmin || k == KindHuman }

// Principal is an authenticated caller.
type Principal struct {
	Kind Kind
	// ID identifies the bearer without revealing it: a token id (tok_...) or a node id (nod_...).
	ID string
	// Name is the human-readable label given at creation: a machine token's name, or the user
	// name of a human session; may be empty.
	Name string
	// Owner is the user a token or session belongs to; empty for nodes and legacy tokens.
	Owner string
	// Scopes hold everywhere, within Project and Service when those are set.
	Scopes []Scope
	// Project and Service bound a machine token: when Project is set the principal acts in that
	// project only, and when Service is also set on that service only.
	Project, Service string
	// Grants are scopes within one project each (per-project roles), keyed by project name.
	Grants map[string][]Scope
	// AuthAt is when a human session's password was verified; zero for other kinds.
	AuthAt time.Time
	// ExpiresAt is when the bearer stops working; nil when it does not expire.
	ExpiresAt *time.Time
}

// Has reports whether p holds scope s everywhere: directly or through [ScopeAdmin], and without
// a project bound. A human-only scope is never held by a machine or node principal, even with
// ScopeAdmin. A nil p holds nothing.
func (p *Principal) Has(s Scope) bool {
	if p == nil || p.Project != "" {
		return false
	}
	return p.holds(p.Scopes, s)
}

func (p *Principal) holds(held []Scope, s Scope) bool {
	if HumanOnly(s) && !p.Kind.mayHoldHumanOnly() {
		return false
	}
	return slices.ContainsFunc(held, func(h Scope) bool { return implies(h, s) })
}

// Allows reports whether p may use scope s on project and service (empty when the route names
// none). A bounded principal is allowed only on its own project (and service, when bound); a
// route without a service refuses a service-bound principal unless anyService is set (bundle
// uploads, which belong to the project and name no service). Per-project grants count on
// their own project only.
func (p *Principal) Allows(s Scope, project, service string, anyService bool) bool {
	if p == nil {
		return false
	}
	if p.Project != "" {
		if project != p.Project {
			return false
		}
		if p.Service != "" && service != p.Service && !(service == "" && anyService) {
			return false
		}
		return p.holds(p.Scopes, s)
	}
	if p.holds(p.Scopes, s) {
		return true
	}
	return project != "" && p.holds(p.Grants[project], s)
}

// Covers reports whether p may hand out scope s bounded to project and service: a token can
// never carry more than its creator holds.
func (p *Principal) Covers(s Scope, project, service string) bool {
	if project == "" {
		return p.Has(s)
	}
	return p.Allows(s, project, service, false)
}

// CoversToken reports whether p may rotate or revoke the token tok describes, as far as scopes
// go: whether p could hand out, within tok's project and service bounds, every scope tok holds
// (the scopes its own implies included, and the human-only ones a token of kind admin holds,
// which no machine principal covers). missing names the first scope p lacks.
func (p *Principal) CoversToken(tok MachineToken) (missing Scope, ok bool) {
	target := &Principal{Kind: tok.Kind}
	for _, s := range allScopes {
		if target.holds(tok.Scopes, s) && !p.Covers(s, tok.Project, tok.Service) {
			return s, false
		}
	}
	return "", true
}

// intersectScopes returns the scopes that both held and owner hold (implications counted), as
// the fewest scopes that imply them all: {services:write} and an owner holding
// {services:read} give {services:read}; two sets holding admin give {admin}. Human-only rules
// are left to the principal that holds the result. Never nil.
func intersectScopes(held, owner []Scope) []Scope {
	holds := func(set []Scope, s Scope) bool {
		return slices.ContainsFunc(set, func(h Scope) bool { return implies(h, s) })
	}
	var both []Scope
	for _, s := range allScopes {
		if holds(held, s) && holds(owner, s) {
			both = append(both, s)
		}
	}
	out := []Scope{}
	for _, s := range both {
		if !slices.ContainsFunc(both, func(h Scope) bool { return h != s && implies(h, s) }) {
			out = append(out, s)
		}
	}
	return out
}
