package slots

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Reason is a stable name a refusal or a verdict carries (docs/reconciliation.md section 8). Names
// never change meaning; the API maps each spec-write refusal to a problem+json code.
type Reason string

// Spec-write refusals ([NextSpec]).
const (
	ReasonConflict                 Reason = "conflict"                         // expected_revision does not match what is stored
	ReasonServiceNotFound          Reason = "service-not-found"                // the service does not exist
	ReasonServiceDeleting          Reason = "service-deleting"                 // the service is being deleted
	ReasonSpecNodeUnknown          Reason = "spec-node-unknown"                // a pinned node id is not an enrolled, unretired node
	ReasonSpecReadinessUndeclared  Reason = "spec-readiness-target-undeclared" // a tcp or http probe names a port the service does not declare
	ReasonSpecReadinessUnsupported Reason = "spec-readiness-unsupported"       // a tcp or http probe on an isolated network, which the node cannot dial
	ReasonSpecPlacementInvalid     Reason = "spec-placement-invalid"           // unknown placement mode, or pinned ids missing, repeated or given for another mode
	ReasonSpecReplicasInvalid      Reason = "spec-replicas-invalid"            // replica counts out of bounds or given for the wrong placement
	ReasonSpecResourcesInvalid     Reason = "spec-resources-invalid"           // memory or CPU out of bounds
	ReasonSpecReadinessInvalid     Reason = "spec-readiness-invalid"           // unknown probe kind or timings out of bounds
	ReasonSpecNetworkInvalid       Reason = "spec-network-invalid"             // unknown network mode
	ReasonSpecOwnsPlacement        Reason = "spec-owns-placement"              // a service update states replicas or placement while a spec exists
)

// Verdict reasons ([Verdict]): waits and refusals of service runtime production.
const (
	ReasonFailureBackoff Reason = "failure-backoff"  // waiting: a failed slot waits out its backoff
	ReasonNoEligibleNode Reason = "no-eligible-node" // refused: the spec wants replicas and no node can take one
	ReasonReplicaLimit   Reason = "replica-limit"    // refused: the service holds more slots than the limit
	ReasonSlotInvalid    Reason = "slot-invalid"     // refused: a slot row breaks an invariant; an operator must look
	// ReasonReleaseMissing (refused): the service names no release, or one the store does not hold.
	ReasonReleaseMissing Reason = "release-missing"
	// ReasonPlatformUnsupported (refused): the release cannot run on the placed node's platform.
	ReasonPlatformUnsupported Reason = "platform-unsupported"
	// ReasonPolicyDenied (refused): a policy bound to the deploy hook denied a run the plan
	// wanted (docs/reconciliation.md section 7.3); the policy's reasons follow after ": ", as
	// [PolicyDeniedReason] builds them.
	ReasonPolicyDenied Reason = "policy-denied"
	// ReasonPolicyUnavailable (waiting): the deploy hook could not be evaluated, so the run it
	// was asked about is held (docs/reconciliation.md section 7.3).
	ReasonPolicyUnavailable Reason = "policy-unavailable"
)

// MaxPolicyReasonBytes bounds the policy's reasons a policy-denied verdict carries, in bytes of
// the joined text; longer text is cut at a character boundary and ends in "...".
const MaxPolicyReasonBytes = 512

// PolicyDeniedReason returns the refusal of a run the deploy hook denied with reasons (the
// policy's own, any order kept): "policy-denied: <reason>; <reason>", at most
// [MaxPolicyReasonBytes] of reasons, and plain "policy-denied" when the policy gave none.
func PolicyDeniedReason(reasons []string) Reason {
	var parts []string
	for _, r := range reasons {
		if r = strings.TrimSpace(r); r != "" {
			parts = append(parts, r)
		}
	}
	text := strings.Join(parts, "; ")
	if text == "" {
		return ReasonPolicyDenied
	}
	if len(text) > MaxPolicyReasonBytes {
		cut := MaxPolicyReasonBytes
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "..."
	}
	return ReasonPolicyDenied + Reason(": "+text)
}

// AdmissionVerdict returns v with the deploy hook's hold of this sweep applied: reason (from
// [PolicyDeniedReason], or [ReasonPolicyUnavailable]; "" for none) makes v refused or waiting
// on it, except that a refusal v already names stands (precedence of docs/reconciliation.md
// section 7).
func AdmissionVerdict(v Verdict, reason Reason) Verdict {
	if reason == "" || v.State == Refused {
		return v
	}
	state := Refused
	if reason == ReasonPolicyUnavailable {
		state = Waiting
	}
	return Verdict{SpecRevision: v.SpecRevision, State: state, Reason: reason}
}

// IsPolicyDenied reports whether r is a policy-denied refusal, with or without its reasons.
func IsPolicyDenied(r Reason) bool {
	return r == ReasonPolicyDenied || strings.HasPrefix(string(r), string(ReasonPolicyDenied)+": ")
}

// Refusal is a named refusal; it is an error whose text starts with "berth: <reason>".
type Refusal struct {
	Reason Reason
	// Detail says which value was refused, for the caller; it never holds a secret.
	Detail string
}

// Error returns "berth: <reason>" or "berth: <reason>: <detail>".
func (r *Refusal) Error() string {
	if r.Detail == "" {
		return "berth: " + string(r.Reason)
	}
	return "berth: " + string(r.Reason) + ": " + r.Detail
}

// Is reports whether target is a *Refusal with the same reason.
func (r *Refusal) Is(target error) bool {
	t, ok := target.(*Refusal)
	return ok && t.Reason == r.Reason
}

func refuse(r Reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// PlacementMode says which nodes a service's slots stand on.
type PlacementMode string

// Placement modes.
const (
	// PlacementScheduled: Replicas.Total slots, each placed on a node the scheduler chooses.
	PlacementScheduled PlacementMode = "scheduled"
	// PlacementEveryNode: Replicas.PerNode slots on every eligible node.
	PlacementEveryNode PlacementMode = "every-node"
	// PlacementPinned: Replicas.PerNode slots on each of Placement.Nodes.
	PlacementPinned PlacementMode = "pinned"
)

// NetworkMode is how a slot's workload is networked.
type NetworkMode string

// Network modes.
const (
	NetworkHost     NetworkMode = "host"     // the node's network; the default
	NetworkIsolated NetworkMode = "isolated" // no address the node can dial
)

// ProbeKind is how readiness is probed.
type ProbeKind string

// Probe kinds.
const (
	ProbeProcess ProbeKind = "process" // ready while the process runs; the default
	ProbeTCP     ProbeKind = "tcp"     // ready when Port accepts a connection
	ProbeHTTP    ProbeKind = "http"    // ready when GET Path on Port answers 2xx or 3xx
)

// Bounds of a runtime spec.
const (
	MaxReplicasPerNode = 64
	MaxReplicas        = 256 // replicas of one service in total
	// MaxSlots bounds the slot rows of one service: each replica has two slot names (its own and
	// its surge name, [SurgeSuffix]); more is refused replica-limit.
	MaxSlots       = 2 * MaxReplicas
	MinMemoryBytes = 4 << 20
	MaxMemoryBytes = 1 << 40
	MaxCPUMillis   = 1_000_000
	MaxPinnedNodes = 256
)

// Readiness timing defaults, filled in by [NextSpec] for zero fields.
const (
	DefaultInitialDelay = 1 * time.Second
	DefaultStartupGrace = 30 * time.Second
	DefaultInterval     = 5 * time.Second
	DefaultTimeout      = 2 * time.Second
	DefaultSuccesses    = 2
	DefaultFailures     = 3
)

// Placement is a spec's placement.
type Placement struct {
	Mode PlacementMode `json:"mode" bson:"mode"`
	// Nodes are the pinned node ids (PlacementPinned only), stored sorted and duplicate-free.
	Nodes []string `json:"nodes,omitempty" bson:"nodes,omitempty"`
}

// Replicas is a spec's replica count: PerNode for every-node and pinned placement, Total for
// scheduled placement; the other one must be zero.
type Replicas struct {
	PerNode int `json:"per_node,omitempty" bson:"per_node,omitempty"`
	Total   int `json:"total,omitempty" bson:"total,omitempty"`
}

// Resources limit each slot's workload; zero means no limit.
type Resources struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty" bson:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty" bson:"cpu_millis,omitempty"`
}

// Probe is a readiness probe. Durations are whole milliseconds on the wire (the _ms fields); a zero
// timing takes its default at write time, so a stored spec is always complete.
type Probe struct {
	Kind ProbeKind `json:"kind" bson:"kind"`
	// Port is the declared port a tcp or http probe dials; zero for process.
	Port int `json:"port,omitempty" bson:"port,omitempty"`
	// Path is the http probe's request path, starting with "/"; "/" when empty.
	Path           string `json:"path,omitempty" bson:"path,omitempty"`
	InitialDelayMS int64  `json:"initial_delay_ms" bson:"initial_delay_ms"`
	StartupGraceMS int64  `json:"startup_grace_ms" bson:"startup_grace_ms"`
	IntervalMS     int64  `json:"interval_ms" bson:"interval_ms"`
	TimeoutMS      int64  `json:"timeout_ms" bson:"timeout_ms"`
	Successes      int    `json:"successes" bson:"successes"`
	Failures       int    `json:"failures" bson:"failures"`
}

// Spec is a service's runtime spec, stored complete, one document per service, with Revision as
// its compare-and-set guard (docs/reconciliation.md section 1).
type Spec struct {
	// Revision is 1 for the first accepted write and increases by one on every accepted write.
	Revision int64 `json:"revision" bson:"revision"`
	// RunRevision is the revision of the latest write that changed what a slot runs (resources,
	// readiness, network); a write that changes only placement, replica counts or hold keeps
	// it, so the desired attempt key ([Spec.KeyRevision]) does not move and no running replica
	// is replaced. Zero (a spec stored before it existed) reads as Revision.
	RunRevision int64       `json:"run_revision,omitempty" bson:"run_revision,omitempty"`
	Placement   Placement   `json:"placement" bson:"placement"`
	Replicas    Replicas    `json:"replicas" bson:"replicas"`
	Hold        bool        `json:"hold" bson:"hold"`
	Resources   Resources   `json:"resources" bson:"resources"`
	Readiness   Probe       `json:"readiness" bson:"readiness"`
	Network     NetworkMode `json:"network" bson:"network"`
}

// ServiceFacts is what a spec write reads of its service.
type ServiceFacts struct {
	// Exists reports whether the service exists.
	Exists bool
	// Deleting reports whether the service is marked deleting.
	Deleting bool
	// Ports are the ports the service declares; a tcp or http probe must name one of them.
	Ports []int
}

// SpecWrite is a request to replace a service's runtime spec.
type SpecWrite struct {
	// Spec is the complete new spec; its Revision is ignored.
	Spec Spec
	// ExpectedRevision is the revision the caller read; nil states that it read no spec.
	ExpectedRevision *int64
}

// NextSpec checks a spec write against what the writer read and returns the spec to store: w.Spec
// with its defaults filled in, pinned nodes sorted, and Revision one above current's (1 when
// current is nil), and RunRevision kept from current when only placement, replica counts or
// hold changed. nodes are the ids of enrolled nodes that are not retired. It refuses by name,
// in this order: service-not-found, service-deleting, conflict (a nil expectation against an
// existing spec, a number against none, or a stale number), then the values. It is pure; the
// caller stores the result with one compare-and-set on the spec document's revision.
func NextSpec(w SpecWrite, svc ServiceFacts, current *Spec, nodes map[string]bool) (Spec, error) {
	switch {
	case !svc.Exists:
		return Spec{}, refuse(ReasonServiceNotFound, "")
	case svc.Deleting:
		return Spec{}, refuse(ReasonServiceDeleting, "")
	case w.ExpectedRevision == nil && current != nil:
		return Spec{}, refuse(ReasonConflict, "a spec exists at revision %d", current.Revision)
	case w.ExpectedRevision != nil && current == nil:
		return Spec{}, refuse(ReasonConflict, "no spec exists (expected revision %d)", *w.ExpectedRevision)
	case w.ExpectedRevision != nil && *w.ExpectedRevision != current.Revision:
		return Spec{}, refuse(ReasonConflict, "spec is at revision %d (expected %d)", current.Revision, *w.ExpectedRevision)
	}
	s := withDefaults(w.Spec)
	if err := validate(s, svc, nodes); err != nil {
		return Spec{}, err
	}
	s.Revision = 1
	if current != nil {
		s.Revision = current.Revision + 1
	}
	s.RunRevision = s.Revision
	if current != nil && sameRun(*current, s) {
		s.RunRevision = current.KeyRevision()
	}
	return s, nil
}

// KeyRevision returns the spec revision a desired attempt key covers ([KeyInput.SpecRevision]):
// RunRevision, or Revision for a spec stored before RunRevision existed.
func (s Spec) KeyRevision() int64 {
	if s.RunRevision != 0 {
		return s.RunRevision
	}
	return s.Revision
}

// sameRun reports whether a and b run their slots alike: equal resources, readiness and
// network; placement, replica counts and hold do not change what a slot runs.
func sameRun(a, b Spec) bool {
	return a.Resources == b.Resources && a.Readiness == b.Readiness && a.Network == b.Network
}

// withDefaults returns s with empty fields defaulted; it copies the pinned node slice.
func withDefaults(s Spec) Spec {
	if s.Placement.Mode == "" {
		s.Placement.Mode = PlacementScheduled
	}
	s.Placement.Nodes = slices.Clone(s.Placement.Nodes)
	slices.Sort(s.Placement.Nodes)
	if s.Network == "" {
		s.Network = NetworkHost
	}
	p := &s.Readiness
	if p.Kind == "" {
		p.Kind = ProbeProcess
	}
	if p.Kind == ProbeHTTP && p.Path == "" {
		p.Path = "/"
	}
	def := func(v *int64, d time.Duration) {
		if *v == 0 {
			*v = d.Milliseconds()
		}
	}
	def(&p.InitialDelayMS, DefaultInitialDelay)
	def(&p.StartupGraceMS, DefaultStartupGrace)
	def(&p.IntervalMS, DefaultInterval)
	def(&p.TimeoutMS, DefaultTimeout)
	if p.Successes == 0 {
		p.Successes = DefaultSuccesses
	}
	if p.Failures == 0 {
		p.Failures = DefaultFailures
	}
	return s
}

func validate(s Spec, svc ServiceFacts, nodes map[string]bool) error {
	switch s.Placement.Mode {
	case PlacementScheduled, PlacementEveryNode:
		if len(s.Placement.Nodes) != 0 {
			return refuse(ReasonSpecPlacementInvalid, "nodes are only stated for pinned placement")
		}
	case PlacementPinned:
		if len(s.Placement.Nodes) == 0 || len(s.Placement.Nodes) > MaxPinnedNodes {
			return refuse(ReasonSpecPlacementInvalid, "pinned placement names 1 to %d nodes", MaxPinnedNodes)
		}
		for i, id := range s.Placement.Nodes {
			if i > 0 && s.Placement.Nodes[i-1] == id {
				return refuse(ReasonSpecPlacementInvalid, "node %q is named twice", id)
			}
			if !nodes[id] {
				return refuse(ReasonSpecNodeUnknown, "node %q", id)
			}
		}
	default:
		return refuse(ReasonSpecPlacementInvalid, "unknown placement mode %q", s.Placement.Mode)
	}
	r := s.Replicas
	if s.Placement.Mode == PlacementScheduled {
		if r.PerNode != 0 || r.Total < 0 || r.Total > MaxReplicas {
			return refuse(ReasonSpecReplicasInvalid, "scheduled placement states total replicas, 0 to %d", MaxReplicas)
		}
	} else if r.Total != 0 || r.PerNode < 0 || r.PerNode > MaxReplicasPerNode {
		return refuse(ReasonSpecReplicasInvalid, "%s placement states replicas per node, 0 to %d", s.Placement.Mode, MaxReplicasPerNode)
	}
	if s.Placement.Mode == PlacementPinned && r.PerNode*len(s.Placement.Nodes) > MaxReplicas {
		return refuse(ReasonSpecReplicasInvalid, "more than %d replicas in total", MaxReplicas)
	}
	if m := s.Resources.MemoryBytes; m != 0 && (m < MinMemoryBytes || m > MaxMemoryBytes) {
		return refuse(ReasonSpecResourcesInvalid, "memory_bytes must be 0 or %d to %d", int64(MinMemoryBytes), int64(MaxMemoryBytes))
	}
	if c := s.Resources.CPUMillis; c < 0 || c > MaxCPUMillis {
		return refuse(ReasonSpecResourcesInvalid, "cpu_millis must be 0 to %d", MaxCPUMillis)
	}
	switch s.Network {
	case NetworkHost, NetworkIsolated:
	default:
		return refuse(ReasonSpecNetworkInvalid, "unknown network mode %q", s.Network)
	}
	return validateProbe(s.Readiness, s.Network, svc.Ports)
}

func validateProbe(p Probe, network NetworkMode, ports []int) error {
	switch p.Kind {
	case ProbeProcess:
		if p.Port != 0 || p.Path != "" {
			return refuse(ReasonSpecReadinessInvalid, "a process probe names no port or path")
		}
	case ProbeTCP, ProbeHTTP:
		if p.Kind == ProbeTCP && p.Path != "" {
			return refuse(ReasonSpecReadinessInvalid, "a tcp probe names no path")
		}
		if p.Kind == ProbeHTTP && p.Path[0] != '/' {
			return refuse(ReasonSpecReadinessInvalid, "an http probe path starts with /")
		}
		if !slices.Contains(ports, p.Port) || p.Port <= 0 {
			return refuse(ReasonSpecReadinessUndeclared, "port %d", p.Port)
		}
		if network == NetworkIsolated {
			return refuse(ReasonSpecReadinessUnsupported, "an isolated workload has no address to probe")
		}
	default:
		return refuse(ReasonSpecReadinessInvalid, "unknown probe kind %q", p.Kind)
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	switch {
	case p.InitialDelayMS < 0 || p.InitialDelayMS > ms(10*time.Minute):
		return refuse(ReasonSpecReadinessInvalid, "initial_delay_ms must be 0 to 600000")
	case p.StartupGraceMS < 0 || p.StartupGraceMS > ms(time.Hour):
		return refuse(ReasonSpecReadinessInvalid, "startup_grace_ms must be 0 to 3600000")
	case p.IntervalMS < ms(time.Second) || p.IntervalMS > ms(10*time.Minute):
		return refuse(ReasonSpecReadinessInvalid, "interval_ms must be 1000 to 600000")
	case p.TimeoutMS < ms(100*time.Millisecond) || p.TimeoutMS > p.IntervalMS:
		return refuse(ReasonSpecReadinessInvalid, "timeout_ms must be 100 to interval_ms")
	case p.Successes < 1 || p.Successes > 10:
		return refuse(ReasonSpecReadinessInvalid, "successes must be 1 to 10")
	case p.Failures < 1 || p.Failures > 10:
		return refuse(ReasonSpecReadinessInvalid, "failures must be 1 to 10")
	}
	return nil
}

// CheckServiceUpdate checks a service update against the service's runtime spec (docs/reconciliation.md
// section 1): once a spec exists it owns placement and replica counts, so an update that states
// either is refused spec-owns-placement (even when it repeats the stored value), and an update whose
// ports would leave the spec's tcp or http probe naming an undeclared port is refused
// spec-readiness-target-undeclared. spec nil (no spec) accepts everything; ports are the ports the
// service declares after the update. Pure.
func CheckServiceUpdate(spec *Spec, statesPlacement bool, ports []int) error {
	if spec == nil {
		return nil
	}
	if statesPlacement {
		return refuse(ReasonSpecOwnsPlacement, "the runtime spec owns placement and replicas")
	}
	if p := spec.Readiness; (p.Kind == ProbeTCP || p.Kind == ProbeHTTP) && !slices.Contains(ports, p.Port) {
		return refuse(ReasonSpecReadinessUndeclared, "the readiness probe names port %d", p.Port)
	}
	return nil
}
