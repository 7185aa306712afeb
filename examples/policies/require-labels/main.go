//go:build wasip1

// Command require-labels is an admission policy: a service must carry every
// label the binding's configuration names ({"labels": ["team"]} by default).
package main

import (
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "require-labels", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

type config struct {
	Labels []string `json:"labels"`
}

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookServiceApply {
		return wasm.Allow()
	}
	cfg, err := wasm.Config[config](in)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	if cfg.Labels == nil {
		cfg.Labels = []string{"team"}
	}
	s, _, err := wasm.Object[abiwasm.Service](in.Object)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	var reasons []string
	for _, l := range cfg.Labels {
		if s.Labels[l] == "" {
			reasons = append(reasons, "service "+s.Project+"/"+s.Name+" has no label "+l)
		}
	}
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func main() {}
