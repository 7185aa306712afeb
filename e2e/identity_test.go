package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

const alicePassword = "alice's long enough e2e password"

// berth runs the CLI with HOME under the cluster directory, so that berth login saves its
// session there; token, when not empty, is passed with --token. It returns stdout, stderr and
// the exit code.
func (cl *cluster) berth(t *testing.T, token, stdin string, args ...string) (string, string, int) {
	t.Helper()
	full := []string{"--server", cl.url, "--fingerprint", cl.fingerprint}
	if token != "" {
		full = append(full, "--token", token)
	}
	cmd := exec.Command(filepath.Join(env.bin, "berth"), append(full, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+cl.dir, "XDG_CONFIG_HOME="+filepath.Join(cl.dir, "config"), "BERTH_TOKEN=")
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("berth %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func (cl *cluster) berthOK(t *testing.T, token, stdin string, args ...string) string {
	t.Helper()
	out, errOut, code := cl.berth(t, token, stdin, args...)
	if code != 0 {
		t.Fatalf("berth %v: exit %d\n%s", args, code, errOut)
	}
	return out
}

// TestIdentityHumanAndDeployToken: the first human admin comes from --bootstrap-admin; the
// human logs in, creates a deploy token bounded to one service, deploys with it, is refused on
// another service, revokes it and sees the next request fail; a followed log ends when its
// token is revoked; a password change ends the saved session.
func TestIdentityHumanAndDeployToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t)}
	t.Cleanup(func() { cl.killWorkloads(t); cl.killGateway(t) })
	cmd := exec.Command(filepath.Join(env.bin, "berthd"), "--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api,
		"--gateway-listen", cl.gateway, "--log-level", "debug", "--sweep-floor", "1s", "--bootstrap-admin", "alice")
	cmd.Stdin = strings.NewReader(alicePassword + "\n")
	cl.berthd = proctest.StartCmd(t, filepath.Join(cl.dir, "berthd.log"), cmd)
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	cl.fingerprint, cl.token = d.Fingerprint, d.Token
	var err error
	cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(cl.dir, "berthd.log"))
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("---- berthd.log (tail) ----\n%s", b)
		}
	})
	if b, _ := os.ReadFile(filepath.Join(cl.dir, "berthd.log")); bytes.Contains(b, []byte(alicePassword)) {
		t.Fatalf("berthd logged the bootstrap password")
	}
	startProcessAgent(t, cl, "n1")

	// The human logs in; later commands use the saved session.
	if out := cl.berthOK(t, "", alicePassword+"\n", "login", "--user", "alice", "--password-stdin"); !strings.Contains(out, "session for alice") {
		t.Fatalf("login output: %s", out)
	}
	if out := cl.berthOK(t, "", "", "token", "list"); !strings.Contains(out, "bootstrap") {
		t.Fatalf("token list lacks the bootstrap token:\n%s", out)
	}
	var issued client.IssuedToken
	if err := json.Unmarshal([]byte(cl.berthOK(t, "", "", "token", "create", "--name", "ci-deploy", "--scope", "service:deploy",
		"--project", "default", "--service", "hello", "--expires", "30d", "-o", "json")), &issued); err != nil || !strings.HasPrefix(issued.Token, "brt_") {
		t.Fatalf("token create: %+v %v", issued, err)
	}
	deploy := issued.Token
	if _, errOut, code := cl.berth(t, "", "", "token", "create", "--name", "bad", "--scope", "node:remove"); code == 0 || !strings.Contains(errOut, "scope_human_only") {
		t.Fatalf("a machine token with node:remove: exit %d %s", code, errOut)
	}

	// The human pushes the release (creating the project); the deploy token applies its
	// service, and the rollout runs.
	cl.berthOK(t, "", "", "bundle", "push", env.helloDir, "--name", "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.berthOK(t, deploy, "", "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)

	// Another service of the same project is refused, with the generic 403.
	other := filepath.Join(cl.dir, "other.yaml")
	if err := os.WriteFile(other, []byte("name: other\nproject: default\nbundle: hello\ncommand: [\"./hello\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := cl.berth(t, deploy, "", "apply", "-f", other); code == 0 || !strings.Contains(errOut, "forbidden") {
		t.Fatalf("deploy token on another service: exit %d %s", code, errOut)
	}

	// A followed log ends when its token is revoked.
	var reader client.IssuedToken
	if err := json.Unmarshal([]byte(cl.berthOK(t, "", "", "token", "create", "--name", "reader", "--scope", "services:read", "-o", "json")), &reader); err != nil {
		t.Fatal(err)
	}
	rc, err := client.New(cl.url, client.WithToken(reader.Token), client.WithFingerprint(cl.fingerprint))
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 2*converge)
	defer fcancel()
	opened := make(chan struct{}, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- rc.FollowWorkloadLogs(fctx, ids[0], 1, func(node.LogLine) error {
			select {
			case opened <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	select {
	case <-opened:
	case err := <-ended:
		t.Fatalf("the followed log ended before revocation: %v", err)
	case <-time.After(converge):
		t.Fatalf("the followed log delivered no line within %s", converge)
	}
	cl.berthOK(t, "", "", "token", "revoke", "reader")
	select {
	case err := <-ended:
		if fctx.Err() != nil {
			t.Fatalf("the followed log ran until the test's deadline")
		}
		if !client.IsCode(err, "unauthenticated") {
			t.Fatalf("the followed log ended with %v, want unauthenticated (its trailer says why)", err)
		}
	case <-time.After(converge):
		t.Fatalf("the followed log did not end within %s of the revocation", converge)
	}

	// Revoke the deploy token: its very next request fails.
	cl.berthOK(t, "", "", "token", "revoke", "ci-deploy")
	if _, errOut, code := cl.berth(t, deploy, "", "get", "services"); code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("revoked token: exit %d %s", code, errOut)
	}

	// The audit names the actors.
	audit := cl.berthOK(t, "", "", "audit", "--actor", "token:ci-deploy")
	if !strings.Contains(audit, "service") || strings.Contains(audit, "user:alice") {
		t.Fatalf("audit of the deploy token:\n%s", audit)
	}

	// A password change ends the saved session at once.
	cl.berthOK(t, "", "an entirely new long password\n", "user", "passwd", "alice", "--password-stdin")
	if _, errOut, code := cl.berth(t, "", "", "get", "services"); code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("the session after the password change: exit %d %s", code, errOut)
	}
	if out := cl.berthOK(t, "", "an entirely new long password\n", "login", "--user", "alice", "--password-stdin"); !strings.Contains(out, "session for alice") {
		t.Fatalf("login with the new password: %s", out)
	}

	// A restart that states the bootstrap admin again (here through the environment, with
	// another password) changes nothing: the current password still logs in, the stated one
	// does not, and no second admin appears.
	cl.berthd.Stop()
	cmd = exec.Command(filepath.Join(env.bin, "berthd"), "--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api,
		"--gateway-listen", cl.gateway, "--log-level", "debug", "--sweep-floor", "1s")
	cmd.Env = append(os.Environ(), "BERTH_BOOTSTRAP_ADMIN=mallory:a different long enough password")
	cl.berthd = proctest.StartCmd(t, filepath.Join(cl.dir, "berthd.log"), cmd)
	proctest.WaitBerthdReady(t, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	if _, errOut, code := cl.berth(t, "", "a different long enough password\n", "login", "--user", "mallory", "--password-stdin"); code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("a second bootstrap admin logs in: exit %d %s", code, errOut)
	}
	cl.berthOK(t, "", "an entirely new long password\n", "login", "--user", "alice", "--password-stdin")
	if out := cl.berthOK(t, "", "", "user", "list"); strings.Contains(out, "mallory") || !strings.Contains(out, "alice") {
		t.Fatalf("users after the restart:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(cl.dir, "berthd.log")); !bytes.Contains(b, []byte(`msg="bootstrap admin exists already; nothing changed" user=mallory`)) ||
		bytes.Contains(b, []byte("a different long enough password")) {
		t.Fatalf("berthd did not read BERTH_BOOTSTRAP_ADMIN, or logged its password")
	}
}
