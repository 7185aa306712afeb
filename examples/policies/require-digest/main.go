//go:build wasip1

// Command require-digest is an admission policy: it denies a service whose
// bundle or image is not named by its digest, so what runs is what was reviewed.
package main

import (
	"strings"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "require-digest", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	raw := in.Object
	if in.Hook == abiwasm.HookDeploy {
		p, _, err := wasm.Object[abiwasm.Placement](in.Object)
		if err != nil {
			return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
		}
		return check(p.Service)
	}
	if in.Hook != abiwasm.HookServiceApply {
		return wasm.Allow()
	}
	s, _, err := wasm.Object[abiwasm.Service](raw)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	return check(s)
}

func check(s abiwasm.Service) abiwasm.PolicyOutput {
	var reasons []string
	if s.Bundle != "" && !strings.HasPrefix(s.Bundle, "sha256:") {
		reasons = append(reasons, "bundle "+s.Bundle+" is not named by digest; use sha256:<hex>")
	}
	if s.Image != "" && !strings.Contains(s.Image, "@sha256:") {
		reasons = append(reasons, "image "+s.Image+" is not pinned by digest; use name@sha256:<hex>")
	}
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func main() {}
