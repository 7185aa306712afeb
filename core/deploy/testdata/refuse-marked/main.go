//go:build wasip1

// Command refuse-marked is a test admission policy: it denies a service whose image or bundle
// digest contains the text its binding's config names ({"mark": "..."}), and allows everything
// else. It ignores the input's cause, as a policy written before causes existed does.
package main

import (
	"encoding/json"
	"strings"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "refuse-marked", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookServiceApply {
		return wasm.Allow()
	}
	var cfg struct {
		Mark string `json:"mark"`
	}
	if len(in.Config) > 0 {
		if err := json.Unmarshal(in.Config, &cfg); err != nil {
			return wasm.Fail(abiwasm.ErrCodeBadInput, "config: %s", err)
		}
	}
	s, _, err := wasm.Object[abiwasm.Service](in.Object)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	if cfg.Mark == "" {
		return wasm.Allow()
	}
	for _, what := range []string{s.Image, s.BundleDigest} {
		if what != "" && strings.Contains(what, cfg.Mark) {
			return wasm.Deny("release " + what + " is marked refused")
		}
	}
	return wasm.Allow()
}

func main() {}
