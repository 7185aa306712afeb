package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/client"
)

// buildAgentAt builds cmd/berth-agent with version v stamped into out.
func buildAgentAt(b *testing.B, out, v string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/berthhq/berth/internal/version.Version="+v, "-o", out, "./cmd/berth-agent")
	cmd.Dir = moduleRoot(b)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build berth-agent %s: %v\n%s", v, err, o)
	}
}

// BenchmarkAgentUpgrade measures one node's agent upgrade end to end
// (docs/upgrades.md section 3): POST /nodes/{id}/upgrade until berthd has the
// node back on a new session at the new version. Each iteration moves the
// agent between two real builds, 0.4.0 and 0.4.1 (the way back forced), with
// the process driver and no workloads. Figure: agent_upgrade ms per node.
func BenchmarkAgentUpgrade(b *testing.B) {
	bin := binaries(b)
	builds := b.TempDir()
	rel := filepath.Join(builds, "releases")
	if err := os.MkdirAll(rel, 0o755); err != nil {
		b.Fatal(err)
	}
	platform := goruntime.GOOS + "-" + goruntime.GOARCH
	versions := []string{"0.4.0", "0.4.1"}
	for _, v := range versions {
		buildAgentAt(b, filepath.Join(rel, "berth-agent-"+v+"-"+platform), v)
	}
	cl := startApplyCluster(b, bin, 0, "--release-dir", rel)
	nodeBin := filepath.Join(cl.dir, "node-bin")
	if err := os.MkdirAll(nodeBin, 0o755); err != nil {
		b.Fatal(err)
	}
	exe := filepath.Join(nodeBin, "berth-agent")
	raw, err := os.ReadFile(filepath.Join(rel, "berth-agent-0.4.0-"+platform))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(exe, raw, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		b.Fatal(err)
	}
	data := filepath.Join(cl.dir, "agent")
	logPath := filepath.Join(cl.dir, "agent.log")
	enroll := proctest.Start(b, logPath, exe, "enroll", "--server", cl.url, "--join-token", jt.Token, "--fingerprint", cl.fp, "--data-dir", data)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		log, _ := os.ReadFile(logPath)
		b.Fatalf("enroll exited %d:\n%s", code, log)
	}
	cl.agents = append(cl.agents, proctest.Start(b, logPath, exe, "run", "--data-dir", data, "--plugin-dir", bin, "--driver", "process"))
	var id string
	waitUntil(b, applyLimit, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		id = ns[0].ID
		return ns[0].Status == "connected" && ns[0].AgentVersion == "0.4.0", fmt.Sprintf("%+v", ns[0])
	})
	var total time.Duration
	b.ResetTimer()
	for i := range b.N {
		to := versions[(i+1)%2]
		start := time.Now()
		res, err := cl.c.UpgradeNode(ctx, id, client.UpgradeRequest{Version: to, Force: true})
		if err != nil {
			log, _ := os.ReadFile(logPath)
			b.Fatalf("upgrade %d to %s: %v\n%s", i, to, err, log)
		}
		total += time.Since(start)
		if res.State != "upgraded" || res.To != to {
			b.Fatalf("upgrade %d: %+v", i, res)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "agent_upgrade_ms/node")
}
