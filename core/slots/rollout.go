package slots

import (
	"fmt"
	"strings"
)

// Bound is one rollout bound (docs/reconciliation.md section 5.2): Value replicas, or, when
// Percent, Value percent of the desired replicas (Kubernetes style: a surge rounds up, an
// unavailability rounds down).
type Bound struct {
	Value   int  `json:"value" bson:"value"`
	Percent bool `json:"percent,omitempty" bson:"percent,omitempty"`
}

// String returns "3" or "25%".
func (b Bound) String() string {
	if b.Percent {
		return fmt.Sprintf("%d%%", b.Value)
	}
	return fmt.Sprint(b.Value)
}

// of returns the bound as a count of replicas out of replicas, rounding up when up.
func (b Bound) of(replicas int, up bool) int {
	if !b.Percent {
		return b.Value
	}
	n := b.Value * replicas
	if up {
		return (n + 99) / 100
	}
	return n / 100
}

// RolloutSpec is a service's `rollout:` block as declared; a nil bound takes its default.
type RolloutSpec struct {
	// MaxSurge is how many replicas may run above the desired count while a rollout replaces
	// replicas (nil: 1 for a portable service; a stateful service always runs 0).
	MaxSurge *Bound `json:"max_surge,omitempty" bson:"max_surge,omitempty"`
	// MaxUnavailable is how many desired replicas may be not ready because the rollout stopped
	// them (nil: 0 for a portable service; a stateful service always runs 1).
	MaxUnavailable *Bound `json:"max_unavailable,omitempty" bson:"max_unavailable,omitempty"`
}

// Rollout defaults and limits.
const (
	DefaultMaxSurge       = 1
	DefaultMaxUnavailable = 0
	// MaxRolloutPercent bounds a percentage bound.
	MaxRolloutPercent = 100
)

// ReasonSpecRolloutInvalid refuses a rollout block out of bounds.
const ReasonSpecRolloutInvalid Reason = "spec-rollout-invalid"

// ReasonRolloutPaused (waiting): an operator paused the service's rollout and replicas still
// run another attempt than the desired one.
const ReasonRolloutPaused Reason = "rollout-paused"

// ValidateRollout checks a service's rollout block (nil: none declared) before it is stored: each
// bound is 0 to [MaxReplicas] replicas or 0 to 100 percent, the two are not both zero (a rollout
// could never move), and a stateful service, which replaces its one replica stop-before-start
// under its lease, declares no surge above zero. It refuses with [ReasonSpecRolloutInvalid]; the
// detail names the field. Pure.
func ValidateRollout(r *RolloutSpec, stateful bool) error {
	if r == nil {
		return nil
	}
	check := func(name string, b *Bound) error {
		switch {
		case b == nil:
		case b.Value < 0:
			return refuse(ReasonSpecRolloutInvalid, "rollout.%s must not be negative", name)
		case b.Percent && b.Value > MaxRolloutPercent:
			return refuse(ReasonSpecRolloutInvalid, "rollout.%s must be 0%% to 100%%", name)
		case !b.Percent && b.Value > MaxReplicas:
			return refuse(ReasonSpecRolloutInvalid, "rollout.%s must be 0 to %d replicas", name, MaxReplicas)
		}
		return nil
	}
	if err := check("max_surge", r.MaxSurge); err != nil {
		return err
	}
	if err := check("max_unavailable", r.MaxUnavailable); err != nil {
		return err
	}
	if stateful {
		if r.MaxSurge != nil && r.MaxSurge.Value != 0 {
			return refuse(ReasonSpecRolloutInvalid, "rollout.max_surge: a stateful service replaces its replica stop-before-start under its lease; leave max_surge out or 0")
		}
		return nil
	}
	surge, unavail := DefaultMaxSurge, DefaultMaxUnavailable
	if r.MaxSurge != nil {
		surge = r.MaxSurge.Value
	}
	if r.MaxUnavailable != nil {
		unavail = r.MaxUnavailable.Value
	}
	if surge == 0 && unavail == 0 {
		return refuse(ReasonSpecRolloutInvalid, "rollout.max_surge and rollout.max_unavailable cannot both be 0: the rollout could never replace a replica")
	}
	return nil
}

// ParseBound reads "3" or "25%" into a Bound; it refuses anything else with
// [ReasonSpecRolloutInvalid].
func ParseBound(s string) (Bound, error) {
	s = strings.TrimSpace(s)
	b := Bound{}
	num := s
	if strings.HasSuffix(s, "%") {
		b.Percent, num = true, strings.TrimSuffix(s, "%")
	}
	var n int
	if _, err := fmt.Sscanf(num, "%d", &n); err != nil || fmt.Sprint(n) != num {
		return Bound{}, refuse(ReasonSpecRolloutInvalid, "%q is neither a whole number of replicas nor a percentage such as \"25%%\"", s)
	}
	b.Value = n
	return b, nil
}

// Rollout is a service's rollout resolved against its desired replica count, as [PlanService]
// reads it. The zero Rollout replaces one replica at a time, stop before start (MaxSurge 0,
// MaxUnavailable 1): what a stateful service runs.
type Rollout struct {
	// MaxSurge is how many replicas may run above the desired count; negative counts as 0.
	MaxSurge int
	// MaxUnavailable is how many desired replicas the rollout may leave not ready; negative
	// counts as 0. With both zero the planner uses MaxUnavailable 1.
	MaxUnavailable int
	// Paused reports whether an operator paused the rollout: no replacement begins; those in
	// flight finish, and missing replicas still start.
	Paused bool
}

// ResolveRollout returns the rollout a service runs with replicas desired replicas: spec's
// bounds (nil: none declared) with defaults filled in, percentages turned into counts (a surge
// rounds up, an unavailability down), and, when both come out zero, MaxUnavailable 1 (as
// Kubernetes does). A stateful service always runs MaxSurge 0, MaxUnavailable 1. Pure.
func ResolveRollout(spec *RolloutSpec, replicas int, stateful, paused bool) Rollout {
	r := Rollout{MaxSurge: DefaultMaxSurge, MaxUnavailable: DefaultMaxUnavailable, Paused: paused}
	if stateful {
		return Rollout{MaxUnavailable: 1, Paused: paused}
	}
	if spec != nil && spec.MaxSurge != nil {
		r.MaxSurge = spec.MaxSurge.of(replicas, true)
	}
	if spec != nil && spec.MaxUnavailable != nil {
		r.MaxUnavailable = spec.MaxUnavailable.of(replicas, false)
	}
	if r.MaxSurge <= 0 && r.MaxUnavailable <= 0 {
		r.MaxSurge, r.MaxUnavailable = 0, 1
	}
	return r
}

// SurgeSuffix marks a replica's second slot name: a surging rollout starts a replica's successor
// in the name its incumbent does not use ("3" and "3~"), so the two run side by side until the
// successor is ready; the names alternate from one rollout to the next.
const SurgeSuffix = "~"

// BaseReplica returns the replica a slot name belongs to: the name without [SurgeSuffix].
func BaseReplica(name string) string { return strings.TrimSuffix(name, SurgeSuffix) }

// otherName returns the other of a replica's two slot names.
func otherName(name string) string {
	if strings.HasSuffix(name, SurgeSuffix) {
		return BaseReplica(name)
	}
	return name + SurgeSuffix
}
