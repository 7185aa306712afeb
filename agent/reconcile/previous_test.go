package reconcile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestKeepPreviousLog keeps the newest bytes of a removed workload's output and no more than
// PreviousLogFiles of them, the oldest going first.
func TestKeepPreviousLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "output.log")
	big := append(bytes.Repeat([]byte("old line\n"), PreviousLogBytes/9+10), []byte("last line\n")...)
	if err := os.WriteFile(logPath, big, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := KeepPreviousLog(dir, "wl_a", logPath); err != nil {
		t.Fatal(err)
	}
	kept, err := os.ReadFile(PreviousLogPath(dir, "wl_a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != PreviousLogBytes || !bytes.HasSuffix(kept, []byte("last line\n")) {
		t.Fatalf("kept %d bytes ending %q", len(kept), kept[max(0, len(kept)-20):])
	}
	if err := KeepPreviousLog(dir, "wl_gone", filepath.Join(dir, "missing.log")); err != nil {
		t.Fatalf("a workload without output: %v", err)
	}
	small := filepath.Join(dir, "small.log")
	if err := os.WriteFile(small, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(PreviousLogPath(dir, "wl_a"), old, old); err != nil {
		t.Fatal(err)
	}
	for i := range PreviousLogFiles {
		if err := KeepPreviousLog(dir, "wl_n"+string(rune('a'+i%26))+string(rune('a'+i/26)), small); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(PreviousLogPath(dir, "wl_a")); !os.IsNotExist(err) {
		t.Fatalf("the oldest kept output survived the limit: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(PreviousLogPath(dir, "x")))
	if len(ents) != PreviousLogFiles {
		t.Fatalf("%d kept outputs, want %d", len(ents), PreviousLogFiles)
	}
}
