package server

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// parseUnit reads a unit file as section -> key -> values, refusing any line
// that is neither a comment, a section header nor key=value.
func parseUnit(t *testing.T, text string) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("unit line %d %q is not key=value in a section", n, line)
			}
			out[section][k] = append(out[section][k], v)
		}
	}
	return out
}

func TestInstallUnitWritesAHardenedServiceAndStartsNothing(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unitDir := t.TempDir()
	cfg := UnitConfig{Binary: exe, DataDir: "/var/lib/berthd", ConfigFile: "/etc/berth/berthd.yaml", UnitDir: unitDir}
	path, text, err := InstallUnit(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(unitDir, UnitName) {
		t.Fatalf("path %s", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("unit mode %o, want 0644", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(unitDir)
	if len(entries) != 1 {
		t.Errorf("unit directory holds %d entries, want only the unit (no temp file left)", len(entries))
	}
	onDisk, _ := os.ReadFile(path)
	if string(onDisk) != text {
		t.Fatal("the returned text differs from the file")
	}

	u := parseUnit(t, text)
	svc := u["Service"]
	want := map[string]string{
		"ExecStart":                exe + " --data-dir /var/lib/berthd --config /etc/berth/berthd.yaml",
		"User":                     "berthd",
		"Group":                    "berthd",
		"Restart":                  "on-failure",
		"RestartPreventExitStatus": "78",
		"LimitNOFILE":              "65536",
		"NoNewPrivileges":          "yes",
		"ProtectSystem":            "strict",
		"ReadWritePaths":           "/var/lib/berthd",
		"StateDirectory":           "berthd",
		"StateDirectoryMode":       "0700",
		"UMask":                    "0077",
		"PrivateTmp":               "yes",
		"ProtectHome":              "yes",
	}
	for k, v := range want {
		if got := svc[k]; len(got) != 1 || got[0] != v {
			t.Errorf("[Service] %s = %q, want exactly %q", k, got, v)
		}
	}
	if _, ok := svc["MemoryDenyWriteExecute"]; ok {
		t.Error("MemoryDenyWriteExecute set: the WebAssembly runtime needs executable memory")
	}
	if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "multi-user.target" {
		t.Errorf("[Install] WantedBy = %q", got)
	}

	// systemd's own parser, where the machine has it: no warning at all.
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		out, err := exec.Command(sa, "verify", path).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) != 0 {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("systemd-analyze not installed: the unit was checked by parsing only")
	}
}

func TestUnitOutsideVarLibHasNoStateDirectory(t *testing.T) {
	text, err := Unit(UnitConfig{Binary: "/usr/local/bin/berthd", DataDir: "/srv/berth/data", User: "berth", LimitNOFILE: 200000})
	if err != nil {
		t.Fatal(err)
	}
	svc := parseUnit(t, text)["Service"]
	if _, ok := svc["StateDirectory"]; ok {
		t.Error("StateDirectory set for a data directory outside /var/lib")
	}
	if svc["ReadWritePaths"][0] != "/srv/berth/data" || svc["User"][0] != "berth" || svc["LimitNOFILE"][0] != "200000" {
		t.Errorf("service section %v", svc)
	}
	if strings.Contains(svc["ExecStart"][0], "--config") {
		t.Error("ExecStart passes --config though none was given")
	}
}

func TestUnitRefusesPathsItWouldHaveToQuote(t *testing.T) {
	for _, cfg := range []UnitConfig{
		{Binary: "berthd", DataDir: "/var/lib/berthd"},
		{Binary: "/usr/bin/berthd", DataDir: "/var/lib/my berth"},
		{Binary: "/usr/bin/berthd", DataDir: "/var/lib/berthd", ConfigFile: "/etc/$x.yaml"},
		{Binary: "/usr/bin/berthd", DataDir: "/"},
		{Binary: "/usr/bin/berthd", DataDir: "/var/lib/berthd", User: "Root;rm"},
		{Binary: "/usr/bin/berthd", DataDir: "/var/lib/berthd", LimitNOFILE: 10},
		{DataDir: "/var/lib/berthd"},
	} {
		if _, err := Unit(cfg); err == nil {
			t.Errorf("Unit(%+v) accepted", cfg)
		}
		dir := t.TempDir()
		cfg.UnitDir = dir
		if _, _, err := InstallUnit(cfg); err == nil {
			t.Errorf("InstallUnit(%+v) accepted", cfg)
		}
		if e, _ := os.ReadDir(dir); len(e) != 0 {
			t.Errorf("a refused unit left %d files", len(e))
		}
	}
}
