package scripts_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// makeDryRun returns the commands `make -n -B TARGET` would run: every recipe
// of the target and its prerequisites, none of them executed.
func makeDryRun(t *testing.T, target string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-n", "-B", target)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n -B %s: %v\n%s", target, err, out)
	}
	return string(out)
}

// TestMakeRunBuildsOnlyWhatItRuns: make run and make build build no test
// tool (OPA from source, the AssemblyScript policy with npm); make run builds
// the binaries run-local.sh starts and not the test driver; make test and
// make bench install OPA.
func TestMakeRunBuildsOnlyWhatItRuns(t *testing.T) {
	run := makeDryRun(t, "run")
	for _, target := range []string{"run", "build"} {
		out := run
		if target == "build" {
			out = makeDryRun(t, "build")
		}
		for _, bad := range []string{"install-opa.sh", "require-digest-as/build.sh"} {
			if strings.Contains(out, bad) {
				t.Errorf("make %s runs %s:\n%s", target, bad, out)
			}
		}
	}
	for _, want := range []string{"./cmd/berthd", "./cmd/berth-agent", "./cmd/berth-plugin-gateway", "./cmd/berth-plugin-process", "run-local.sh"} {
		if !strings.Contains(run, want) {
			t.Errorf("make run does not build or run %s:\n%s", want, run)
		}
	}
	if strings.Contains(run, "./cmd/...") || strings.Contains(run, "berth-plugin-fake") {
		t.Errorf("make run builds more than it runs:\n%s", run)
	}
	for _, target := range []string{"test", "bench"} {
		if out := makeDryRun(t, target); !strings.Contains(out, "install-opa.sh") {
			t.Errorf("make %s does not install OPA:\n%s", target, out)
		}
	}
}
