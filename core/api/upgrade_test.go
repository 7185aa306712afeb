package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/releases"
)

// TestUpgradeRefusals: every bad upgrade request is refused with its code
// before the node is touched (this fixture reaches no node sessions, so a
// request that got as far as the node would answer unavailable).
func TestUpgradeRefusals(t *testing.T) {
	t.Parallel()
	rel := t.TempDir()
	platform := goruntime.GOOS + "-" + goruntime.GOARCH
	var sum040 string
	for _, v := range []string{"0.3.0", "0.4.0", "0.4.2", "0.5.0"} {
		content := []byte("agent " + v)
		if err := os.WriteFile(filepath.Join(rel, "berth-agent-"+v+"-"+platform), content, 0o755); err != nil {
			t.Fatal(err)
		}
		if v == "0.4.0" {
			h := sha256.Sum256(content)
			sum040 = hex.EncodeToString(h[:])
		}
	}
	f := newFixtureWith(t, func(c *Config) { c.Releases = releases.New(rel); c.CoreVersion = "0.4.0" })
	ctx := context.Background()
	tok, _, err := f.reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	npub, _, _ := ed25519.GenerateKey(rand.Reader)
	n, _, err := f.reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(npub), Hostname: "n1", Address: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.SessionStarted(ctx, n.ID, "ses_test", "0.4.0", nil, "nftables"); err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/nodes/" + n.ID + "/upgrade"
	for _, tc := range []struct {
		name   string
		path   string
		body   any
		status int
		code   string
	}{
		{"unknown node", "/api/v1/nodes/nod_missing/upgrade", map[string]any{}, 404, "node_not_found"},
		{"negative timeout", path, map[string]any{"timeout_s": -1}, 422, "validation_failed"},
		{"timeout too long", path, map[string]any{"timeout_s": 601}, 422, "validation_failed"},
		{"not a version", path, map[string]any{"version": "latest"}, 422, "validation_failed"},
		{"another program", path, map[string]any{"program": "berth-relay"}, 422, "validation_failed"},
		{"a driver the node does not run", path, map[string]any{"program": "berth-plugin-containerd"}, 422, "validation_failed"},
		{"a network plugin the node does not run", path, map[string]any{"program": "berth-plugin-bridge"}, 422, "validation_failed"},
		{"the node's network plugin reaches for the node", path, map[string]any{"program": "berth-plugin-nftables", "version": "0.4.2"}, 503, "unavailable"},
		{"unknown field", path, map[string]any{"versoin": "0.4.2"}, 400, "bad_request"},
		{"downgrade", path, map[string]any{"version": "0.3.0"}, 409, "agent_downgrade"},
		{"ahead of the core", path, map[string]any{"version": "0.5.0"}, 409, "agent_version_skew"},
		{"newest served is ahead of the core", path, map[string]any{}, 409, "agent_version_skew"},
		{"no such release", path, map[string]any{"version": "0.4.1"}, 404, "release_not_found"},
		{"forced downgrade reaches for the node", path, map[string]any{"version": "0.3.0", "force": true}, 503, "unavailable"},
		{"upgrade reaches for the node", path, map[string]any{"version": "0.4.2"}, 503, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := f.json(http.MethodPost, tc.path, tc.body)
			if status != tc.status || out["code"] != tc.code {
				t.Fatalf("got %d %v, want %d %s", status, out, tc.status, tc.code)
			}
		})
	}
	status, out := f.json(http.MethodPost, path, map[string]any{"version": "0.4.0"})
	if status != 200 || out["state"] != "unchanged" {
		t.Fatalf("upgrade to the running version: %d %v", status, out)
	}

	// The release endpoints.
	status, out = f.do(req{method: http.MethodGet, path: "/api/v1/releases", token: f.admin})
	if items, _ := out["items"].([]any); status != 200 || len(items) != 4 {
		t.Fatalf("GET /releases: %d %v", status, out)
	}
	for _, tc := range []struct {
		sum    string
		status int
		code   string
	}{
		{"ABC", 400, "bad_request"},
		{"0000000000000000000000000000000000000000000000000000000000000000", 404, "release_not_found"},
	} {
		if status, out := f.do(req{method: http.MethodGet, path: "/api/v1/releases/" + tc.sum, token: f.admin}); status != tc.status || out["code"] != tc.code {
			t.Fatalf("GET /releases/%s: %d %v", tc.sum, status, out)
		}
	}
	hr, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1/releases/"+sum040, nil)
	hr.Header.Set("Authorization", "Bearer "+f.admin)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "agent 0.4.0" {
		t.Fatalf("GET /releases/{sum}: %d %q", resp.StatusCode, body)
	}
}

// TestUpgradeProgram: berth-plugin-<name> is an upgradable program of a node
// only when <name> is a runtime driver or a network plugin its hello
// reported (docs/upgrades.md section 3.5); anything else is refused with
// validation_failed.
func TestUpgradeProgram(t *testing.T) {
	t.Parallel()
	n := &nodes.Node{ID: "nod_1", Drivers: []string{"containerd"}, Networks: []string{"nftables"}}
	bare := &nodes.Node{ID: "nod_2", Drivers: []string{"process"}}
	for _, tc := range []struct {
		node    *nodes.Node
		program string
		kind    programKind
		name    string
	}{
		{n, "berth-agent", programAgent, ""},
		{n, "berth-plugin-containerd", programDriver, "containerd"},
		{n, "berth-plugin-nftables", programNetwork, "nftables"},
		{bare, "berth-plugin-nftables", "", ""},
		{bare, "berth-plugin-process", programDriver, "process"},
		{n, "berth-plugin-process", "", ""},
		{n, "nftables", "", ""},
		{n, "berth-plugin-", "", ""},
		{n, "berth-relay", "", ""},
	} {
		kind, name, err := upgradeProgram(tc.node, tc.program)
		if tc.kind == "" {
			if abierrors.CodeOf(err) != abierrors.ValidationFailed {
				t.Errorf("%s on %v: %q %q %v, want validation_failed", tc.program, tc.node.Networks, kind, name, err)
			}
			continue
		}
		if err != nil || kind != tc.kind || name != tc.name {
			t.Errorf("%s on %v: %q %q %v, want %q %q", tc.program, tc.node.Networks, kind, name, err, tc.kind, tc.name)
		}
	}
}
