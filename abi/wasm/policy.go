package wasm

import "encoding/json"

// Hook names the moment a policy is asked (docs/wasm-abi.md section 5.1).
type Hook string

// Hooks. Object and OldObject of [PolicyInput] hold, per hook:
//
//	HookServiceApply   Object: the service as it would be stored ([Service]); OldObject: the stored one, or null
//	HookServiceDelete  Object: null; OldObject: the stored service
//	HookNodeEnroll     Object: the enrolling [Node]; OldObject: null
//	HookDeploy         Object: a [Placement] (the service, the slot and the chosen node); OldObject: null
const (
	HookServiceApply  Hook = "service.apply"
	HookServiceDelete Hook = "service.delete"
	HookNodeEnroll    Hook = "node.enroll"
	HookDeploy        Hook = "deploy"
)

// HookRoutesCompile is where an operator binds a route compiler ([KindRoutes])
// to replace the default one (docs/wasm-abi.md section 6.4). It is a binding
// target, not a policy hook: no policy is asked there, and it is not among
// [Hooks].
const HookRoutesCompile Hook = "routes.compile"

// Hooks returns every policy hook, in documentation order.
func Hooks() []Hook { return []Hook{HookServiceApply, HookServiceDelete, HookNodeEnroll, HookDeploy} }

// Valid reports whether h is one of [Hooks].
func (h Hook) Valid() bool {
	for _, k := range Hooks() {
		if h == k {
			return true
		}
	}
	return false
}

// PolicyInput is what policy_evaluate receives (schema/policy_input.json).
// Config is the binding's configuration, passed unchanged (null when the
// binding has none), so one module can serve several bindings.
type PolicyInput struct {
	Hook      Hook            `json:"hook"`
	Actor     Actor           `json:"actor"`
	Project   *Project        `json:"project,omitempty"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"old_object"`
	Config    json.RawMessage `json:"config"`
}

// Actor is who asked: Kind "token" (an API token, ID its id), "node" (a node
// credential), "join_token" (an enrolling node) or "system" (the reconciler).
type Actor struct {
	Kind string `json:"kind"`
	ID   string `json:"id,omitempty"`
}

// Project is the project the object belongs to, with what its other services
// already use, so a policy can cap totals. Replicas and CapacityUnits sum the
// project's services other than the one being applied.
type Project struct {
	Name          string `json:"name"`
	Services      int    `json:"services"`
	Replicas      int    `json:"replicas"`
	CapacityUnits int    `json:"capacity_units"`
}

// Service is a service as a policy sees it. Bundle is what the operator wrote
// (a name or "sha256:<hex>"); BundleDigest is what it was pinned to. Image is
// an OCI reference, empty for bundle services. CapacityUnits is per replica.
type Service struct {
	Project       string            `json:"project"`
	Name          string            `json:"name"`
	Revision      int64             `json:"revision"`
	Bundle        string            `json:"bundle,omitempty"`
	BundleDigest  string            `json:"bundle_digest,omitempty"`
	Image         string            `json:"image,omitempty"`
	Command       []string          `json:"command"`
	Env           map[string]string `json:"env"`
	Port          int               `json:"port"`
	Domains       []string          `json:"domains"`
	Replicas      int               `json:"replicas"`
	CapacityUnits int               `json:"capacity_units"`
	Labels        map[string]string `json:"labels"`
}

// Node is a node as a policy sees it.
type Node struct {
	ID       string            `json:"id,omitempty"`
	Hostname string            `json:"hostname"`
	Region   string            `json:"region,omitempty"`
	Labels   map[string]string `json:"labels"`
	Address  string            `json:"address"`
	CPUs     int               `json:"cpus"`
	MemoryMB int64             `json:"memory_mb"`
}

// Placement is the object of HookDeploy: the reconciler is about to start slot
// Slot of Service on Node (a new replica, or a replacement after a change).
type Placement struct {
	Service Service `json:"service"`
	Slot    int     `json:"slot"`
	Node    Node    `json:"node"`
}

// Decision is a policy's answer.
type Decision string

// Decisions.
const (
	Allow Decision = "allow"
	Deny  Decision = "deny"
)

// PolicyOutput is what policy_evaluate returns (schema/policy_output.json).
// Reasons say why a request is denied and are shown to the operator;
// Warnings are shown on allow and deny alike. Exactly one of Decision and
// Error is set.
type PolicyOutput struct {
	Decision Decision    `json:"decision,omitempty"`
	Reasons  []string    `json:"reasons,omitempty"`
	Warnings []string    `json:"warnings,omitempty"`
	Error    *GuestError `json:"error,omitempty"`
}
