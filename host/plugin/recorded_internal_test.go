package plugin

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/securefile"
)

// TestReadRecordedAndStop: a record naming a live process is read back and Stop ends that
// process; a record whose start time is another process's, or whose process is gone, names
// nothing and Stop never signals.
func TestReadRecordedAndStop(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-waited })
	ticks, err := startTicks(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, ticks uint64) string {
		raw, _ := json.Marshal(reattachRecord{Version: reattachVersion, PID: cmd.Process.Pid, StartTicks: ticks, Path: "/bin/sleep", Args: []string{"300"}})
		path := filepath.Join(dir, name)
		if err := securefile.WriteFile(path, raw); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if _, ok, err := ReadRecorded(filepath.Join(dir, "none.json")); ok || err != nil {
		t.Fatalf("no record: ok %v err %v", ok, err)
	}
	if _, ok, err := ReadRecorded(write("other.json", ticks+1)); ok || err != nil {
		t.Fatalf("a record of another start time: ok %v err %v, want nothing named", ok, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := securefile.WriteFile(bad, []byte("{")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadRecorded(bad); err == nil {
		t.Fatal("a corrupt record was read")
	}
	path := write("live.json", ticks)
	p, ok, err := ReadRecorded(path)
	if err != nil || !ok || p.PID != cmd.Process.Pid || p.Path != "/bin/sleep" {
		t.Fatalf("live record: %+v ok %v err %v", p, ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Stop(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-ctx.Done():
		t.Fatal("the recorded process still runs after Stop")
	}
	if _, ok, err := ReadRecorded(path); ok || err != nil {
		t.Fatalf("record of a stopped process: ok %v err %v", ok, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Stop removed the record: %v", err)
	}
	if err := p.Stop(ctx, time.Second); err != nil {
		t.Fatalf("Stop of a process already gone: %v", err)
	}
}
