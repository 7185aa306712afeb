package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigCheckRefusesUnknownKeyAndBadValueWithLine(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]string{
		"data-dir: /var/lib/berthd\nlisten: 0.0.0.0:7443\nlisten-address: x\n": `berthd.yaml:3: key "listen-address": unknown key`,
		"data-dir: /var/lib/berthd\nlog-level: chatty\n":                       `berthd.yaml:2: key "log-level"`,
		"data-dir: /var/lib/berthd\n\nsweep-floor: 5 seconds\n":                `berthd.yaml:3: key "sweep-floor"`,
	} {
		path := filepath.Join(dir, "berthd.yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"config", "check", "--config", path}, {"--config", path}} {
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 78 {
				t.Errorf("%v on %q: exit %d, want 78", args, text, code)
			}
			if !strings.Contains(errb.String(), want) || !strings.Contains(errb.String(), "config_invalid") {
				t.Errorf("%v: stderr %q, want it to say %q", args, errb.String(), want)
			}
		}
	}
}

func TestConfigCheckShowsWhereValuesCameFrom(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berthd.yaml")
	if err := os.WriteFile(path, []byte("data-dir: /var/lib/berthd\nlisten: 0.0.0.0:7443\nmongo-uri: mongodb://berth:hunter2@db1:27017/berth\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_SWEEP_PERIOD", "1m")
	var out, errb bytes.Buffer
	if code := run([]string{"config", "check", "--config", path, "--listen", "127.0.0.1:9000"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"data-dir           /var/lib/berthd", "(file)", "127.0.0.1:9000", "(flag)", "1m0s", "(env)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "hunter2") {
		t.Error("config check printed the MongoDB password")
	}
}

func TestInstallPrintsUnitAndNextSteps(t *testing.T) {
	unitDir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"install", "--unit-dir", unitDir, "--config", "/etc/berth/berthd.yaml"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile(filepath.Join(unitDir, "berthd.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{string(b), "Nothing was started", "useradd --system", "systemctl enable --now berthd", "install -d -m 0700 -o berthd -g berthd /var/lib/berthd"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code := run([]string{"install", "--unit-dir", unitDir, "--data-dir", "/"}, &out, &errb); code != 78 {
		t.Errorf("install with data dir /: exit %d, want 78", code)
	}
}

func TestBackupRefusesArchiveInsideDataDir(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run([]string{"backup", "--data-dir", dir, "--to", filepath.Join(dir, "x.backup")}, &out, &errb); code != 78 || !strings.Contains(errb.String(), "outside the data directory") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if code := run([]string{"backup", "--data-dir", dir, "--to", "s3://bucket/x"}, &out, &errb); code != 78 {
		t.Fatalf("s3 destination: exit %d", code)
	}
	if code := run([]string{"restore", filepath.Join(dir, "absent"), "--data-dir", filepath.Join(dir, "new")}, &out, &errb); code != 1 {
		t.Fatalf("restore of a missing archive: exit %d", code)
	}
}
