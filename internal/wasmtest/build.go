// Package wasmtest builds and assembles WebAssembly modules for tests: Go
// guests built once per source and cached in the temp directory, and small
// hand-assembled modules that break the ABI on purpose.
package wasmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// GoBuildFlags are the flags every Go guest is built with, here and in the
// Makefile (make generate): reproducible bytes for the same source and Go.
var goBuildFlags = []string{"build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}

// RepoRoot returns the repository's root directory (where the go.mod of
// module github.com/berthhq/berth is), also from a nested module such as
// bench/opa.
func RepoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	dir := filepath.Dir(strings.TrimSpace(string(out)))
	for range 8 {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(mod), "module github.com/berthhq/berth\n") {
			return dir
		}
		dir = filepath.Dir(dir)
	}
	t.Fatalf("no go.mod of github.com/berthhq/berth above %s", strings.TrimSpace(string(out)))
	return ""
}

// BuildGo builds the Go guest in pkgDir (relative to the repository root, for
// example "examples/routes") for wasip1 and returns its bytes. Builds are
// cached in $TMPDIR/berth-wasm-build by a hash of the sources they depend on
// and the Go version, so each test binary pays for a build only once.
func BuildGo(t testing.TB, pkgDir string) []byte {
	t.Helper()
	root := RepoRoot(t)
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version(), goBuildFlags)
	for _, dir := range []string{pkgDir, "sdk/wasm", "abi/wasm", "abi/routes"} {
		hashDir(t, h, filepath.Join(root, dir))
	}
	cacheDir := filepath.Join(os.TempDir(), "berth-wasm-build")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(cacheDir, strings.ReplaceAll(pkgDir, "/", "_")+"-"+hex.EncodeToString(h.Sum(nil))[:16]+".wasm")
	if b, err := os.ReadFile(out); err == nil {
		return b
	}
	// A name of its own per call: parallel tests of one binary may build
	// the same module at once, and the rename makes whichever wins visible.
	f, err := os.CreateTemp(cacheDir, filepath.Base(out)+".*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	tmp := f.Name()
	_ = f.Close()
	defer os.Remove(tmp) // gone after the rename; left by a failed build
	cmd := exec.Command("go", append(goBuildFlags, "-o", tmp, "./"+pkgDir)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s for wasip1: %v\n%s", pkgDir, err, msg)
	}
	if err := os.Rename(tmp, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hashDir(t testing.TB, h interface{ Write([]byte) (int, error) }, dir string) {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("hash %s: %v", dir, err)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
}

// CacheDir returns a wazero compilation cache directory shared by the test
// binaries of this machine, so a Go guest is compiled to machine code once.
func CacheDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(os.TempDir(), "berth-wazero-cache")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}
