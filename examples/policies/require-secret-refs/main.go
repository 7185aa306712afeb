//go:build wasip1

// Command require-secret-refs is an admission policy on declared resources:
// a spec field that names a credential ({"fields": ["password", "token",
// "api_key"]} by default, at any depth) must hold a secret reference
// ("secret:NAME", docs/resources.md section 7), never the value itself.
package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/sdk/wasm"
)

//go:wasmexport berth_metadata
func metadata() uint64 { return wasm.Metadata(abiwasm.KindPolicy, "require-secret-refs", "1.0.0") }

//go:wasmexport policy_evaluate
func evaluate(ptr, size uint32) uint64 { return wasm.Policy(ptr, size, decide) }

type config struct {
	Fields []string `json:"fields"`
}

func decide(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
	if in.Hook != abiwasm.HookResourceApply {
		return wasm.Allow()
	}
	cfg, err := wasm.Config[config](in)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	if cfg.Fields == nil {
		cfg.Fields = []string{"password", "token", "api_key"}
	}
	r, _, err := wasm.Object[abiwasm.Resource](in.Object)
	if err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "%s", err)
	}
	var spec any
	if err := json.Unmarshal(r.Spec, &spec); err != nil {
		return wasm.Fail(abiwasm.ErrCodeBadInput, "spec: %s", err)
	}
	var reasons []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if s, ok := x[k].(string); ok && slices.Contains(cfg.Fields, k) && !strings.HasPrefix(s, "secret:") {
					reasons = append(reasons, fmt.Sprintf("%s %s/%s: %s/%s holds a value; refer to a secret (secret:NAME)", r.Type, r.Project, r.Name, path, k))
					continue
				}
				walk(path+"/"+k, x[k])
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s/%d", path, i), e)
			}
		}
	}
	walk("spec", spec)
	if len(reasons) > 0 {
		return wasm.Deny(reasons...)
	}
	return wasm.Allow()
}

func main() {}
