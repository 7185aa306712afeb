//go:build wasip1

// Command require-health-check is an admission policy: a service that serves
// traffic (it has domains) must declare an HTTP health check
// (health_check.path), so the gateway only sends requests to workloads that
// answer. Services without domains (workers) pass. It decides service.apply,
// and deploy for services stored before it was bound.
package main

import (
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 {
	return wasm.Metadata(abiwasm.KindPolicy, "require-health-check", "1.0.0")
}

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	var s abiwasm.Service
	switch in.Hook {
	case abiwasm.HookServiceApply:
		svc, _, err := wasm.ServiceApplyInput(in)
		if err != nil {
			return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
		}
		s = svc
	case abiwasm.HookDeploy:
		p, err := wasm.DeployInput(in)
		if err != nil {
			return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
		}
		s = p.Service
	default:
		return wasm.Allow()
	}
	if len(s.Domains) > 0 && s.HealthCheck.Path == "" {
		return wasm.Deny("service " + s.Project + "/" + s.Name + " serves " + s.Domains[0] + " but has no health_check.path")
	}
	return wasm.Allow()
}

func main() {}
