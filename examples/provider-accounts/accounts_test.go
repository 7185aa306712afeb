package main_test

import (
	"testing"

	"github.com/berthhq/berth/conformance"
)

// TestConformance runs the suite on the built binary, with the two example
// states the plugin declares in Describe.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.RunProvider(t, conformance.ProviderConfig{
		Binary: conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-accounts"),
		Args:   func(dir string) []string { return []string{"--state-dir", dir} },
	})
}
