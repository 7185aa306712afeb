package identity

import "slices"

// Scope names one permission carried by a bearer.
type Scope string

// Scopes. ScopeAdmin grants every scope, except that human-only scopes are never granted to a
// machine or node principal, whatever it holds.
const (
	ScopeAdmin         Scope = "admin"
	ScopeNodeEnroll    Scope = "node:enroll"    // human-only: issue join tokens, accept nodes
	ScopeNodeRemove    Scope = "node:remove"    // human-only: remove a node
	ScopeNodeFenceAck  Scope = "node:fence_ack" // human-only: acknowledge a failed self-fence
	ScopeServicesRead  Scope = "services:read"
	ScopeServicesWrite Scope = "services:write"
	ScopeNodesRead     Scope = "nodes:read"
)

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
func Known(s Scope) bool {
	switch s {
	case ScopeAdmin, ScopeNodeEnroll, ScopeNodeRemove, ScopeNodeFenceAck,
		ScopeServicesRead, ScopeServicesWrite, ScopeNodesRead:
		return true
	}
	return false
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
	// Name is the human-readable label given at creation; may be empty.
	Name   string
	Scopes []Scope
}

// Has reports whether p holds scope s, directly or through [ScopeAdmin]. A human-only scope is
// never held by a machine or node principal, even with ScopeAdmin. A nil p holds nothing.
func (p *Principal) Has(s Scope) bool {
	if p == nil {
		return false
	}
	if HumanOnly(s) && !p.Kind.mayHoldHumanOnly() {
		return false
	}
	return slices.Contains(p.Scopes, s) || slices.Contains(p.Scopes, ScopeAdmin)
}
