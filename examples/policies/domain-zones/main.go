//go:build wasip1

// Command domain-zones is an admission policy: a service's domains must lie in
// its project's zones: {"zones": {"shop": ["shop.example.com"]}}. A domain is
// in a zone when it is the zone or ends in "." and the zone.
package main

import (
	"strings"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "domain-zones", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

type config struct {
	Zones map[string][]string `json:"zones"`
}

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookServiceApply {
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
	zones := cfg.Zones[s.Project]
	var reasons []string
	for _, d := range s.Domains {
		if !inZones(strings.ToLower(strings.TrimSuffix(d, ".")), zones) {
			reasons = append(reasons, "domain "+d+" is outside project "+s.Project+"'s zones "+strings.Join(zones, ", "))
		}
	}
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func inZones(d string, zones []string) bool {
	for _, z := range zones {
		if d == z || strings.HasSuffix(d, "."+z) {
			return true
		}
	}
	return false
}

func main() {}
