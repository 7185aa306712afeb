package main_test

import (
	"context"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berthhq/berth/conformance"
)

// samples holds two states of one greeting; the first message has the
// surrounding white space the lying twin trims on Apply.
const samples = `[
  {"type": "hello.greeting", "id": "world", "attributes": {"message": "  hello, world  "}},
  {"type": "hello.greeting", "id": "world", "attributes": {"message": "goodbye", "loud": true}}
]`

// junitCases reads the case names and whether each failed from a JUnit report.
func junitCases(t *testing.T, path string) (failed, passed []string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var suite struct {
		Cases []struct {
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	}
	if err := xml.Unmarshal(raw, &suite); err != nil {
		t.Fatalf("JUnit report: %v\n%s", err, raw)
	}
	for _, c := range suite.Cases {
		switch {
		case c.Failure != nil:
			failed = append(failed, c.Name)
		case c.Skipped == nil:
			passed = append(passed, c.Name)
		}
	}
	return failed, passed
}

// runCLI runs `berth conformance plugin` on plugin as a real process and
// returns its exit error, its output and the JUnit case lists.
func runCLI(t *testing.T, berth, plugin, samplesPath string) (error, []byte, []string, []string) {
	t.Helper()
	junit := filepath.Join(t.TempDir(), "report.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, berth, "conformance", "plugin", plugin, "--kind", "provider",
		"--arg=--state-dir", "--arg={state}", "--samples", samplesPath, "--junit", junit)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("berth conformance plugin did not finish in 5 minutes:\n%s", out)
	}
	failed, passed := junitCases(t, junit)
	return err, out, failed, passed
}

// TestConformanceCLIFailsOnlyPlanEqualsApply runs `berth conformance plugin`
// (the CLI, as a process) on the lying twin and on provider-hello with the
// same samples: the twin fails exactly plan_equals_apply and passes every
// other case, and provider-hello passes them all, so the failure is the
// twin's one fault and not the samples.
func TestConformanceCLIFailsOnlyPlanEqualsApply(t *testing.T) {
	berth := conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth")
	lying := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-lying")
	hello := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello")
	path := filepath.Join(t.TempDir(), "samples.json")
	if err := os.WriteFile(path, []byte(samples), 0o600); err != nil {
		t.Fatal(err)
	}
	// The CLI's report starts with its launch case, then the provider cases.
	all := append([]string{"launch"}, conformance.ProviderCaseNames()...)

	err, out, failed, passed := runCLI(t, berth, lying, path)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("berth conformance plugin on the lying twin: %v; want exit status 1\n%s", err, out)
	}
	if want := []string{"plan_equals_apply"}; !slices.Equal(failed, want) {
		t.Errorf("lying twin: failed cases %v, want exactly %v\n%s", failed, want, out)
	}
	if want := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return n == "plan_equals_apply" }); !slices.Equal(passed, want) {
		t.Errorf("lying twin: passed cases %v, want %v\n%s", passed, want, out)
	}

	err, out, failed, passed = runCLI(t, berth, hello, path)
	if err != nil || len(failed) != 0 || !slices.Equal(passed, all) {
		t.Errorf("provider-hello with the same samples: %v, failed %v, passed %v; want all of %v to pass\n%s", err, failed, passed, all, out)
	}
}
