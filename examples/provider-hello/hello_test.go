package main_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/sdk/provider"
)

func samples() [2]provider.Resource {
	return [2]provider.Resource{
		{Type: hello.ResourceType, ID: "world", Attributes: json.RawMessage(`{"message":"hello, world"}`)},
		{Type: hello.ResourceType, ID: "world", Attributes: json.RawMessage(`{"message":"goodbye","loud":true}`)},
	}
}

func stateArgs(dir string) []string { return []string{"--state-dir", dir} }

// TestConformance runs the suite in process (over real gRPC) and on the
// built binary.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("in-process", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Factory: func(dir string) (provider.Provider, error) { return hello.New(dir) },
			Samples: samples(),
		})
	})
	t.Run("binary", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Binary:  conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello"),
			Args:    stateArgs,
			Samples: samples(),
		})
	})
}

// TestBrokenTwinFails proves the suite catches a plugin that ignores
// fencing and re-applies a replayed call, and nothing else.
func TestBrokenTwinFails(t *testing.T) {
	t.Parallel()
	r, err := conformance.CheckProvider(context.Background(), conformance.ProviderConfig{
		Binary:  conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello/broken"),
		Args:    stateArgs,
		Samples: samples(),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"durable_state", "idempotent_apply", "stale_fencing_token"}
	if got := r.Failed(); !slices.Equal(got, want) {
		var b []byte
		for _, c := range r.Results {
			b = append(b, []byte(string(c.Status)+" "+c.Name+"\n")...)
		}
		t.Fatalf("failed cases = %v, want exactly %v\n%s", got, want, b)
	}
	if got := r.Skipped(); len(got) != 0 {
		t.Errorf("skipped cases = %v, want none", got)
	}
	// Each failure says once what the suite did, expected and got.
	for _, c := range r.Results {
		if c.Status != conformance.Failed {
			continue
		}
		for _, m := range c.Messages {
			lines := strings.Split(m, "\n")
			if len(lines) != 3 || !strings.HasPrefix(lines[0], "did:  ") || !strings.HasPrefix(lines[1], "want: ") || !strings.HasPrefix(lines[2], "got:  ") {
				t.Errorf("%s: failure %q is not did/want/got", c.Name, m)
			}
			if strings.Count(m, "not_found: ") > 1 {
				t.Errorf("%s: failure %q repeats itself", c.Name, m)
			}
		}
	}
}
