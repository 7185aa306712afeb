package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// TestSecretsNeverLeak sets secrets with distinctive random values, deploys two services that
// use them (directly, as a file and through a set), rolls one to a new version, restarts berthd
// and the agent, and then searches every log line, every API answer it received, the change log,
// every file of berthd's data directory (the store) and of the agent's (its SQLite file): no
// value is found, except in each workload's own environment (read through the app) and its own
// secret file.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	var answers bytes.Buffer
	keep := func(v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		answers.Write(b)
		answers.WriteByte('\n')
	}
	mark := func(what string) string { return "Lk" + what + strings.ToLower(rand.Text())[:20] }
	greet1, greet2, greetSet, fileVal := mark("g1"), mark("g2"), mark("gs"), mark("fv")
	values := []string{greet1, greet2, greetSet, fileVal}

	agentDir, agentLog := cl.enrollNode(t)
	if fi, err := os.Stat(filepath.Join(agentDir, "secrets.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the agent's secret key: %v %v", fi, err)
	}
	agent := start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		return err == nil && len(ns) == 1 && ns[0].Status == "connected", fmt.Sprint(ns, err)
	})

	// Values go in through the CLI's stdin and a file, never argv.
	for name, v := range map[string]string{"greeting": greet1, "greeting-set": greetSet} {
		keep(cl.berthOK(t, cl.token, v+"\n", "secret", "set", "default/"+name))
	}
	vf := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(vf, []byte(fileVal), 0o600); err != nil {
		t.Fatal(err)
	}
	keep(cl.berthOK(t, cl.token, "", "secret", "set", "default/tls-key", "--from-file", vf))
	set, err := cl.c.PutSecretSet(ctx, "default", "payments", client.SecretSetSpec{Secrets: map[string]client.SecretRef{"GREETING": {Secret: "greeting-set"}}})
	if err != nil {
		t.Fatal(err)
	}
	keep(set)

	cl.pushBundle(t, env.helloDir, "hello")
	apply := func(name, body string) {
		t.Helper()
		spec := filepath.Join(cl.dir, name+".yaml")
		y := fmt.Sprintf("name: %s\nbundle: hello\ncommand: [\"./hello\"]\ndomains: [\"%s.localhost\"]\nreplicas: 2\nhealth_check: {path: /healthz, interval_s: 1}\n%s", name, name, body)
		if err := os.WriteFile(spec, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		keep(cl.cli(t, "apply", "-f", spec))
	}
	apply("hello", "secrets:\n  GREETING: {secret: greeting, version: 1}\n  TLS_KEY: {secret: tls-key, as: file}\n")
	apply("other", "secret_sets: [payments]\n")
	greets := func(host, want string, n int) {
		t.Helper()
		cl.waitGreeting(t, host, want, n)
	}
	greets("hello.localhost", greet1, 2)
	greets("other.localhost", greetSet, 2)
	// The file reached the workload's own 0700 secret directory.
	ws := cl.workloads(t, "hello")
	sf := filepath.Join(agentDir, "workloads", ws[0].ID, "secrets", "TLS_KEY")
	if b, err := os.ReadFile(sf); err != nil || string(b) != fileVal {
		t.Fatalf("secret file %s: %v", sf, err)
	}

	// A new version, pinned by the service: a rollout to it on 2 replicas.
	keep(cl.berthOK(t, cl.token, greet2+"\n", "secret", "set", "default/greeting"))
	began := time.Now()
	apply("hello", "secrets:\n  GREETING: {secret: greeting, version: 2}\n  TLS_KEY: {secret: tls-key, as: file}\n")
	greets("hello.localhost", greet2, 2)
	t.Logf("figure: rollout of a secret change on 2 replicas took %s", time.Since(began).Round(time.Millisecond))
	if out := cl.cli(t, "describe", "service", "hello"); !strings.Contains(out, "GREETING <- greeting@2") {
		t.Fatalf("describe should name the secret and its version:\n%s", out)
	} else {
		keep(out)
	}
	if _, errOut, code := cl.berth(t, cl.token, "", "secret", "rm", "default/greeting"); code == 0 || !strings.Contains(errOut, "secret_in_use") {
		t.Fatalf("rm of a used secret: exit %d %s", code, errOut)
	}

	// Restart berthd and the agent; the services keep their values.
	cl.berthd.Kill9()
	startBerthd(t, cl)
	agent.Kill9()
	agent = start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node reconnected and applied", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		return len(ns) == 1 && ns[0].Status == "connected" && ns[0].AppliedRev == ns[0].DesiredRev, fmt.Sprint(ns)
	})
	greets("hello.localhost", greet2, 2)
	greets("other.localhost", greetSet, 2)

	// A new node key: the values are resealed to it, and a restarted replica opens them with it.
	ns, err := cl.c.ListNodes(ctx)
	if err != nil || len(ns) != 1 {
		t.Fatal(ns, err)
	}
	// The node may still show the session of the agent killed above: a rotation refused for want
	// of a live session (503, nothing sent) is asked again once the new agent's session is up.
	waitFor(t, converge, "node key rotated over a live session", func() (bool, string) {
		out, errOut, code := cl.berth(t, cl.token, "", "node", "rotate-key", ns[0].ID)
		if code != 0 {
			if !strings.Contains(errOut, "no live session") {
				t.Fatalf("berth node rotate-key: exit %d\n%s", code, errOut)
			}
			return false, errOut
		}
		keep(out)
		return true, ""
	})
	if _, err := os.Stat(filepath.Join(agentDir, "secrets.key.prev")); err != nil {
		t.Fatalf("the node should keep its previous key: %v", err)
	}
	waitFor(t, converge, "resealed desired state applied", func() (bool, string) {
		ns, _ := cl.c.ListNodes(ctx)
		return len(ns) == 1 && ns[0].AppliedRev == ns[0].DesiredRev && ns[0].DesiredRev > 0, fmt.Sprint(ns)
	})
	if err := os.Remove(filepath.Join(agentDir, "secrets.key.prev")); err != nil {
		t.Fatal(err)
	}
	victim := cl.workloadPIDs(t)
	for id, pids := range victim {
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, converge, "killed replica restarted with the new key", func() (bool, string) {
			now := cl.workloadPIDs(t)[id]
			return len(now) == 1 && now[0] != pids[0], fmt.Sprint(now)
		})
		break
	}
	greets("hello.localhost", greet2, 2)
	greets("other.localhost", greetSet, 2)

	// Everything the API answered.
	for _, f := range []func() (any, error){
		func() (any, error) { return cl.c.ListServices(ctx, "default") },
		func() (any, error) { return cl.c.ListSecrets(ctx, "default") },
		func() (any, error) { return cl.c.ListSecretSets(ctx, "default") },
		func() (any, error) { return cl.c.ListWorkloads(ctx, "default") },
		func() (any, error) { return cl.c.ListNodes(ctx) },
		func() (any, error) { return cl.c.KeyringStatus(ctx) },
	} {
		v, err := f()
		if err != nil {
			t.Fatal(err)
		}
		keep(v)
	}
	keep(cl.changelogEntries(t))
	keep(cl.cli(t, "secret", "get", "default/greeting", "-o", "json"))
	scan := map[string][]byte{"API answers, CLI output and the change log": answers.Bytes()}
	// Every file of the cluster directory: logs (berthd, plugins, gateway, agent), berthd's data
	// directory with its store, the agent's SQLite file and snapshots, the workloads' logs. The
	// workloads' own secret directories are theirs.
	err = filepath.WalkDir(cl.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.Contains(p, string(filepath.Separator)+"secrets"+string(filepath.Separator)) && strings.Contains(p, "workloads") {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil // a socket or a file removed meanwhile
		}
		scan[p] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for where, b := range scan {
		files++
		for _, v := range values {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value", where)
			}
		}
	}
	if files < 10 {
		t.Fatalf("scanned only %d sources", files)
	}
	t.Logf("scanned %d files and answers", files)
}

// enrollNode enrolls one agent with a new join token into cl.dir/agent, logging to
// cl.dir/agent.log, and returns both paths; the caller starts "berth-agent run".
func (cl *cluster) enrollNode(t *testing.T) (dir, logPath string) {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir, logPath = filepath.Join(cl.dir, "agent"), filepath.Join(cl.dir, "agent.log")
	enroll := start(t, logPath, "berth-agent", "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", dir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	return dir, logPath
}

// waitGreeting waits until each of the n replicas of the hello service behind host answers
// "want from <workload>": the secret value want reached every replica.
func (cl *cluster) waitGreeting(t *testing.T, host, want string, n int) {
	t.Helper()
	ids := cl.waitReplicas(t, strings.TrimSuffix(host, ".localhost"), n)
	waitFor(t, 2*converge, host+" greets with "+want, func() (bool, string) {
		seen := map[string]bool{}
		for range 20 {
			resp, err := cl.get(host, "/")
			if err != nil {
				return false, err.Error()
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(b), want+" from ") {
				return false, "answer without the expected value"
			}
			seen[workloadIn(string(b))] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false, "not every replica answered yet"
			}
		}
		return true, ""
	})
}

// TestBinarySecretReachesFileExactly: a value holding every byte value 0x00..0xff, set with
// `berth secret set --from-file`, reaches the workload's secret file byte for byte through the
// real agent; taken as an environment variable, which cannot carry it, it is refused at apply
// naming the key.
func TestBinarySecretReachesFileExactly(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	agentDir, agentLog := cl.enrollNode(t)
	start(t, agentLog, "berth-agent", "run", "--data-dir", agentDir)
	waitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		return err == nil && len(ns) == 1 && ns[0].Status == "connected", fmt.Sprint(ns, err)
	})
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	vf := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(vf, every, 0o600); err != nil {
		t.Fatal(err)
	}
	cl.berthOK(t, cl.token, "", "secret", "set", "default/blob", "--from-file", vf)
	cl.pushBundle(t, env.helloDir, "hello")
	spec := func(ref string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "bin.yaml")
		y := "name: bin\nbundle: hello\ncommand: [\"./hello\"]\nhealth_check: {path: /healthz, interval_s: 1}\nsecrets:\n  BIN: " + ref + "\n"
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if _, errOut, code := cl.berth(t, cl.token, "", "apply", "-f", spec("blob")); code == 0 || !strings.Contains(errOut, "validation_failed") || !strings.Contains(errOut, "BIN") {
		t.Fatalf("a binary value as env: exit %d %s; want validation_failed naming BIN", code, errOut)
	}
	cl.cli(t, "apply", "-f", spec("{secret: blob, as: file}"))
	ids := cl.waitReplicas(t, "bin", 1)
	sf := filepath.Join(agentDir, "workloads", ids[0], "secrets", "BIN")
	got, err := os.ReadFile(sf)
	if err != nil || !bytes.Equal(got, every) {
		t.Fatalf("secret file %s holds %d bytes %x (%v); want every byte value 0x00..0xff", sf, len(got), got, err)
	}
}
