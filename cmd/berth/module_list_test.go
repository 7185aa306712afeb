package main

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestModuleListNoTrunc: module list shows 12-digit digests, and --no-trunc the full ones.
func TestModuleListNoTrunc(t *testing.T) {
	t.Parallel()
	full := "sha256:" + strings.Repeat("7d26931d", 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+r.URL.Path != "GET /api/v1/modules" {
			problem(w, 404, "not_found", r.URL.Path)
			return
		}
		answer(w, 200, client.List[client.Module]{Items: []client.Module{{Digest: full, Kind: "policy", Name: "cap-replicas",
			Version: "1", ABI: "1.0", Size: 1024, CreatedAt: testNow()}}})
	}))
	t.Cleanup(srv.Close)
	c := newCLI(t)
	base := []string{"--server", srv.URL, "--token", "brt_x"}
	if out := c.ok("", append(base, "module", "list")...); strings.Contains(out, full) || !strings.Contains(out, full[:len("sha256:")+12]+" ") {
		t.Errorf("module list:\n%s\nwant the 12-digit digest only", out)
	}
	if out := c.ok("", append(base, "module", "list", "--no-trunc")...); !strings.Contains(out, full) {
		t.Errorf("module list --no-trunc:\n%s\nwant the full digest %s", out, full)
	}
}

// TestModulePushGzipHintsOPA: a gzip file pushed without --kind opa is refused before any upload
// with a hint to use --kind opa.
func TestModulePushGzipHintsOPA(t *testing.T) {
	t.Parallel()
	var uploads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uploads.Add(1)
		problem(w, 422, "module_invalid", "malformed WebAssembly module: no WebAssembly header")
	}))
	t.Cleanup(srv.Close)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write([]byte("not really a bundle"))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bundle.tar.gz")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	_, errOut, code := c.run("", "--server", srv.URL, "--token", "brt_x", "module", "push", file)
	if code == 0 || !strings.Contains(errOut, "OPA bundle") || !strings.Contains(errOut, "--kind opa") {
		t.Errorf("module push of a gzip file: exit %d, stderr %q; want a refusal pointing at --kind opa", code, errOut)
	}
	if n := uploads.Load(); n != 0 {
		t.Errorf("the server got %d requests; want the refusal before any upload", n)
	}
}

// TestPolicyTestWithoutBuiltModule: policy test of an example without --module, whose
// policy.wasm was never built, says how to build and pass it.
func TestPolicyTestWithoutBuiltModule(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "require-health-check")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), []byte("cases: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	_, errOut, code := c.run("", "policy", "test", dir)
	for _, want := range []string{"make wasm", "build/wasm/require-health-check.wasm", "--module"} {
		if code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("policy test without a built module: exit %d, stderr %q; want it to mention %q", code, errOut, want)
		}
	}
}
