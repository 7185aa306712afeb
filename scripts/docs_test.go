package scripts_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readDoc returns the text of the repository file rel.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeStopsOnlyThisDataDirsGateway runs the README's command that stops
// the gateway a berthd left running, against a data directory whose gateway
// pid file names a process this test started: that process stops, and the
// command names no process by pattern (pkill would stop every berthd's).
func TestReadmeStopsOnlyThisDataDirsGateway(t *testing.T) {
	readme := readDoc(t, "README.md")
	if strings.Contains(readme, "pkill") || strings.Contains(readme, "killall") {
		t.Error("the README stops processes by name")
	}
	m := regexp.MustCompile("`(kill [^`]*/tmp/berth-data/plugins/gateway\\.pid[^`]*)`").FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("the README gives no command stopping the gateway by the pid in DATA/plugins/gateway.pid")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gateway := exec.CommandContext(ctx, "sleep", "60")
	if err := gateway.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gateway.Wait() }()
	defer func() { _ = gateway.Process.Kill() }()
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The pid file as host/plugin writes it.
	rec, _ := json.Marshal(map[string]any{"pid": gateway.Process.Pid, "start_ticks": 1, "path": "/x/berth-plugin-gateway"})
	if err := os.WriteFile(filepath.Join(data, "plugins", "gateway.pid"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(m[1], "/tmp/berth-data", data)
	if out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop the process of the pid file", script)
	}
}
