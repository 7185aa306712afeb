package agent

import (
	"context"
	"testing"
)

// TestSourceAddress: the address toward a loopback berthd is the loopback one, with or
// without a port; a URL without a host and a name that does not resolve are refused.
func TestSourceAddress(t *testing.T) {
	for _, server := range []string{"https://127.0.0.1:8443", "https://127.0.0.1"} {
		got, err := SourceAddress(context.Background(), server)
		if err != nil || got != "127.0.0.1" {
			t.Errorf("SourceAddress(%q) = %q, %v; want 127.0.0.1", server, got, err)
		}
	}
	for _, server := range []string{"not a url", "https://", "https://no-such-host.invalid"} {
		if got, err := SourceAddress(context.Background(), server); err == nil {
			t.Errorf("SourceAddress(%q) = %q, want an error", server, got)
		}
	}
}
