package nodes

import "maps"

// Resources is an amount of a node's resources: what it can give to workloads (its
// allocatable capacity) or what an operator says it can. CPUMilli is in thousandths of a CPU,
// MemoryMiB and DiskMiB (space for volumes) in mebibytes; Extended holds operator-declared
// countable resources by name (e.g. "gpu": 1). A zero field is "not stated".
type Resources struct {
	CPUMilli  int64            `bson:"cpu_m,omitempty" json:"cpu_m,omitempty"`
	MemoryMiB int64            `bson:"memory_mib,omitempty" json:"memory_mib,omitempty"`
	DiskMiB   int64            `bson:"disk_mib,omitempty" json:"disk_mib,omitempty"`
	Extended  map[string]int64 `bson:"extended,omitempty" json:"extended,omitempty"`
}

// Equal reports whether r and o state the same amounts (a nil and an empty Extended are equal).
func (r Resources) Equal(o Resources) bool {
	return r.CPUMilli == o.CPUMilli && r.MemoryMiB == o.MemoryMiB && r.DiskMiB == o.DiskMiB &&
		maps.Equal(r.Extended, o.Extended)
}

// IsZero reports whether r states nothing.
func (r Resources) IsZero() bool { return r.Equal(Resources{}) }

// Capacity returns what the node offers to placement: its reported [Node.Allocatable] with
// every field the operator's [Node.CapacityOverride] states (non-zero) in its place; an
// extended resource the override names replaces the reported one, 0 included (an operator
// hides a reported gpu with gpu=0). Pure; the result shares nothing with n.
func (n *Node) Capacity() Resources {
	out := n.Allocatable
	out.Extended = maps.Clone(n.Allocatable.Extended)
	o := n.CapacityOverride
	if o == nil {
		return out
	}
	if o.CPUMilli > 0 {
		out.CPUMilli = o.CPUMilli
	}
	if o.MemoryMiB > 0 {
		out.MemoryMiB = o.MemoryMiB
	}
	if o.DiskMiB > 0 {
		out.DiskMiB = o.DiskMiB
	}
	for k, v := range o.Extended {
		if out.Extended == nil {
			out.Extended = map[string]int64{}
		}
		out.Extended[k] = v
	}
	return out
}
