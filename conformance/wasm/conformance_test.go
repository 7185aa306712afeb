package wasm

import (
	"context"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/wasmtest"
)

// TestSuiteFailsBrokenModules proves each check catches what it is for, with
// modules that break the ABI on purpose.
func TestSuiteFailsBrokenModules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		module []byte
		failed string // the first check expected to fail
	}{
		{"endless loop", wasmtest.Policy(wasmtest.PolicyOptions{Evaluate: wasmtest.Loop}), "sample"},
		{"answer changes on every call", wasmtest.Policy(wasmtest.PolicyOptions{Counter: true}), "determinism"},
		{"answers allow to anything", wasmtest.Policy(wasmtest.PolicyOptions{}), "malformed-input"},
		{"missing deallocate", wasmtest.Policy(wasmtest.PolicyOptions{NoDealloc: true}), "load"},
	}
	for _, c := range cases {
		results, err := Check(context.Background(), c.module, Options{Timeout: 100 * time.Millisecond, CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		first := ""
		for _, r := range results {
			if r.Err != nil {
				first = r.Name
				t.Logf("%s: %s: %v", c.name, r.Name, r.Err)
				break
			}
		}
		if first != c.failed {
			t.Errorf("%s: first failing check %q, want %q", c.name, first, c.failed)
		}
	}
}
