package config

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	abierrors "github.com/berthhq/berth/abi/errors"
)

type flags struct {
	fs      *pflag.FlagSet
	dataDir string
	listen  string
	maxB    int64
	sweep   time.Duration
	runner  bool
	config  string
}

func newFlags(t *testing.T, args ...string) *flags {
	t.Helper()
	f := &flags{fs: pflag.NewFlagSet("berthd", pflag.ContinueOnError)}
	f.fs.StringVar(&f.dataDir, "data-dir", "", "")
	f.fs.StringVar(&f.listen, "listen", "127.0.0.1:7070", "")
	f.fs.Int64Var(&f.maxB, "max-bundle-bytes", 512, "")
	f.fs.DurationVar(&f.sweep, "sweep-period", 30*time.Second, "")
	f.fs.BoolVar(&f.runner, "runner-transport", false, "")
	f.fs.StringVar(&f.config, "config", "", "")
	if err := f.fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "berthd.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFileEnvAndFlagPrecedence(t *testing.T) {
	path := writeFile(t, `# berthd configuration
data-dir: /var/lib/berthd
listen: 0.0.0.0:7443
max-bundle-bytes: 1048576
sweep-period: 45s
runner-transport: true
`)
	f := newFlags(t, "--listen", "10.0.0.1:7070")
	src, err := Apply(f.fs, Options{File: path, Getenv: env(map[string]string{
		"BERTH_MAX_BUNDLE_BYTES": "2048",
		"BERTH_LISTEN":           "192.0.2.1:1", // the command line wins over the environment
		"BERTH_CONFIG":           "/elsewhere",  // skipped flag: never read
	}), Skip: []string{"config"}})
	if err != nil {
		t.Fatal(err)
	}
	if f.dataDir != "/var/lib/berthd" || src["data-dir"] != FromFile {
		t.Errorf("data-dir = %q from %s, want the file's", f.dataDir, src["data-dir"])
	}
	if f.listen != "10.0.0.1:7070" || src["listen"] != FromFlag {
		t.Errorf("listen = %q from %s, want the command line's", f.listen, src["listen"])
	}
	if f.maxB != 2048 || src["max-bundle-bytes"] != FromEnv {
		t.Errorf("max-bundle-bytes = %d from %s, want the environment's", f.maxB, src["max-bundle-bytes"])
	}
	if f.sweep != 45*time.Second || !f.runner {
		t.Errorf("sweep-period %s runner-transport %v, want 45s true", f.sweep, f.runner)
	}
	if f.config != "" || src["config"] != FromDefault {
		t.Errorf("config = %q from %s: a skipped flag was read", f.config, src["config"])
	}
}

func TestBadFilesNameKeyAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line       int
		key, want  string
	}{
		{"unknown key", "data-dir: /d\n\nlisten_addr: x\n", 3, "listen_addr", "unknown key"},
		{"snake case suggests the flag", "data-dir: /d\nmax_bundle_bytes: 5\n", 2, "max_bundle_bytes", `did you mean "max-bundle-bytes"`},
		{"skipped flag is unknown in a file", "config: /x\n", 1, "config", "unknown key"},
		{"bad duration", "data-dir: /d\nsweep-period: soon\n", 2, "sweep-period", "invalid"},
		{"bad integer", "max-bundle-bytes: 1e99x\n", 1, "max-bundle-bytes", "invalid"},
		{"bad bool", "runner-transport: maybe\n", 1, "runner-transport", "invalid"},
		{"repeated key", "listen: a:1\nlisten: b:2\n", 2, "listen", "repeated (first on line 1)"},
		{"list value", "listen:\n  - a:1\n", 2, "listen", "single scalar"},
		{"null value", "data-dir: /d\nlisten:\n", 2, "listen", "no value"},
		{"not a mapping", "- data-dir\n", 1, "", "must be a mapping"},
		{"bad YAML", "data-dir: [\n", 0, "", "not valid YAML"},
		{"two documents", "data-dir: /a\n---\ndata-dir: /b\n", 2, "", "more than one YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFlags(t)
			_, err := Apply(f.fs, Options{File: writeFile(t, tc.text), Skip: []string{"config"}})
			var ae *abierrors.Error
			if !errors.As(err, &ae) || ae.Code != abierrors.ConfigInvalid {
				t.Fatalf("err = %v, want code config_invalid", err)
			}
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("err = %v, want a *KeyError", err)
			}
			if (tc.line != 0 && ke.Line != tc.line) || ke.Key != tc.key {
				t.Errorf("line %d key %q, want line %d key %q (%v)", ke.Line, ke.Key, tc.line, tc.key, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %q, want it to say %q", err, tc.want)
			}
			if tc.key != "" && !strings.Contains(err.Error(), "berthd.yaml:") {
				t.Errorf("err = %q, want it to name the file", err)
			}
		})
	}
}

func TestBadFileValueRefusedEvenWhenOverridden(t *testing.T) {
	f := newFlags(t, "--sweep-period", "10s")
	_, err := Apply(f.fs, Options{File: writeFile(t, "sweep-period: later\n")})
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Key != "sweep-period" || ke.Line != 1 {
		t.Fatalf("err = %v, want the bad file line refused", err)
	}
}

func TestCommandLineValueSurvivesFileCheck(t *testing.T) {
	f := newFlags(t, "--sweep-period", "10s")
	if _, err := Apply(f.fs, Options{File: writeFile(t, "sweep-period: 1m\n")}); err != nil {
		t.Fatal(err)
	}
	if f.sweep != 10*time.Second {
		t.Fatalf("sweep-period = %s, want the command line's 10s", f.sweep)
	}
}

func TestBadEnvironmentValueNamesVariable(t *testing.T) {
	f := newFlags(t)
	_, err := Apply(f.fs, Options{Getenv: env(map[string]string{"BERTH_SWEEP_PERIOD": "often"})})
	if err == nil || !strings.Contains(err.Error(), "BERTH_SWEEP_PERIOD") {
		t.Fatalf("err = %v, want it to name BERTH_SWEEP_PERIOD", err)
	}
}

func TestEmptyAndMissingFiles(t *testing.T) {
	f := newFlags(t)
	if _, err := Apply(f.fs, Options{File: writeFile(t, "# nothing yet\n")}); err != nil {
		t.Fatalf("empty file: %v", err)
	}
	_, err := Apply(newFlags(t).fs, Options{File: filepath.Join(t.TempDir(), "absent.yaml")})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err = %v, want one wrapping ErrNotExist", err)
	}
	big := writeFile(t, "listen: x:1\n"+strings.Repeat("#", MaxFileBytes))
	if _, err := Apply(newFlags(t).fs, Options{File: big}); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("big file: err = %v", err)
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("max-bundle-bytes"); got != "BERTH_MAX_BUNDLE_BYTES" {
		t.Fatal(got)
	}
}

func TestLevelAndAddressValuesNameTheLine(t *testing.T) {
	fs := pflag.NewFlagSet("berthd", pflag.ContinueOnError)
	lvl := slog.LevelInfo
	listen, gw := "127.0.0.1:7070", "127.0.0.1:8080"
	fs.Var(LevelValue{&lvl}, "log-level", "")
	fs.Var(AddrValue{S: &listen}, "listen", "")
	fs.Var(AddrValue{S: &gw, Off: "off"}, "gateway-listen", "")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(fs, Options{File: writeFile(t, "log-level: debug\nlisten: '[::1]:7443'\ngateway-listen: \"off\"\n")}); err != nil {
		t.Fatal(err)
	}
	if lvl != slog.LevelDebug || listen != "[::1]:7443" || gw != "off" {
		t.Fatalf("level %s listen %s gateway %s", lvl, listen, gw)
	}
	for text, line := range map[string]int{
		"log-level: loud\n":         1,
		"\nlisten: 7443\n":          2,
		"listen: localhost:99999\n": 1,
		"gateway-listen: none\n":    1,
	} {
		_, err := Apply(fs, Options{File: writeFile(t, text)})
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Line != line {
			t.Errorf("%q: err = %v, want a refusal on line %d", text, err, line)
		}
	}
}

func TestSampleRoundTrips(t *testing.T) {
	f := newFlags(t)
	var b strings.Builder
	if err := Sample(&b, f.fs, "config"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "# config:") || !strings.Contains(b.String(), "# sweep-period: \"30s\"") {
		t.Fatalf("sample:\n%s", b.String())
	}
	// Uncommented, every line is accepted and sets the defaults again.
	var un strings.Builder
	for _, l := range strings.Split(b.String(), "\n") {
		if k, ok := strings.CutPrefix(l, "# "); ok && strings.Contains(k, ": ") && !strings.Contains(k, "(") {
			un.WriteString(k + "\n")
		}
	}
	g := newFlags(t)
	src, err := Apply(g.fs, Options{File: writeFile(t, un.String()), Skip: []string{"config"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, un.String())
	}
	if src["sweep-period"] != FromFile || src["runner-transport"] != FromFile || g.listen != "127.0.0.1:7070" {
		t.Fatalf("sources %v listen %s", src, g.listen)
	}
}
