package main

import (
	"fmt"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/wasmtest"
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

// TestConformancePluginConfigAndExamples runs `berth conformance plugin
// --config` on provider-hello without --samples: the suite takes the samples
// from the plugin's Describe, says so, and passes; a configuration the
// plugin's Configure makes too strict for those samples fails, which shows
// the file reaches ValidateConfig and Configure.
func TestConformancePluginConfigAndExamples(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello")
	dir := t.TempDir()
	junit := filepath.Join(dir, "report.xml")
	out, errOut, code := newCLI(t).run("", "conformance", "plugin", bin, "--arg=--state-dir", "--arg={state}",
		"--config", "../../examples/provider-hello/config.json", "--junit", junit)
	if code != 0 {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "no samples were given: the suite uses the first two examples Describe declares for hello.greeting (id world)") {
		t.Errorf("the report does not say where the samples came from:\n%s", out)
	}
	if !strings.Contains(out, fmt.Sprintf("%d passed, 0 failed, 0 skipped", len(conformance.ProviderCaseNames())+1)) {
		t.Errorf("not every case passed:\n%s", out)
	}
	if raw, err := os.ReadFile(junit); err != nil || !strings.Contains(string(raw), `<testcase name="validate_config"`) {
		t.Errorf("JUnit report: %v\n%s", err, raw)
	}

	strict := filepath.Join(dir, "strict.json")
	if err := os.WriteFile(strict, []byte(`{"max_message_bytes": 5}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, code = newCLI(t).run("", "conformance", "plugin", bin, "--arg", "--state-dir", "--arg", "{state}", "--config", strict)
	if code != 1 || !strings.Contains(out, "message: want 1 to 5 bytes") {
		t.Errorf("with max_message_bytes 5: exit %d, want 1 and the plugin's refusal of the samples:\n%s", code, out)
	}

	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"colour": "red"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, code = newCLI(t).run("", "conformance", "plugin", bin, "--arg=--state-dir", "--arg={state}", "--config", bad)
	if code != 1 || !strings.Contains(out, `unknown field \"colour\"`) && !strings.Contains(out, `unknown field "colour"`) {
		t.Errorf("with an unknown config field: exit %d, want 1 and the plugin's problem:\n%s", code, out)
	}
}

// TestConformancePluginBadConfigFailsOnce runs `berth conformance plugin
// --config` on provider-hello with a configuration its ValidateConfig
// refuses: case launch fails once, saying the configuration was refused and
// the plugin's reason, and every other case is skipped (not run) with one
// line naming the configuration, in the text and the JUnit report alike.
func TestConformancePluginBadConfigFailsOnce(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"colour": "red"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(dir, "report.xml")
	out, errOut, code := newCLI(t).run("", "conformance", "plugin", bin, "--arg=--state-dir", "--arg={state}",
		"--config", bad, "--junit", junit)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if n := strings.Count(out, "FAIL "); n != 1 || !strings.Contains(out, "FAIL launch") {
		t.Errorf("%d failed cases, want only launch:\n%s", n, out)
	}
	if n := strings.Count(out, `unknown field`); n != 1 {
		t.Errorf("the plugin's problem with the configuration appears %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "the plugin refused the configuration") {
		t.Errorf("the failure does not say the configuration was refused:\n%s", out)
	}
	cases := len(conformance.ProviderCaseNames())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	skips := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "SKIP ") {
			continue
		}
		skips++
		if i+1 >= len(lines) || !strings.Contains(lines[i+1], "not run: the plugin refused its configuration") ||
			(i+2 < len(lines) && strings.HasPrefix(lines[i+2], "    ")) {
			t.Errorf("case %q is not skipped with exactly one line naming the configuration:\n%s", l, out)
		}
	}
	if skips != cases || !strings.Contains(out, fmt.Sprintf("0 passed, 1 failed, %d skipped", cases)) {
		t.Errorf("%d cases skipped, want %d and a summary saying so:\n%s", skips, cases, out)
	}
	raw, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), fmt.Sprintf(`failures="1" skipped="%d"`, cases)) {
		t.Errorf("JUnit report does not count one failure and %d skipped:\n%s", cases, raw)
	}
}

// TestPolicyTestUnknownField: `berth policy test` fails a case whose input
// holds a field the server never sends, naming the field and its path, even
// though the module would have allowed it.
func TestPolicyTestUnknownField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "policy.wasm"), wasmtest.Policy(wasmtest.PolicyOptions{Name: "allow-all"}), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := `cases:
  - name: known fields
    input: {hook: service.apply, object: {name: web, health_check: {path: /healthz}}}
    expect: {decision: allow}
  - name: a misspelt field
    input: {hook: service.apply, object: {name: web, health: {path: /healthz}}}
    expect: {decision: allow}
`
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := newCLI(t).run("", "policy", "test", dir)
	if code != 1 || !strings.Contains(out, "ok    known fields") ||
		!strings.Contains(out, `FAIL  a misspelt field: input: the input does not follow schema/policy_input.json `+abiwasm.InputSchemaVersion+`: at /object: unknown field "health"`) {
		t.Errorf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestConformancePluginRunsTheGatewayCases: with {listen} in an argument,
// `berth conformance plugin` runs the gateway cases after the provider suite
// on the built-in gateway, and they pass; without it they do not run.
func TestConformancePluginRunsTheGatewayCases(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-gateway")
	out := newCLI(t).ok("", "conformance", "plugin", bin, "--arg=--listen", "--arg={listen}", "--arg=--state-dir", "--arg={state}")
	for _, name := range append([]string{"gateway_launch"}, conformance.GatewayCaseNames()...) {
		if !strings.Contains(out, "PASS "+name+" ") {
			t.Errorf("no passing case %s:\n%s", name, out)
		}
	}
	if !strings.Contains(out, "provider and gateway conformance") || !strings.Contains(out, "PASS durable_state ") {
		t.Errorf("the provider suite did not run too:\n%s", out)
	}
	out = newCLI(t).ok("", "conformance", "plugin", bin, "--arg=--listen", "--arg=127.0.0.1:0")
	if strings.Contains(out, "gateway_") {
		t.Errorf("gateway cases ran without {listen}:\n%s", out)
	}
}

// TestConformancePluginDNSAgainstKnot runs `berth conformance plugin` on the
// built DNS plugin against a real knotd: the records (and the fences kept
// beside them) live on the server, so without a reset a case sees the
// records of the one before and fails; with a --reset-command that purges
// the zone and loads it again from its file, every case passes. Without a
// state directory the plugin does not advertise durable_state: the case is
// listed as skipped for that capability, and --require-capability
// durable_state makes it fail.
func TestConformancePluginDNSAgainstKnot(t *testing.T) {
	t.Parallel()
	knotd := knottest.Binary(t)
	k := knottest.Start(t, "example.test")
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-dns")
	dir := t.TempDir()
	config := filepath.Join(dir, "dns.json")
	cfg := fmt.Sprintf(`{"server": %q, "zones": ["example.test"], "tsig_key_name": %q, "tsig_secret": %q}`, k.Addr, k.Key.Name, k.Key.Secret)
	samples := filepath.Join(dir, "records.json")
	smp := `[{"type": "dns.record", "id": "example.test/conf/A", "attributes": {"values": ["192.0.2.1"], "ttl": 60}},
		{"type": "dns.record", "id": "example.test/conf/A", "attributes": {"values": ["192.0.2.1", "192.0.2.2"], "ttl": 60}}]`
	for f, body := range map[string]string{config: cfg, samples: smp} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	knotc := filepath.Join(filepath.Dir(knotd), "knotc")
	conf := filepath.Join(k.Dir, "knot.conf")
	reset := fmt.Sprintf("%[1]s -c %[2]s -b zone-purge -f +expire +journal +timers example.test && %[1]s -c %[2]s -b zone-reload example.test", knotc, conf)
	base := []string{"conformance", "plugin", bin, "--config", config, "--samples", samples}
	stateArgs := []string{"--arg=--state-dir", "--arg={state}"}
	cases := len(conformance.ProviderCaseNames()) + 1 // and launch

	out, errOut, code := newCLI(t).run("", append(slices.Clone(base), stateArgs...)...)
	if code != 1 || !strings.Contains(out, "FAIL ") {
		t.Errorf("without a reset: exit %d, want 1 and failed cases (each case sees the records of the one before):\n%s\n%s", code, out, errOut)
	}

	out, errOut, code = newCLI(t).run("", append(append(slices.Clone(base), stateArgs...), "--reset-command", reset, "--require-capability", "durable_state")...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d passed, 0 failed, 0 skipped", cases)) {
		t.Fatalf("with the reset command: exit %d, want every case to pass:\n%s\n%s", code, out, errOut)
	}

	out, errOut, code = newCLI(t).run("", append(slices.Clone(base), "--reset-command", reset)...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d passed, 0 failed, 1 skipped", cases-1)) ||
		!strings.Contains(out, "capability durable_state not advertised") ||
		!strings.Contains(out, "skipped for want of a capability the plugin does not advertise: durable_state (needs durable_state)") {
		t.Errorf("without a state directory: exit %d, want a pass with durable_state listed as skipped for its capability:\n%s\n%s", code, out, errOut)
	}

	out, errOut, code = newCLI(t).run("", append(slices.Clone(base), "--reset-command", reset, "--require-capability", "durable_state")...)
	if code != 1 || !strings.Contains(out, "FAIL durable_state ") || strings.Count(out, "FAIL ") != 1 ||
		!strings.Contains(out, "capability durable_state is required") {
		t.Errorf("without a state directory, durable_state required: exit %d, want 1 and only durable_state failing:\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "durable_state") {
		t.Errorf("the error does not name the failed case: %q", errOut)
	}
}

// TestConformancePluginRequireCapabilityChecksTheName: a capability no case
// of the suite checks is refused before any plugin starts, naming the ones
// there are; --reset-command is refused for a runtime driver.
func TestConformancePluginRequireCapabilityChecksTheName(t *testing.T) {
	t.Parallel()
	_, errOut, code := newCLI(t).run("", "conformance", "plugin", "/nonexistent", "--require-capability", "teleport")
	if code != 1 || !strings.Contains(errOut, `"teleport"`) || !strings.Contains(errOut, "durable_state") {
		t.Errorf("exit %d, stderr %q; want a refusal naming teleport and durable_state", code, errOut)
	}
	_, errOut, code = newCLI(t).run("", "conformance", "plugin", "/nonexistent", "--kind", "runtime", "--reset-command", "true")
	if code != 1 || !strings.Contains(errOut, "--reset-command is for providers") {
		t.Errorf("exit %d, stderr %q; want --reset-command refused for a runtime driver", code, errOut)
	}
}

// TestConformancePluginResetCommand: the reset command runs before every
// case, launch first, with the case's name in BERTH_CONFORMANCE_CASE; a
// reset that fails before launch fails launch with its output and every
// other case is skipped naming the reset.
func TestConformancePluginResetCommand(t *testing.T) {
	t.Parallel()
	bin := conformance.BuildPlugin(t, "github.com/berthhq/berth/examples/provider-hello")
	log := filepath.Join(t.TempDir(), "resets")
	newCLI(t).ok("", "conformance", "plugin", bin, "--arg=--state-dir", "--arg={state}",
		"--reset-command", `echo "$BERTH_CONFORMANCE_CASE" >> `+log)
	raw, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(raw)), append([]string{"launch"}, conformance.ProviderCaseNames()...); !slices.Equal(got, want) {
		t.Errorf("resets before %v, want before each of %v", got, want)
	}

	out, _, code := newCLI(t).run("", "conformance", "plugin", bin, "--arg=--state-dir", "--arg={state}",
		"--reset-command", "echo the zone is locked >&2; exit 3")
	if code != 1 || !strings.Contains(out, "FAIL launch") || !strings.Contains(out, "the zone is locked") || strings.Count(out, "FAIL ") != 1 {
		t.Errorf("a failing reset: exit %d, want 1 with launch failing on the command's output:\n%s", code, out)
	}
	if n := strings.Count(out, "not run: the reset before case launch failed"); n != len(conformance.ProviderCaseNames()) {
		t.Errorf("%d cases skipped naming the reset, want %d:\n%s", n, len(conformance.ProviderCaseNames()), out)
	}
}
