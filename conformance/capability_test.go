package conformance

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/nodeplugins/fake"
	"github.com/berthhq/berth/sdk/provider"
	"github.com/berthhq/berth/sdk/runtime"
)

// forgetful is the hello provider advertising no durable_state.
type forgetful struct{ *hello.Provider }

func (f forgetful) Describe(ctx context.Context) (*provider.DescribeResponse, error) {
	d, err := f.Provider.Describe(ctx)
	if err != nil {
		return nil, err
	}
	d.Capabilities.DurableState = false
	return d, nil
}

func forgetfulConfig() ProviderConfig {
	return ProviderConfig{
		Factory: func(dir string) (provider.Provider, error) {
			p, err := hello.New(dir)
			if err != nil {
				return nil, err
			}
			return forgetful{p}, nil
		},
		Samples: [2]provider.Resource{
			{Type: hello.ResourceType, ID: "world", Attributes: json.RawMessage(`{"message":"hello, world"}`)},
			{Type: hello.ResourceType, ID: "world", Attributes: json.RawMessage(`{"message":"goodbye","loud":true}`)},
		},
	}
}

// TestSkipNamesTheCapability: RunProvider's report lists durable_state as
// skipped for the capability durable_state, which the plugin does not
// advertise, and the message names it too.
func TestSkipNamesTheCapability(t *testing.T) {
	var r *Report
	t.Run("suite", func(t *testing.T) { r = RunProvider(t, forgetfulConfig()) })
	if r == nil {
		t.Fatal("no report")
	}
	if got := r.SkippedForCapability(); len(got) != 1 || got["durable_state"] != "durable_state" {
		t.Fatalf("skipped for a capability = %v, want durable_state: durable_state", got)
	}
	for _, c := range r.Results {
		if c.Name == "durable_state" && (c.Status != Skipped || len(c.Messages) == 0 || !strings.Contains(c.Messages[0], "capability durable_state not advertised")) {
			t.Errorf("durable_state: %s %q", c.Status, c.Messages)
		}
		if c.Name != "durable_state" && c.Capability != "" {
			t.Errorf("%s names capability %q", c.Name, c.Capability)
		}
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "skipped for want of a capability the plugin does not advertise: durable_state (needs durable_state)") {
		t.Errorf("the text report does not list the skip with its capability:\n%s", b.String())
	}
}

// TestRequiredCapabilityFails: with durable_state required, the same plugin
// fails case durable_state (and nothing else), naming the capability; an
// unknown capability is refused before any case runs.
func TestRequiredCapabilityFails(t *testing.T) {
	cfg := forgetfulConfig()
	cfg.RequireCapabilities = []string{"durable_state"}
	r, err := CheckProvider(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Failed(); !slices.Equal(got, []string{"durable_state"}) {
		t.Fatalf("failed = %v, want [durable_state]", got)
	}
	for _, c := range r.Results {
		if c.Name == "durable_state" && (c.Capability != "durable_state" || !strings.Contains(strings.Join(c.Messages, "\n"), "capability durable_state is required")) {
			t.Errorf("durable_state: capability %q, messages %q", c.Capability, c.Messages)
		}
	}
	cfg.RequireCapabilities = []string{"teleport"}
	if _, err := CheckProvider(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), `"teleport"`) || !strings.Contains(err.Error(), "durable_state") {
		t.Errorf("an unknown capability: %v; want a refusal naming it and the known ones", err)
	}
}

// TestResetRunsBeforeEveryCase: Reset is called once before each case,
// with its name, and a failing Reset fails the case without running it.
func TestResetRunsBeforeEveryCase(t *testing.T) {
	cfg := forgetfulConfig()
	var mu sync.Mutex
	var seen []string
	cfg.Reset = func(_ context.Context, name string) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, name)
		if name == "deadline" {
			return context.DeadlineExceeded
		}
		return nil
	}
	r, err := CheckProvider(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := ProviderCaseNames(); !slices.Equal(seen, want) {
		t.Errorf("reset before %v, want before each of %v", seen, want)
	}
	if got := r.Failed(); !slices.Equal(got, []string{"deadline"}) {
		t.Errorf("failed = %v, want [deadline] (its reset failed)", got)
	}
	for _, c := range r.Results {
		if c.Name == "deadline" && !strings.Contains(strings.Join(c.Messages, "\n"), "the reset before case deadline") {
			t.Errorf("deadline: %q", c.Messages)
		}
	}
}

// TestRuntimeRequiredCapability: the fake driver advertises neither logs
// nor stats; with logs required, case logs fails naming it and case stats
// is skipped naming its capability.
func TestRuntimeRequiredCapability(t *testing.T) {
	r, err := CheckRuntimeDriver(t.Context(), RuntimeConfig{
		Factory:             func(dir string) (runtime.Driver, error) { return fake.New(fake.Config{StateDir: dir}) },
		RequireCapabilities: []string{"logs"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Failed(); !slices.Equal(got, []string{"logs"}) {
		t.Errorf("failed = %v, want [logs]", got)
	}
	if got := r.SkippedForCapability(); len(got) != 1 || got["stats"] != "stats" {
		t.Errorf("skipped for a capability = %v, want stats: stats", got)
	}
}
