package wasmtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// OPAVersion is the OPA release tests and benchmarks compare against.
const OPAVersion = "v1.22.4"

var opaMu sync.Mutex

// OPA returns the path of the opa binary: $BERTH_BIN_DIR/opa or bin/opa in
// the repository, installed there with go install when missing (make build
// does the same through scripts/install-opa.sh).
func OPA(t testing.TB) string {
	t.Helper()
	opaMu.Lock()
	defer opaMu.Unlock()
	dir := os.Getenv("BERTH_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin")
	}
	bin := filepath.Join(dir, "opa")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command(filepath.Join(RepoRoot(t), "scripts", "install-opa.sh"), dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install opa %s: %v\n%s", OPAVersion, err, out)
	}
	return bin
}

// BuildRego compiles the Rego source with opa build -t wasm for the given
// entrypoints (such as "berth/deny") and returns the bundle (tar.gz) and
// its policy.wasm.
func BuildRego(t testing.TB, source string, entrypoints ...string) (bundle, wasm []byte) {
	t.Helper()
	return BuildRegoFiles(t, map[string]string{"policy.rego": source}, entrypoints...)
}

// BuildRegoFiles is BuildRego over several files (Rego sources and a
// data.json), all in one directory.
func BuildRegoFiles(t testing.TB, files map[string]string, entrypoints ...string) (bundle, wasm []byte) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"build", "-t", "wasm", "-o", filepath.Join(dir, "bundle.tar.gz")}
	for _, e := range entrypoints {
		args = append(args, "-e", e)
	}
	cmd := exec.Command(OPA(t), append(args, "-b", "src")...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("opa build: %v\n%s", err, out)
	}
	bundle, err := os.ReadFile(filepath.Join(dir, "bundle.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	return bundle, BundleFile(t, bundle, "/policy.wasm")
}

// BundleFile returns the file name (as in the archive, "/policy.wasm") of an
// OPA bundle.
func BundleFile(t testing.TB, bundle []byte, name string) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if "/"+strings.TrimPrefix(h.Name, "/") == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("bundle has no %s", name)
	return nil
}

// OPAEval runs opa eval of query over the Rego source and input (JSON) and
// returns the result set as opa prints it with --format json.
func OPAEval(t testing.TB, source, query string, input []byte) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.rego"), []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "input.json"), input, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(OPA(t), "eval", "--format", "json", "-d", "policy.rego", "-i", "input.json", query)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("opa eval %s: %v", query, err)
	}
	return out
}
