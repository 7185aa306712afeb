package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
)

// TestExampleRunnerEndToEnd: examples/runner, built as a binary, enrolls with a token from
// `berth runner enroll-token create`, claims the reconcile operation of `berth placement set`,
// downloads and stages the release artifact over TLS with the pinned certificate, reports the
// observation, completes, and drains (docs/runner-protocol.md section 8).
func TestExampleRunnerEndToEnd(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "runner")
	if err := goBuild(root, bin, "./examples/runner"); err != nil {
		t.Fatal(err)
	}
	digest := cl.pushBundle(t, env.helloDir, "hello")
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(cl.cli(t, "runner", "enroll-token", "create", "--node", "example-runner", "-o", "json")), &tok); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(cl.dir, "runner")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--data-dir", data, "--once")
	cmd.Env = append(os.Environ(), "BERTH_SERVER="+cl.url, "BERTH_FINGERPRINT="+cl.fingerprint, abirunner.EnvRegistrationToken+"="+tok.Token)
	logf, err := os.Create(filepath.Join(cl.dir, "runner.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var werr error
	waited := make(chan struct{})
	go func() { werr = cmd.Wait(); close(waited) }()
	t.Cleanup(func() { cancel(); <-waited })
	// The runner is enrolled once its credential file exists; the placement then finds it.
	waitFor(t, 30*time.Second, "runner enrolled", func() (bool, string) {
		out := cl.cli(t, "runner", "list")
		return strings.Contains(out, "example-runner"), out
	})
	cl.cli(t, "placement", "set", "--release", "hello")
	<-waited
	if werr != nil {
		b, _ := os.ReadFile(filepath.Join(cl.dir, "runner.log"))
		t.Fatalf("runner: %v\n%s", werr, b)
	}
	var ops []struct {
		State  string          `json:"state"`
		Fence  int64           `json:"fence"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal([]byte(cl.cli(t, "operation", "list", "-o", "json")), &ops); err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 || ops[0].State != "succeeded" || !strings.Contains(string(ops[0].Result), digest) {
		t.Fatalf("operations = %+v", ops)
	}
	staged, _ := filepath.Glob(filepath.Join(data, "staging", "*", "release.tar.gz"))
	if len(staged) != 1 {
		t.Fatalf("staged artifacts = %v", staged)
	}
	if fi, err := os.Stat(filepath.Join(data, "credentials.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v, %v", fi, err)
	}
}
