package hostsetup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallWritesUnitAndNothingElse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, text, err := Install(UnitConfig{Binary: "/usr/local/bin/berth-agent", DataDir: "/var/lib/berth-agent", UnitDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, UnitName) {
		t.Fatalf("path %s", path)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != text {
		t.Fatalf("file differs from the returned text: %v", err)
	}
	for _, want := range []string{
		"ExecStart=/usr/local/bin/berth-agent run --data-dir /var/lib/berth-agent\n",
		"Restart=on-failure\n", "RestartSec=5s\n", "RestartPreventExitStatus=78 77\n", "KillMode=process\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("unit dir holds %d files, want only the unit", len(entries))
	}
	if _, _, err := Install(UnitConfig{Binary: "berth-agent", DataDir: "/x", UnitDir: dir}); err == nil {
		t.Fatal("relative binary accepted")
	}
	withRes, err := Unit(UnitConfig{Binary: "/b/berth-agent", DataDir: "/d", Resources: []string{"gpu=1", "fpga=2"}, Reserve: "cpu_m=500,memory_mib=512"})
	if err != nil || !strings.Contains(withRes, "ExecStart=/b/berth-agent run --data-dir /d --resource gpu=1 --resource fpga=2 --reserve cpu_m=500,memory_mib=512\n") {
		t.Fatalf("unit with resources: %v\n%s", err, withRes)
	}
	if _, _, err := Install(UnitConfig{Binary: "/bin/a b", DataDir: "/x", UnitDir: dir}); err == nil {
		t.Fatal("path with a space accepted")
	}
}
