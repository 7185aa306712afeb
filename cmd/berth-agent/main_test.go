package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestEnrollCommand runs `berth-agent enroll` against a stand-in for berthd's
// POST /api/v1/nodes/enroll.
func TestEnrollCommand(t *testing.T) {
	t.Parallel()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var got client.EnrollRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/nodes/enroll" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(client.EnrollResponse{NodeID: "nod_cli", Credential: "brn_x",
			ClusterPublicKey: base64.StdEncoding.EncodeToString(pub)})
	}))
	defer srv.Close()
	dir := filepath.Join(t.TempDir(), "d")
	args := []string{"enroll", "--server", srv.URL, "--join-token", "brj_t", "--data-dir", dir,
		"--label", "a=1", "--label", "b=2", "--region", "eu", "--address", "10.0.0.5", "--hostname", "h1"}
	var out, errOut bytes.Buffer
	cmd := newRootCmd(&out, &errOut)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("enroll: %v\n%s", err, errOut.String())
	}
	if out.String() != "enrolled as nod_cli\n" {
		t.Fatalf("stdout = %q", out.String())
	}
	if got.JoinToken != "brj_t" || got.Labels["a"] != "1" || got.Labels["b"] != "2" || got.Region != "eu" || got.Address != "10.0.0.5" || got.Hostname != "h1" {
		t.Fatalf("request = %+v", got)
	}
	cmd = newRootCmd(&out, &errOut)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "already enrolled") ||
		!strings.Contains(err.Error(), "berth node remove nod_cli") || !strings.Contains(err.Error(), "fresh --data-dir") {
		t.Fatalf("second enroll = %v", err)
	}
	cmd = newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"enroll", "--server", srv.URL, "--join-token", "x", "--data-dir", t.TempDir(), "--label", "novalue"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("label without = accepted")
	}
}

// TestRunRefusesTheFakeDriverOutsideTests: `berth-agent run --driver fake` is a
// configuration error unless BERTH_ALLOW_TEST_DRIVERS=1, and the error names
// the variable; with it, the run gets past the driver check (to the
// enrollment check of an empty directory).
func TestRunRefusesTheFakeDriverOutsideTests(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	t.Setenv("BERTH_ALLOW_TEST_DRIVERS", "")
	cmd := newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"run", "--data-dir", dir, "--driver", "fake"})
	err := cmd.Execute()
	var ce configError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "BERTH_ALLOW_TEST_DRIVERS=1") {
		t.Fatalf("run --driver fake without BERTH_ALLOW_TEST_DRIVERS = %v, want a configuration error naming it", err)
	}
	t.Setenv("BERTH_ALLOW_TEST_DRIVERS", "1")
	cmd = newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"run", "--data-dir", dir, "--driver", "fake"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "not an enrolled node") {
		t.Fatalf("run --driver fake with BERTH_ALLOW_TEST_DRIVERS=1 = %v, want the enrollment check's error", err)
	}
}
