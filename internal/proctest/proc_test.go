package proctest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKillUnderKillsWhatWorksOrPointsInTheDirectory: a process working in the directory and one
// naming a path under it are killed; one elsewhere is left alone.
func TestKillUnderKillsWhatWorksOrPointsInTheDirectory(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	start := func(cwd string, args ...string) *exec.Cmd {
		cmd := exec.Command("sleep", args...)
		cmd.Dir = cwd
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	inside := start(dir, "60")
	// A shell keeps the path as its $0, so it stays in the command line.
	named := exec.Command("sh", "-c", "sleep 60", filepath.Join(dir, "state"))
	named.Dir = other
	if err := named.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = named.Process.Kill(); _ = named.Wait() })
	outside := start(other, "60")

	if n := KillUnder(t, dir); n != 2 {
		t.Fatalf("KillUnder signalled %d processes, want 2", n)
	}
	for name, cmd := range map[string]*exec.Cmd{"working in dir": inside, "naming dir": named} {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the process %s is still running 10 s after KillUnder", name)
		}
	}
	// Not waited for, so a killed one would be a zombie: its state letter says which.
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(outside.Process.Pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) == 0 || f[0] == "Z" {
		t.Fatalf("the process elsewhere was killed: %s", stat)
	}
}
