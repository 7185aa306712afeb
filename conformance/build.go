package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildPlugin builds the main package at importPath into a temporary
// directory (removed after the test) and returns the binary's path, for a
// vendor's test that runs the suite on the real binary.
func BuildPlugin(tb testing.TB, importPath string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), filepath.Base(importPath))
	cmd := exec.Command("go", "build", "-o", out, importPath)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("build %s: %v", importPath, err)
	}
	return out
}
