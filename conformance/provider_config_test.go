package conformance

import (
	"context"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/provider"
)

// TestFactoryNeedsSamples: a factory-mode configuration without Samples is refused with an
// error saying that only a Binary takes them from Describe's examples.
func TestFactoryNeedsSamples(t *testing.T) {
	cfg := ProviderConfig{Factory: func(string) (provider.Provider, error) { return nil, nil }}
	_, err := CheckProvider(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "required with a Factory") || !strings.Contains(err.Error(), "Describe") {
		t.Fatalf("factory without Samples: %v; want an error saying they are required in factory mode", err)
	}
}
