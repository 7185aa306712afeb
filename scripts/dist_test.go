// Package scripts_test checks the release build script: the same sources give
// the same bytes, with no trace of the build machine's paths.
package scripts_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestDistIsReproducible runs scripts/dist.sh twice for one small binary on the
// host platform and compares SHA256SUMS; the binary records its build flags and
// holds no absolute path of the checkout.
func TestDistIsReproducible(t *testing.T) {
	root := moduleRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	platform := "linux-" + runtime.GOARCH
	var sums [2][]byte
	var outs [2]string
	for i := range outs {
		outs[i] = filepath.Join(t.TempDir(), "dist")
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "dist.sh"))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "DIST_OUT="+outs[i], "DIST_PLATFORMS=linux/"+runtime.GOARCH, "DIST_PKGS=./examples/apps/hello", "VERSION=9.8.7-test")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("dist.sh: %v\n%s", err, out)
		}
		var err error
		if sums[i], err = os.ReadFile(filepath.Join(outs[i], "SHA256SUMS")); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(sums[0], sums[1]) {
		t.Fatalf("two builds of the same sources differ:\n%s\n%s", sums[0], sums[1])
	}
	for _, want := range []string{"berth-9.8.7-test-" + platform + ".tar.gz", "berth-9.8.7-test-" + platform + "/hello"} {
		if !bytes.Contains(sums[0], []byte("  "+want+"\n")) {
			t.Errorf("SHA256SUMS lacks %s:\n%s", want, sums[0])
		}
	}
	bin := filepath.Join(outs[0], "berth-9.8.7-test-"+platform, "hello")
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(root)) {
		t.Errorf("the binary holds the checkout path %s", root)
	}
	info, err := exec.CommandContext(ctx, "go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	// (The go command records no -ldflags in the build info of a -trimpath build.)
	for _, want := range []string{"-trimpath=true", "CGO_ENABLED=0"} {
		if !bytes.Contains(info, []byte(want)) {
			t.Errorf("build info lacks %q:\n%s", want, info)
		}
	}
	check := exec.CommandContext(ctx, "sha256sum", "-c", "SHA256SUMS")
	check.Dir = outs[0]
	if sum, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, sum)
	}
}

// TestDistShipsOnlyWhatOperatorsRun: the release holds berthd, the CLI, the
// agent and the plugins operators run, and neither the test driver nor the
// examples (docs/operating.md section 8).
func TestDistShipsOnlyWhatOperatorsRun(t *testing.T) {
	root := moduleRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "dist.sh"))
	cmd.Dir = root
	// (DIST_PLATFORMS and DIST_OUT keep a dist.sh without DIST_LIST from building anything.)
	cmd.Env = append(os.Environ(), "DIST_LIST=1", "DIST_PKGS=", "DIST_PLATFORMS= ", "DIST_OUT="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dist.sh: %v\n%s", err, out)
	}
	pkgs := strings.Fields(string(out))
	for _, want := range []string{"./cmd/berthd", "./cmd/berth", "./cmd/berth-agent", "./cmd/berth-plugin-gateway",
		"./cmd/berth-plugin-process", "./cmd/berth-plugin-containerd", "./cmd/berth-plugin-nftables",
		"./cmd/berth-plugin-corestore", "./cmd/berth-plugin-dns", "./cmd/berth-plugin-caddy", "./cmd/berth-plugin-hetzner",
		"./cmd/berth-relay"} {
		if !slices.Contains(pkgs, want) {
			t.Errorf("the release lacks %s: %v", want, pkgs)
		}
	}
	for _, p := range pkgs {
		if strings.Contains(p, "fake") || strings.Contains(p, "examples") || strings.Contains(p, "...") {
			t.Errorf("the release ships %s: %v", p, pkgs)
		}
	}
}
