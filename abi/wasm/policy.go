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
//	HookResourceApply  Object: the declared [Resource] as it would be stored; OldObject: the stored one, or null
const (
	HookServiceApply  Hook = "service.apply"
	HookServiceDelete Hook = "service.delete"
	HookNodeEnroll    Hook = "node.enroll"
	HookDeploy        Hook = "deploy"
	HookResourceApply Hook = "resource.apply"
)

// HookRoutesCompile is where an operator binds a route compiler ([KindRoutes])
// to replace the default one (docs/wasm-abi.md section 6.4). It is a binding
// target, not a policy hook: no policy is asked there, and it is not among
// [Hooks].
const HookRoutesCompile Hook = "routes.compile"

// Hooks returns every policy hook, in documentation order.
func Hooks() []Hook {
	return []Hook{HookServiceApply, HookServiceDelete, HookNodeEnroll, HookDeploy, HookResourceApply}
}

// Valid reports whether h is one of [Hooks].
func (h Hook) Valid() bool {
	for _, k := range Hooks() {
		if h == k {
			return true
		}
	}
	return false
}

// InputSchemaVersion names the shape of [PolicyInput] that berthd sends,
// schema/policy_input.json; every input carries it in SchemaVersion
// (docs/wasm-abi.md section 5.2).
//
// Changelog:
//   - "1.3" (2026-12-02): the hook resource.apply, whose object is a declared
//     [Resource] (docs/resources.md section 1). Inputs of the other hooks are
//     unchanged.
//   - "1.2" (2026-12): service.apply inputs carry cause, what made the change
//     ([Cause]); other hooks leave it out. A policy that ignores it decides as before.
//     rollout.rebalance, job.control and job.command joined the causes later in the same
//     month, and rollout.pause, rollout.resume and rollout.restart on 2026-12-03.
//   - "1.1" (ABI 1.1, 2026-12): the service object carries every field the
//     API accepts: health_check, placement_mode, lease, runtime, image,
//     user, memory_mb, cpu_millis; every object is closed (no other field).
//   - "1.0" (ABI 1.0): no schema_version field; the service without those.
const InputSchemaVersion = "1.3"

// Resource is the object of HookResourceApply: a declared resource of a type a
// provider plugin declares (docs/resources.md). Spec is the JSON object the
// operator declared, already checked against the type's schema.
type Resource struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Project    string          `json:"project"`
	Spec       json.RawMessage `json:"spec"`
	OnDrift    string          `json:"on_drift"`
	Generation int64           `json:"generation"`
}

// PolicyInput is what policy_evaluate receives (schema/policy_input.json).
// SchemaVersion is [InputSchemaVersion]. Config is the binding's
// configuration, passed unchanged (null when the binding has none), so one
// module can serve several bindings.
type PolicyInput struct {
	SchemaVersion string   `json:"schema_version"`
	Hook          Hook     `json:"hook"`
	Actor         Actor    `json:"actor"`
	Project       *Project `json:"project,omitempty"`
	// Cause is what made a service.apply change ([Cause]); empty, and left out, for the
	// other hooks.
	Cause     Cause           `json:"cause,omitempty"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"old_object"`
	Config    json.RawMessage `json:"config"`
}

// Cause names what made a change to what a service runs, as service.apply sees it
// (docs/deploy.md): an API apply, a release promotion, a registry push to a followed
// tag, a secret's new version, a binding's credentials, an operator's undo, the
// automatic rollback of a failed rollout, an operator's rebalance, pause, resume or
// restart of a rollout, and a job's control or one-off command.
type Cause string

// Causes of a service.apply admission.
const (
	CauseAPIPut         Cause = "api.put"
	CauseReleasePromote Cause = "release.promote"
	CauseRegistryPush   Cause = "registry.push"
	CauseSecretRollover Cause = "secret.rollover"
	CauseBindingPublish Cause = "binding.publish"
	CauseRolloutUndo    Cause = "rollout.undo"
	CauseAutoRollback   Cause = "rollout.auto_rollback"
	// CauseRolloutRebalance: an operator's rebalance recorded replica moves on the
	// service (its declaration is unchanged).
	CauseRolloutRebalance Cause = "rollout.rebalance"
	// CauseRolloutPause, CauseRolloutResume, CauseRolloutRestart: an operator paused,
	// resumed or restarted a service's rollout (berth rollout pause|resume|restart;
	// docs/reconciliation.md section 5.2). The object is the service as stored: a pause and a
	// resume change no declared field, a restart replaces every replica with the same
	// declaration.
	CauseRolloutPause   Cause = "rollout.pause"
	CauseRolloutResume  Cause = "rollout.resume"
	CauseRolloutRestart Cause = "rollout.restart"
	// CauseJobControl: an operator suspended or resumed a job's schedule (berth job
	// suspend|resume; docs/jobs.md section 7).
	CauseJobControl Cause = "job.control"
	// CauseJobCommand: an operator asked for a one-off command in a service's environment
	// (berth run; docs/jobs.md section 9). The object is the service as the run would run
	// it: kind job, its command replaced; nothing is written to the service.
	CauseJobCommand Cause = "job.command"
)

// Causes returns every [Cause], in documentation order.
func Causes() []Cause {
	return []Cause{CauseAPIPut, CauseReleasePromote, CauseRegistryPush, CauseSecretRollover, CauseBindingPublish,
		CauseRolloutUndo, CauseAutoRollback, CauseRolloutRebalance, CauseRolloutPause, CauseRolloutResume, CauseRolloutRestart,
		CauseJobControl, CauseJobCommand}
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

// Service is a service as a policy sees it: every field of the service the
// API accepts (docs/api.md), under [InputSchemaVersion]. Bundle is what the
// operator wrote (a name or "sha256:<hex>"); BundleDigest is what it was
// pinned to. Image is an OCI reference, empty for bundle services.
// CapacityUnits is per replica. PlacementMode is "portable" or "stateful";
// Lease is set for stateful services only. Runtime is "process" or
// "containerd"; User, MemoryMB (mebibytes, 0 no limit) and CPUMillis
// (thousandths of a CPU, 0 no limit) are the container fields. HealthCheck's
// Path is "" when the service has no HTTP health check.
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
	HealthCheck   HealthCheck       `json:"health_check"`
	PlacementMode string            `json:"placement_mode"`
	Lease         *Lease            `json:"lease,omitempty"`
	Runtime       string            `json:"runtime"`
	User          string            `json:"user,omitempty"`
	MemoryMB      int64             `json:"memory_mb"`
	CPUMillis     int64             `json:"cpu_millis"`
}

// HealthCheck is a service's HTTP health check: Path as declared ("" for
// none), and the interval and timeout in seconds and the failures in a row
// that make a workload unhealthy the node probes with, the defaults of
// docs/node-protocol.md section 6.3 written out where the service sets none.
type HealthCheck struct {
	Path      string `json:"path"`
	IntervalS int    `json:"interval_s"`
	TimeoutS  int    `json:"timeout_s"`
	Failures  int    `json:"failures"`
}

// Lease is a stateful service's lease: Mode "local" or "expiring", and for
// expiring leases DurationMS (milliseconds; 0 the default).
type Lease struct {
	Mode       string `json:"mode"`
	DurationMS int64  `json:"duration_ms"`
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
