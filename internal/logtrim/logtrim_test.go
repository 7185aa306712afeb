package logtrim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrimKeepsNewestLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.log")
	var b strings.Builder
	for i := range 100 {
		b.WriteString(strings.Repeat("x", 9) + string(rune('a'+i%26)) + "\n") // 11-byte lines
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Trim(path, 2000); err != nil { // under the limit: untouched
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 1100 {
		t.Fatalf("size %d after a trim under the limit, want 1100", fi.Size())
	}
	if err := Trim(path, 200); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if len(got) > 100 || !strings.HasSuffix(string(got), b.String()[len(b.String())-len(got):]) || got[0] != 'x' {
		t.Fatalf("after trim to 200: %d bytes %q; want the newest whole lines within 100 bytes", len(got), got)
	}
	if err := Trim(filepath.Join(t.TempDir(), "missing"), 10); err != nil {
		t.Fatalf("missing file: %v", err)
	}
	if err := Trim("", 10); err != nil {
		t.Fatalf("empty path: %v", err)
	}
}
