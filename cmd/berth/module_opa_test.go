package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestOPABundleModule: push --kind opa turns a bundle into a module whose
// name, version, entrypoint and data document reach the host.
func TestOPABundleModule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle, _ := wasmtest.BuildRegoFiles(t, map[string]string{
		"policy.rego": "package berth\n\nimport rego.v1\n\ndeny contains msg if {\n\tnot input.object.labels.team in data.teams\n\tmsg := sprintf(\"team %v is not one of %v\", [input.object.labels.team, data.teams])\n}\n\nallow if count(deny) == 0\n",
		"data.json":   `{"teams": ["shop", "infra"]}`,
	}, "berth/deny", "berth/allow")
	if _, err := opaBundleModule(bundle, "berth/nope", "", ""); err == nil || !strings.Contains(err.Error(), "berth/deny") {
		t.Fatalf("unknown entrypoint: %v, want an error listing the bundle's", err)
	}
	if _, err := opaBundleModule([]byte("not a bundle"), "", "", ""); err == nil {
		t.Fatal("a non-bundle was accepted")
	}
	mod, err := opaBundleModule(bundle, "berth/allow", "teams", "1.2.0")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	if md := m.Metadata(); md.Name != "teams" || md.Version != "1.2.0" || m.ABI() != "opa 1.x" {
		t.Fatalf("metadata %+v ABI %s", md, m.ABI())
	}
	for team, want := range map[string]abiwasm.Decision{"shop": abiwasm.Allow, "infra": abiwasm.Allow, "games": abiwasm.Deny} {
		obj, _ := json.Marshal(map[string]any{"labels": map[string]string{"team": team}})
		out, err := m.Evaluate(ctx, abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: obj})
		if err != nil {
			t.Fatal(err)
		}
		if out.Decision != want {
			t.Errorf("team %s: %+v, want %s (the data document decides)", team, out, want)
		}
	}
}
