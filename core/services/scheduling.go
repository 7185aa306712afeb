package services

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Defaults of a replica's resources (docs/placement.md section 4): one capacity unit.
const (
	// UnitCPUMilli is the CPU, in millicores, of one capacity unit: what a replica reserves when
	// neither resources.cpu_m, cpu_millis nor capacity_units says otherwise.
	UnitCPUMilli = 100
	// UnitMemoryMiB is the memory, in MiB, of one capacity unit.
	UnitMemoryMiB = 128
)

// Bounds of the placement fields of a service.
const (
	maxCPUMilli     = 1 << 20 // 1,048 CPUs
	maxMemoryMiB    = 1 << 24 // 16 TiB
	maxExtended     = 16
	maxSelector     = 32
	maxAntiAffinity = 32
	maxPerNode      = 1000
)

// Resources is what one replica of a service reserves on its node: CPU in millicores (cpu_m),
// memory in MiB (memory_mib), and extended resources the nodes declare (gpu, ...) in their
// own units. A zero field takes its default ([Service.ReplicaResources]).
type Resources struct {
	CPUMilli  int64            `bson:"cpu_m,omitempty" json:"cpu_m,omitempty"`
	MemoryMiB int64            `bson:"memory_mib,omitempty" json:"memory_mib,omitempty"`
	Extended  map[string]int64 `bson:"extended,omitempty" json:"extended,omitempty"`
}

// Scheduling restricts and ranks the nodes a service's replicas may use (docs/placement.md).
type Scheduling struct {
	// NodeSelector labels must be on a node with exactly these values.
	NodeSelector map[string]string `bson:"node_selector,omitempty"`
	// Region, when not empty, must be the node's region.
	Region string `bson:"region,omitempty"`
	// SpreadBy is "node" (also when empty), "region" or "label:<key>".
	SpreadBy string `bson:"spread_by,omitempty"`
	// MaxPerNode, when positive, bounds the replicas on one node.
	MaxPerNode int `bson:"max_per_node,omitempty"`
	// AntiAffinity names services of the same project whose replicas a node must not hold.
	AntiAffinity []string `bson:"anti_affinity,omitempty"`
	// Preferences are labels that rank a node higher without excluding the others.
	Preferences map[string]string `bson:"preferences,omitempty"`
}

// ReplicaResources returns what one replica of s reserves: each field of s.Resources that is
// set; otherwise, for CPU and memory, the container limit (cpu_millis, memory_mb) when one is
// set, else CapacityUnits (at least 1) times one unit ([UnitCPUMilli], [UnitMemoryMiB]).
// Extended resources have no default.
func (s *Service) ReplicaResources() Resources {
	units := int64(max(s.CapacityUnits, 1))
	r := Resources{CPUMilli: s.Resources.CPUMilli, MemoryMiB: s.Resources.MemoryMiB}
	if r.CPUMilli == 0 {
		r.CPUMilli = s.CPUMillis
		if r.CPUMilli == 0 {
			r.CPUMilli = units * UnitCPUMilli
		}
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = s.MemoryMB
		if r.MemoryMiB == 0 {
			r.MemoryMiB = units * UnitMemoryMiB
		}
	}
	if len(s.Resources.Extended) > 0 {
		r.Extended = maps.Clone(s.Resources.Extended)
	}
	return r
}

var (
	schedLabelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	extendedNameRE  = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)
	serviceNameRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidatePlacement checks a service's resources and scheduling fields as an apply states
// them, and returns an error naming the field at fault (the caller answers 422). name is the
// service's own name (it may not avoid itself).
func ValidatePlacement(name string, r Resources, s Scheduling) error {
	switch {
	case r.CPUMilli < 0 || r.CPUMilli > maxCPUMilli:
		return fmt.Errorf("resources.cpu_m must be between 0 and %d millicores (0: the default)", maxCPUMilli)
	case r.MemoryMiB < 0 || r.MemoryMiB > maxMemoryMiB:
		return fmt.Errorf("resources.memory_mib must be between 0 and %d MiB (0: the default)", maxMemoryMiB)
	case len(r.Extended) > maxExtended:
		return fmt.Errorf("resources.extended names more than %d resources", maxExtended)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Extended)) {
		if !extendedNameRE.MatchString(k) {
			return fmt.Errorf("resources.extended: %q must be a lowercase label (a-z, 0-9, '-', '_'), optionally after '<domain>/'", k)
		}
		if v := r.Extended[k]; v < 0 || v > 1<<20 {
			return fmt.Errorf("resources.extended.%s must be between 0 and %d", k, 1<<20)
		}
	}
	if err := checkLabels("node_selector", s.NodeSelector); err != nil {
		return err
	}
	if err := checkLabels("preferences", s.Preferences); err != nil {
		return err
	}
	if len(s.Region) > 63 {
		return fmt.Errorf("region must be at most 63 characters")
	}
	switch {
	case s.SpreadBy == "" || s.SpreadBy == "node" || s.SpreadBy == "region":
	case strings.HasPrefix(s.SpreadBy, "label:") && schedLabelKeyRE.MatchString(strings.TrimPrefix(s.SpreadBy, "label:")):
	default:
		return fmt.Errorf("spread_by %q must be node, region or label:<key>", s.SpreadBy)
	}
	if s.MaxPerNode < 0 || s.MaxPerNode > maxPerNode {
		return fmt.Errorf("max_per_node must be between 0 and %d (0: no bound)", maxPerNode)
	}
	if len(s.AntiAffinity) > maxAntiAffinity {
		return fmt.Errorf("anti_affinity names more than %d services", maxAntiAffinity)
	}
	seen := map[string]bool{}
	for _, a := range s.AntiAffinity {
		switch {
		case !serviceNameRE.MatchString(a):
			return fmt.Errorf("anti_affinity: %q is not a service name", a)
		case a == name:
			return fmt.Errorf("anti_affinity: a service cannot avoid itself; use max_per_node: 1 to keep its replicas apart")
		case seen[a]:
			return fmt.Errorf("anti_affinity: %q is listed twice", a)
		}
		seen[a] = true
	}
	return nil
}

func checkLabels(field string, m map[string]string) error {
	if len(m) > maxSelector {
		return fmt.Errorf("%s has more than %d labels", field, maxSelector)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !schedLabelKeyRE.MatchString(k) || len(m[k]) > 253 {
			return fmt.Errorf("%s: label %q=%q: keys are 1 to 63 of [a-z0-9._/-], values at most 253 characters", field, k, m[k])
		}
	}
	return nil
}

// normal returns r with an empty Extended as nil (for comparisons).
func (r Resources) normal() Resources {
	if len(r.Extended) == 0 {
		r.Extended = nil
	}
	return r
}

// normal returns s with empty maps and lists as nil and the default spread spelled out.
func (s Scheduling) normal() Scheduling {
	if len(s.NodeSelector) == 0 {
		s.NodeSelector = nil
	}
	if len(s.Preferences) == 0 {
		s.Preferences = nil
	}
	if len(s.AntiAffinity) == 0 {
		s.AntiAffinity = nil
	}
	if s.SpreadBy == "node" {
		s.SpreadBy = ""
	}
	return s
}
