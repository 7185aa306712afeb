package main

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestLoginPinsFingerprint: against a self-signed server, login shows the
// fingerprint and stops without one, pins it when given, and later commands
// refuse another certificate (docs/node-protocol.md section 2.2).
func TestLoginPinsFingerprint(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{t: t, token: "brt_good", services: map[string]client.Service{}, bundles: map[string][]byte{}}
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	pin := client.Fingerprint(srv.Certificate().Raw)
	c := newCLI(t)
	cfg := filepath.Join(c.home, ".config", "berth", "config.json")

	_, errOut, code := c.run("brt_good\n", "login", "--server", srv.URL, "--token-stdin")
	if code != 1 || !strings.Contains(errOut, pin) || !strings.Contains(errOut, "--fingerprint") {
		t.Fatalf("login without a pin: exit %d stderr %q; want the fingerprint shown", code, errOut)
	}
	if _, err := os.Stat(cfg); !os.IsNotExist(err) {
		t.Fatalf("config written without a pin: %v", err)
	}

	out := c.ok("brt_good\n", "login", "--server", srv.URL, "--token-stdin", "--fingerprint", strings.ToUpper(strings.TrimPrefix(pin, "sha256:")))
	if !strings.Contains(out, pin+" pinned") {
		t.Errorf("login output %q does not show the pin", out)
	}
	b, _ := os.ReadFile(cfg)
	var fc fileConfig
	if err := json.Unmarshal(b, &fc); err != nil {
		t.Fatal(err)
	}
	if fc.Fingerprint != pin {
		t.Errorf("saved fingerprint %q, want %q", fc.Fingerprint, pin)
	}
	c.ok("", "get", "services")

	// BERTH_FINGERPRINT overrides the file; a wrong one is refused.
	c.env["BERTH_FINGERPRINT"] = "sha256:" + strings.Repeat("00", 32)
	_, errOut, code = c.run("", "get", "services")
	if code != 1 || !strings.Contains(errOut, "pinned fingerprint") {
		t.Errorf("wrong pin: exit %d stderr %q", code, errOut)
	}
}
