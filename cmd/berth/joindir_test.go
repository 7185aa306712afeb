package main

import (
	"strings"
	"testing"
)

// TestJoinDataDir: the printed join command names a --data-dir only for a user who cannot write
// the agent's default data directory (or create it in /var/lib).
func TestJoinDataDir(t *testing.T) {
	yes := func(string) bool { return true }
	no := func(string) bool { return false }
	only := func(want string) func(string) bool { return func(p string) bool { return p == want } }
	for _, tc := range []struct {
		name            string
		euid            int
		canWrite, exist func(string) bool
		want            string
	}{
		{"root", 0, no, no, ""},
		{"writable existing dir", 1000, only("/var/lib/berth-agent"), yes, ""},
		{"may create it", 1000, only("/var/lib"), no, ""},
		{"cannot create it", 1000, no, no, "/home/ana/.local/share/berth-agent"},
		{"existing, not writable", 1000, only("/var/lib"), yes, "/home/ana/.local/share/berth-agent"},
	} {
		if got := joinDataDir(tc.euid, tc.canWrite, tc.exist, "/home/ana/.local/share"); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestYAMLErrorLines: a service file's error names the line it is on, counted from 1 in the whole
// file, for parser errors (which yaml.v3 counts from 0), scanner errors, type errors and unknown
// fields alike, in the first document or a later one.
func TestYAMLErrorLines(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"unclosed flow sequence", "name: a\nbundle: x\nenv:\n  A: 1\n  B: [2\n", "line 5:"},
		{"unclosed, second document", "name: a\nbundle: x\n---\nname: b\nbundle: [y\nport: 1\n", "document 2: yaml: line 5:"},
		{"missing key", "name: a\n  bundle: x\n", "line 2:"},
		{"tab", "name: a\n\tbundle: x\n", "line 2:"},
		{"wrong type, second document", "name: a\nbundle: x\n---\nname: b\nbundle: y\nport: eighty\n", "document 2: line 6:"},
		{"unknown field", "name: c\nbundle: z\nportt: 1\n", `line 3: unknown field "portt"`},
	} {
		_, err := parseServiceFiles(strings.NewReader(tc.file), "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
