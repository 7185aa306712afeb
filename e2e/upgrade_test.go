package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/client"
)

// buildAt builds pkg into out with the release version v stamped, as
// `make build VERSION=v` does.
func buildAt(t *testing.T, out, v, pkg string) {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/berthhq/berth/internal/version.Version="+v, "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s at %s: %v\n%s", pkg, v, err, b)
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func copyExec(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// agentAt enrolls a node named name and runs the agent binary bin (a copy
// only this node uses, since an upgrade replaces it) with the process driver.
func agentAt(t *testing.T, cl *cluster, name, bin string, extra ...string) *proctest.Proc {
	t.Helper()
	jt, err := cl.c.CreateJoinToken(context.Background(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cl.dir, "agent-"+name)
	logPath := filepath.Join(cl.dir, "agent-"+name+".log")
	enroll := proctest.Start(t, logPath, bin, "enroll", "--server", cl.url, "--join-token", jt.Token,
		"--fingerprint", cl.fingerprint, "--data-dir", dir, "--label", "name="+name)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll %s exited %d:\n%s", name, code, readFile(t, logPath))
	}
	cmd := exec.Command(bin, append([]string{"run", "--data-dir", dir, "--plugin-dir", env.bin}, extra...)...)
	cmd.Env = append(os.Environ(), allowTestDrivers) // for the agents on --driver fake
	p := proctest.StartCmd(t, logPath, cmd)
	t.Cleanup(func() {
		if t.Failed() {
			b := readFile(t, logPath)
			if len(b) > 12000 {
				b = b[len(b)-12000:]
			}
			t.Logf("---- agent %s (tail) ----\n%s", name, b)
		}
	})
	return p
}

func (cl *cluster) nodeNamed(t *testing.T, name string) client.Node {
	t.Helper()
	ns, err := cl.c.ListNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Labels["name"] == name {
			return n
		}
	}
	return client.Node{}
}

// TestAgentUpgradeSkewAndRollback runs real binaries built at several
// versions (docs/upgrades.md): berthd 0.4.0 accepts an agent 0.3.0 (one minor
// behind) and refuses one at 0.2.0 with agent_version_skew; `berth node
// upgrade` takes the 0.3.0 agent to 0.4.0 in place without restarting its
// workload; a downgrade is refused; a release whose file no longer matches
// its SHA-256 is refused and nothing is replaced; a forced upgrade to 0.5.0,
// which this core refuses, is rolled back to 0.4.0 by the agent itself.
func TestAgentUpgradeSkewAndRollback(t *testing.T) {
	t.Parallel()
	builds := t.TempDir()
	rel := filepath.Join(builds, "releases")
	if err := os.MkdirAll(rel, 0o755); err != nil {
		t.Fatal(err)
	}
	berthd := filepath.Join(builds, "berthd-0.4.0")
	buildAt(t, berthd, "0.4.0", "./cmd/berthd")
	agents := map[string]string{}
	platform := goruntime.GOOS + "-" + goruntime.GOARCH
	for _, v := range []string{"0.2.0", "0.3.0", "0.4.0", "0.5.0"} {
		agents[v] = filepath.Join(builds, "berth-agent-"+v)
		buildAt(t, agents[v], v, "./cmd/berth-agent")
	}
	for _, v := range []string{"0.4.0", "0.5.0"} {
		copyExec(t, agents[v], filepath.Join(rel, "berth-agent-"+v+"-"+platform))
	}

	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t)}
	t.Cleanup(func() { cl.killWorkloads(t); cl.killGateway(t) })
	cl.berthd = proctest.Start(t, filepath.Join(cl.dir, "berthd.log"), berthd,
		"--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api, "--gateway-listen", cl.gateway,
		"--plugin-dir", env.bin, "--release-dir", rel, "--log-level", "debug", "--sweep-floor", "1s")
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	cl.fingerprint, cl.token = d.Fingerprint, d.Token
	var err error
	if cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b := readFile(t, filepath.Join(cl.dir, "berthd.log"))
			if len(b) > 12000 {
				b = b[len(b)-12000:]
			}
			t.Logf("---- berthd (tail) ----\n%s", b)
		}
	})
	if out := cl.cli(t, "--version"); !strings.HasPrefix(out, "berth ") {
		t.Fatalf("berth --version: %q", out)
	}

	// An agent one minor behind the core is welcomed.
	nodeBin := filepath.Join(cl.dir, "node-bin")
	if err := os.MkdirAll(nodeBin, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(nodeBin, "berth-agent")
	copyExec(t, agents["0.3.0"], exe)
	agentAt(t, cl, "old", exe, "--upgrade-confirm-window", "5s")
	waitFor(t, converge, "agent 0.3.0 connected", func() (bool, string) {
		n := cl.nodeNamed(t, "old")
		return n.Status == "connected" && n.AgentVersion == "0.3.0", fmt.Sprintf("%+v", n)
	})
	id := cl.nodeNamed(t, "old").ID

	// An agent two minors behind is refused, fatally.
	tooOld := agentAt(t, cl, "ancient", agents["0.2.0"])
	waitFor(t, converge, "agent 0.2.0 refused", func() (bool, string) {
		log := string(readFile(t, tooOld.LogPath()))
		return strings.Contains(log, "agent_version_skew"), log
	})
	if n := cl.nodeNamed(t, "ancient"); n.Status == "connected" {
		t.Fatalf("agent 0.2.0 connected to berthd 0.4.0: %+v", n)
	}

	// A workload that must outlive every agent restart below.
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)
	before := fmt.Sprint(cl.workloadPIDs(t))

	// The upgrade to 0.4.0.
	var res []struct {
		NodeID, From, To, State, Error string
		DurationMS                     int64 `json:"duration_ms"`
	}
	if err := json.Unmarshal([]byte(cl.cli(t, "node", "upgrade", id, "--version", "0.4.0", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].State != "upgraded" || res[0].From != "0.3.0" || res[0].To != "0.4.0" {
		t.Fatalf("upgrade answer %+v", res)
	}
	t.Logf("agent upgrade 0.3.0 -> 0.4.0 took %d ms", res[0].DurationMS)
	if n := cl.nodeNamed(t, "old"); n.AgentVersion != "0.4.0" || n.Status != "connected" {
		t.Fatalf("node after the upgrade: %+v", n)
	}
	if got, want := fileSum(t, exe), fileSum(t, agents["0.4.0"]); got != want {
		t.Fatalf("binary after the upgrade is %s, want the 0.4.0 release %s", got, want)
	}
	if got, want := fileSum(t, exe+".prev"), fileSum(t, agents["0.3.0"]); got != want {
		t.Fatalf(".prev is %s, want the 0.3.0 binary %s", got, want)
	}
	if after := fmt.Sprint(cl.workloadPIDs(t)); after != before {
		t.Fatalf("the upgrade restarted workloads: before %s, after %s", before, after)
	}
	// Repeating it changes nothing.
	if out := cl.cli(t, "node", "upgrade", id, "--version", "0.4.0"); !strings.Contains(out, "unchanged") {
		t.Fatalf("repeated upgrade:\n%s", out)
	}

	// A downgrade is refused unless forced.
	if out := cl.cliFails(t, "node", "upgrade", id, "--version", "0.3.0"); !strings.Contains(out, "agent_downgrade") {
		t.Fatalf("downgrade: %s", out)
	}
	// An upgrade ahead of the core is refused unless forced.
	if out := cl.cliFails(t, "node", "upgrade", id, "--version", "0.5.0"); !strings.Contains(out, "agent_version_skew") {
		t.Fatalf("upgrade ahead of the core: %s", out)
	}

	// The 0.5.0 file is altered after berthd hashed it (same size and
	// modification time): the agent refuses it and keeps its binary.
	relFile := filepath.Join(rel, "berth-agent-0.5.0-"+platform)
	orig, err := os.ReadFile(relFile)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := os.Stat(relFile)
	tampered := append([]byte(nil), orig...)
	tampered[len(tampered)/2] ^= 0xff
	if err := os.WriteFile(relFile, tampered, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(relFile, info.ModTime(), info.ModTime())
	if out := cl.cliFails(t, "node", "upgrade", id, "--version", "0.5.0", "--force"); !strings.Contains(out, "digest_mismatch") {
		t.Fatalf("tampered release: %s", out)
	}
	if got, want := fileSum(t, exe), fileSum(t, agents["0.4.0"]); got != want {
		t.Fatal("a tampered release replaced the binary")
	}
	if err := os.WriteFile(relFile, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(relFile, info.ModTime(), info.ModTime())

	// Forced to 0.5.0, which berthd 0.4.0 refuses: the agent is never
	// welcomed, rolls back to .prev within its window and comes back at 0.4.0.
	if out := cl.cliFails(t, "node", "upgrade", id, "--version", "0.5.0", "--force"); !strings.Contains(out, "upgrade_failed") {
		t.Fatalf("forced upgrade to a refused version: %s", out)
	}
	if n := cl.nodeNamed(t, "old"); n.AgentVersion != "0.4.0" || n.Status != "connected" {
		t.Fatalf("node after the rollback: %+v", n)
	}
	if got, want := fileSum(t, exe), fileSum(t, agents["0.4.0"]); got != want {
		t.Fatalf("binary after the rollback is %s, want the 0.4.0 one", got)
	}
	if after := fmt.Sprint(cl.workloadPIDs(t)); after != before {
		t.Fatalf("the rollback restarted workloads: before %s, after %s", before, after)
	}
	cl.waitAnswering(t, "hello.localhost", ids)
}

// coreEvent is the part of a GET /api/v1/events item the fleet test reads.
type coreEvent struct {
	Seq   int64 `json:"seq"`
	Event struct {
		Type    string `json:"type"`
		Subject struct {
			ID string `json:"id"`
		} `json:"subject"`
	} `json:"event"`
}

// TestFleetUpgradeMaxParallel upgrades ten real agents with `berth node
// upgrade --all --max-parallel 2` and checks, in berthd's own event log
// (ordered by seq), that no more than two of them were away at once: each
// node.disconnected opens a node's restart and its next node.connected
// closes it.
func TestFleetUpgradeMaxParallel(t *testing.T) {
	t.Parallel()
	const nodes = 10
	builds := t.TempDir()
	rel := filepath.Join(builds, "releases")
	if err := os.MkdirAll(rel, 0o755); err != nil {
		t.Fatal(err)
	}
	platform := goruntime.GOOS + "-" + goruntime.GOARCH
	old := filepath.Join(builds, "berth-agent-0.3.0")
	buildAt(t, old, "0.3.0", "./cmd/berth-agent")
	buildAt(t, filepath.Join(rel, "berth-agent-0.4.0-"+platform), "0.4.0", "./cmd/berth-agent")

	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t)}
	cl.berthd = start(t, filepath.Join(cl.dir, "berthd.log"), "berthd",
		"--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api, "--gateway-listen", "off",
		"--release-dir", rel, "--log-level", "info")
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	cl.fingerprint, cl.token = d.Fingerprint, d.Token
	var err error
	if cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint)); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		dir := filepath.Join(cl.dir, fmt.Sprintf("node-bin-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		exe := filepath.Join(dir, "berth-agent")
		copyExec(t, old, exe)
		agentAt(t, cl, fmt.Sprintf("n%d", i), exe, "--driver", "fake")
	}
	waitFor(t, 2*converge, "ten agents 0.3.0 connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(context.Background())
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, nd := range ns {
			if nd.Status == "connected" && nd.AgentVersion == "0.3.0" {
				n++
			}
		}
		return n == nodes, fmt.Sprintf("%d connected", n)
	})
	events := func() []coreEvent {
		var out struct {
			Items []coreEvent `json:"items"`
		}
		req, _ := http.NewRequest(http.MethodGet, cl.url+"/api/v1/events?limit=1000", nil)
		req.Header.Set("Authorization", "Bearer "+cl.token)
		resp, err := d.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Items
	}
	mark := int64(0)
	for _, e := range events() {
		mark = max(mark, e.Seq)
	}

	var res []struct {
		NodeID, State, Error string
	}
	if err := json.Unmarshal([]byte(cl.cli(t, "node", "upgrade", "--all", "--max-parallel", "2", "--version", "0.4.0", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != nodes {
		t.Fatalf("%d results, want %d: %+v", len(res), nodes, res)
	}
	for _, r := range res {
		if r.State != "upgraded" {
			t.Fatalf("node %s: %s %s", r.NodeID, r.State, r.Error)
		}
	}
	away, most, restarts := map[string]bool{}, 0, 0
	evs := events()
	sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	for _, e := range evs {
		if e.Seq <= mark {
			continue
		}
		switch e.Event.Type {
		case "node.disconnected":
			away[e.Event.Subject.ID] = true
			restarts++
		case "node.connected":
			delete(away, e.Event.Subject.ID)
		}
		most = max(most, len(away))
	}
	if most > 2 || most == 0 {
		t.Fatalf("at most %d agents were away at once during the upgrade (%d restarts seen), want 1 or 2", most, restarts)
	}
	t.Logf("%d restarts seen, at most %d agents away at once", restarts, most)
	ns, _ := cl.c.ListNodes(context.Background())
	for _, n := range ns {
		if n.AgentVersion != "0.4.0" || n.Status != "connected" {
			t.Fatalf("node after the fleet upgrade: %+v", n)
		}
	}
}

// TestDriverPluginUpgrade replaces a node's process driver plugin, built at
// 0.4.0 and 0.4.1, with `berth node upgrade --program berth-plugin-process`:
// the agent swaps the plugin's file, restarts to relaunch it, and the new
// plugin recovers the running workload instead of restarting it.
func TestDriverPluginUpgrade(t *testing.T) {
	t.Parallel()
	builds := t.TempDir()
	rel := filepath.Join(builds, "releases")
	plugins := filepath.Join(builds, "plugins")
	for _, d := range []string{rel, plugins} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	platform := goruntime.GOOS + "-" + goruntime.GOARCH
	plug := filepath.Join(plugins, "berth-plugin-process")
	buildAt(t, plug, "0.4.0", "./cmd/berth-plugin-process")
	newPlug := filepath.Join(rel, "berth-plugin-process-0.4.1-"+platform)
	buildAt(t, newPlug, "0.4.1", "./cmd/berth-plugin-process")

	cl := &cluster{dir: t.TempDir(), api: proctest.FreeAddr(t), gateway: proctest.FreeAddr(t)}
	t.Cleanup(func() { cl.killWorkloads(t); cl.killGateway(t) })
	cl.berthd = start(t, filepath.Join(cl.dir, "berthd.log"), "berthd",
		"--data-dir", filepath.Join(cl.dir, "berthd"), "--listen", cl.api, "--gateway-listen", cl.gateway,
		"--release-dir", rel, "--log-level", "info", "--sweep-floor", "1s")
	cl.url = "https://" + cl.api
	d := proctest.WaitBerthdReady(t, cl.berthd, filepath.Join(cl.dir, "berthd"), cl.url, 60*time.Second)
	cl.fingerprint, cl.token = d.Fingerprint, d.Token
	var err error
	if cl.c, err = client.New(cl.url, client.WithToken(cl.token), client.WithFingerprint(cl.fingerprint)); err != nil {
		t.Fatal(err)
	}
	agentAt(t, cl, "p", filepath.Join(env.bin, "berth-agent"), "--plugin-dir", plugins)
	waitFor(t, converge, "node connected", func() (bool, string) {
		n := cl.nodeNamed(t, "p")
		return n.Status == "connected", fmt.Sprintf("%+v", n)
	})
	id := cl.nodeNamed(t, "p").ID
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	writeSpec(t, spec, 1)
	cl.cli(t, "apply", "-f", spec)
	ids := cl.waitReplicas(t, "hello", 1)
	before := fmt.Sprint(cl.workloadPIDs(t))

	var res []struct{ NodeID, From, To, State, Error string }
	if err := json.Unmarshal([]byte(cl.cli(t, "node", "upgrade", id, "--program", "berth-plugin-process", "--version", "0.4.1", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].State != "upgraded" || res[0].From != "0.4.0" || res[0].To != "0.4.1" {
		t.Fatalf("plugin upgrade answer %+v", res)
	}
	if got, want := fileSum(t, plug), fileSum(t, newPlug); got != want {
		t.Fatalf("plugin binary is %s after the upgrade, want the 0.4.1 release %s", got, want)
	}
	if after := fmt.Sprint(cl.workloadPIDs(t)); after != before {
		t.Fatalf("the plugin upgrade restarted workloads: before %s, after %s", before, after)
	}
	cl.waitAnswering(t, "hello.localhost", ids)
	if out := cl.cli(t, "node", "upgrade", id, "--program", "berth-plugin-process", "--version", "0.4.1"); !strings.Contains(out, "unchanged") {
		t.Fatalf("repeated plugin upgrade:\n%s", out)
	}
	if out := cl.cliFails(t, "node", "upgrade", id, "--program", "berth-plugin-process", "--version", "0.4.0"); !strings.Contains(out, "agent_downgrade") {
		t.Fatalf("plugin downgrade: %s", out)
	}
}

// TestEveryBinaryPrintsItsVersion: each binary of the build answers
// --version with "<program> <semantic version> <go version> <os>/<arch>"
// and exits 0 (docs/upgrades.md section 1).
func TestEveryBinaryPrintsItsVersion(t *testing.T) {
	t.Parallel()
	ents, err := os.ReadDir(env.bin)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "berth") || strings.Contains(name, ".") || e.IsDir() {
			continue
		}
		seen++
		out, err := exec.Command(filepath.Join(env.bin, name), "--version").Output()
		if err != nil {
			t.Errorf("%s --version: %v", name, err)
			continue
		}
		f := strings.Fields(string(out))
		if len(f) != 4 || f[0] != name || !strings.HasPrefix(f[2], "go") || f[3] != goruntime.GOOS+"/"+goruntime.GOARCH {
			t.Errorf("%s --version printed %q", name, out)
			continue
		}
		if _, err := version.Parse(f[1]); err != nil {
			t.Errorf("%s --version: %v", name, err)
		}
	}
	if seen < 8 {
		t.Fatalf("found %d berth binaries in %s, want berthd, berth, berth-agent and the five plugins", seen, env.bin)
	}
}
