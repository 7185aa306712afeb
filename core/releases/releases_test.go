package releases

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestCatalog(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256([]byte(content))
		return hex.EncodeToString(h[:])
	}
	a040 := write("berth-agent-0.4.0-linux-amd64", "agent 0.4.0 amd64")
	write("berth-agent-0.4.0-linux-arm64", "agent 0.4.0 arm64")
	write("berth-agent-0.10.0-linux-amd64", "agent 0.10.0")
	write("berth-plugin-process-0.4.0-linux-amd64", "process 0.4.0")
	write("berth-agent-latest-linux-amd64", "not a version")
	write("SHA256SUMS", "ignored")
	write("notes.txt", "ignored")
	if err := os.Mkdir(filepath.Join(dir, "berth-agent-0.5.0-linux-amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := New(dir)
	all, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("listed %+v, want the 4 well-named regular files", all)
	}
	if all[0].Name != "berth-agent" || all[0].Version != "0.4.0" || all[2].Version != "0.10.0" || all[3].Name != "berth-plugin-process" {
		t.Fatalf("order: %+v", all)
	}
	if v, err := c.Latest("berth-agent"); err != nil || v != "0.10.0" {
		t.Fatalf("Latest = %q, %v; want 0.10.0 (by version, not by name)", v, err)
	}
	files, err := c.Find("berth-agent", "0.4.0")
	if err != nil || len(files) != 2 {
		t.Fatalf("Find 0.4.0: %+v %v", files, err)
	}
	if _, err := c.Find("berth-agent", "0.9.0"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find 0.9.0: %v", err)
	}
	f, rel, err := c.Open(a040)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "agent 0.4.0 amd64" || rel.Size != int64(len(b)) || rel.OS != "linux" || rel.Arch != "amd64" {
		t.Fatalf("Open: %q %+v", b, rel)
	}
	// A replaced file is hashed again.
	newSum := write("berth-agent-0.4.0-linux-amd64", "agent 0.4.0 amd64, rebuilt")
	if _, _, err := c.Open(a040); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old hash still served after the file changed: %v", err)
	}
	if _, _, err := c.Open(newSum); err != nil {
		t.Fatalf("new hash: %v", err)
	}
	if files, err := New("").List(); err != nil || files != nil {
		t.Fatalf("empty catalog: %v %v", files, err)
	}
	if !ValidSum(a040) || ValidSum("ABC") || ValidSum(a040[:63]+"G") {
		t.Fatal("ValidSum")
	}
}
