package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/agent"
	"github.com/berthhq/berth/agent/hostsetup"
)

func TestInstallPrintsWhatItWrote(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	cmd := newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"install", "--unit-dir", dir, "--binary", "/opt/berth/berth-agent", "--data-dir", "/srv/berth"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("install: %v", err)
	}
	unit, err := os.ReadFile(filepath.Join(dir, hostsetup.UnitName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), string(unit)) || !strings.Contains(out.String(), "Nothing was started") {
		t.Fatalf("output does not show the unit it wrote:\n%s", out.String())
	}
	if !strings.Contains(string(unit), "ExecStart=/opt/berth/berth-agent run --data-dir /srv/berth\n") {
		t.Fatalf("unit:\n%s", unit)
	}
}

func TestExitStatusForConfigurationErrors(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	cmd := newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"run", "--data-dir", t.TempDir()})
	if err := cmd.Execute(); exitCode(err) != hostsetup.ExitConfig {
		t.Fatalf("not enrolled: %v exit %d, want 78", err, exitCode(err))
	}
	cmd = newRootCmd(&out, &errOut)
	cmd.SetArgs([]string{"run", "--no-such-flag"})
	if err := cmd.Execute(); exitCode(err) != hostsetup.ExitConfig {
		t.Fatalf("bad flag: %v exit %d, want 78", err, exitCode(err))
	}
	if got := exitCode(fmt.Errorf("agent: %w", agent.ErrPinMismatch)); got != hostsetup.ExitPinMismatch {
		t.Fatalf("pin mismatch: exit %d, want %d", got, hostsetup.ExitPinMismatch)
	}
	if exitCode(agent.ErrRemoved) != hostsetup.ExitConfig || exitCode(errors.New("dial failed")) != 1 {
		t.Fatal("exit codes of removal and of a transient error")
	}
}
