package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestParseRefusesWhatCannotRun(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"nothing":          {nil, "missing --core-url, --tls-cert, --tls-key"},
		"plain ws outside": {[]string{"--core-url", "ws://berthd.example/relay", "--tls-cert", "c", "--tls-key", "k"}, "want a wss:// URL"},
		"http":             {[]string{"--core-url", "https://berthd.example/relay", "--tls-cert", "c", "--tls-key", "k"}, "want a wss:// URL"},
	} {
		_, err := parse(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	for _, ok := range []string{"wss://berthd.example/relay", "ws://127.0.0.1:8080/relay", "ws://localhost/relay"} {
		if _, err := parse([]string{"--core-url", ok, "--tls-cert", "c", "--tls-key", "k"}, &bytes.Buffer{}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

func TestHelpExplains(t *testing.T) {
	var out bytes.Buffer
	_, err := parse([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"cluster relay", "/readyz", "-core-url", "-credential-file", "-tls-cert", "-listen"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}
