package main

import (
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// TestFailureLineKeepsTheKind: a failure whose message is longer than the cell keeps its kind in
// front and the end of the message ("oom: …over its memory limit"), so the table never shows a
// cut "…m: killed by"; short failures and kinds without a message are shown whole.
func TestFailureLineKeepsTheKind(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	a := &app{now: func() time.Time { return now }}
	at := now.Add(-3 * time.Second)
	oom := &client.Failure{Kind: "oom", Message: "killed by the kernel's OOM killer: over its memory limit", At: at}
	if got := a.failureLine(oom, 40); !strings.HasPrefix(got, "oom: …") || !strings.HasSuffix(got, "its memory limit (3s ago)") || len([]rune(got)) > 40+len(" (3s ago)") {
		t.Errorf("oom: %q", got)
	}
	if got := a.failureLine(oom, 80); got != "oom: killed by the kernel's OOM killer: over its memory limit (3s ago)" {
		t.Errorf("oom, room enough: %q", got)
	}
	code := 2
	if got := a.failureLine(&client.Failure{Kind: "exit", ExitCode: &code, At: at, Count: 3}, 40); got != "exit 2 (x3, 3s ago)" {
		t.Errorf("exit: %q", got)
	}
	start := &client.Failure{Kind: "start", Message: strings.Repeat("x", 30) + " no such file", At: at}
	if got := a.failureLine(start, 20); !strings.HasPrefix(got, "start: …") || !strings.Contains(got, "no such file") {
		t.Errorf("start: %q", got)
	}
}
