package main

import (
	"strings"
	"testing"

	"github.com/berthhq/berth/conformance"
)

// TestConformancePluginLaunchFailure runs `berth conformance plugin` on a
// provider that exits at start (provider-hello without its --state-dir) and
// expects the plugin's own message and exit status once, then one skip line
// per case, and none of go-plugin's guesses.
func TestConformancePluginLaunchFailure(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello")
	out, errOut, code := newCLI(t).run("", "conformance", "plugin", bin,
		"--samples", "../../examples/provider-hello/samples.json")
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	const said = "provider-hello: hello: a state directory is required"
	if n := strings.Count(out, said); n != 1 {
		t.Errorf("the plugin's message %q appears %d times, want once:\n%s", said, n, out)
	}
	if n := strings.Count(out, "exit status 1"); n != 1 {
		t.Errorf("the exit status appears %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "Unrecognized remote plugin message") || strings.Contains(out, "architecture") {
		t.Errorf("go-plugin's diagnosis is shown:\n%s", out)
	}
	if !strings.Contains(out, "FAIL launch") {
		t.Errorf("no failed launch case:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	skips := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "SKIP ") {
			continue
		}
		skips++
		if i+1 >= len(lines) || !strings.Contains(lines[i+1], "the plugin did not start") ||
			(i+2 < len(lines) && strings.HasPrefix(lines[i+2], "    ")) {
			t.Errorf("case %q is not skipped with exactly one line:\n%s", l, out)
		}
	}
	if want := len(conformance.ProviderCaseNames()); skips != want {
		t.Errorf("%d cases skipped, want %d (every case after launch):\n%s", skips, want, out)
	}
	if len(lines) > 3*len(conformance.ProviderCaseNames())+10 {
		t.Errorf("the report has %d lines; a failed launch should be short:\n%s", len(lines), out)
	}
}
