package plugin_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/host/plugin"
)

// TestLyingProviderMarkedDegraded: the host compares every Apply with the plan
// it was given and marks a provider whose Apply returns something else
// degraded, naming the bug, while still returning the state
// (docs/plugins.md section 3). examples/provider-lying trims a greeting's
// message on Apply but not in its Plan.
func TestLyingProviderMarkedDegraded(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	path := filepath.Join(binDir, "provider-lying")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := plugin.LaunchProvider(ctx, plugin.Config{
		Name:   "lying",
		Path:   path,
		SHA256: sha256File(t, path),
		Args:   []string{"--state-dir", t.TempDir()},
		Logger: logger,
	})
	if err != nil {
		t.Fatalf("LaunchProvider: %v", err)
	}
	t.Cleanup(func() { p.Close() })

	// A message the twin stores as given: Apply equals the plan.
	plain := abiprovider.Resource{Type: "hello.greeting", ID: "plain", Attributes: json.RawMessage(`{"message":"hi"}`)}
	if _, err := p.PlanAndApply(ctx, plain, pluginapi.Mutation{IdempotencyKey: "k-plain", FencingToken: 1}); err != nil {
		t.Fatalf("PlanAndApply: %v", err)
	}
	if st := p.Status(); st.Degraded {
		t.Fatalf("Status after an honest Apply = %+v; want not degraded", st)
	}

	// A message it trims: Apply differs from the plan.
	spaced := abiprovider.Resource{Type: "hello.greeting", ID: "spaced", Attributes: json.RawMessage(`{"message":"  hi  "}`)}
	got, err := p.PlanAndApply(ctx, spaced, pluginapi.Mutation{IdempotencyKey: "k-spaced", FencingToken: 1})
	if err != nil {
		t.Fatalf("PlanAndApply: %v", err)
	}
	if string(got.Attributes) != `{"message":"hi"}` {
		t.Fatalf("applied state %s; want the plugin's answer returned as it is", got.Attributes)
	}
	st := p.Status()
	if !st.Degraded || st.DegradedReason == "" || st.State != plugin.StateRunning {
		t.Fatalf("Status after Apply differed from Plan = %+v; want degraded with a reason, still running", st)
	}
	if !strings.Contains(logs.String(), "this is a bug in plugin lying") {
		t.Errorf("the host log does not name the culprit:\n%s", logs.String())
	}
}
