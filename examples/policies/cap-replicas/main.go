//go:build wasip1

// Command cap-replicas is an admission policy: it caps the replicas and the
// capacity units a project runs in total, with per-project overrides:
// {"max_replicas": 10, "max_capacity_units": 20, "projects": {"shop": {...}}}.
package main

import (
	"fmt"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "cap-replicas", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

type limits struct {
	MaxReplicas      int `json:"max_replicas"`
	MaxCapacityUnits int `json:"max_capacity_units"`
}

type config struct {
	limits
	Projects map[string]limits `json:"projects"`
}

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookServiceApply || in.Project == nil {
		return wasm.Allow()
	}
	cfg, err := wasm.Config[config](in)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	s, _, err := wasm.Object[abiwasm.Service](in.Object)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	lim := cfg.limits
	if l, ok := cfg.Projects[in.Project.Name]; ok {
		lim = l
	}
	var reasons []string
	if r := in.Project.Replicas + s.Replicas; lim.MaxReplicas > 0 && r > lim.MaxReplicas {
		reasons = append(reasons, fmt.Sprintf("project %s would run %d replicas, over its cap of %d", in.Project.Name, r, lim.MaxReplicas))
	}
	if c := in.Project.CapacityUnits + s.Replicas*s.CapacityUnits; lim.MaxCapacityUnits > 0 && c > lim.MaxCapacityUnits {
		reasons = append(reasons, fmt.Sprintf("project %s would use %d capacity units, over its cap of %d", in.Project.Name, c, lim.MaxCapacityUnits))
	}
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func main() {}
