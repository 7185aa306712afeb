package scripts_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/proctest"
)

// runLocal is one scripts/run-local.sh started the way a terminal runs make
// run: in its own process group, which Ctrl-C signals as a whole.
type runLocal struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
}

func (r *runLocal) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(p)
}

func (r *runLocal) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// signal sends sig to the script's process group, as the terminal does.
func (r *runLocal) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-r.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

func (r *runLocal) waitOutput(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	proctest.WaitFor(t, timeout, "run-local.sh to print "+strconv.Quote(want), func() (bool, string) {
		out := r.output()
		if strings.Contains(out, want) {
			return true, ""
		}
		select {
		case <-r.done:
			t.Fatalf("run-local.sh exited (%v) before printing %q:\n%s", r.err, want, out)
		default:
		}
		return false, out
	})
}

func (r *runLocal) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(timeout):
		t.Fatalf("run-local.sh did not exit within %s:\n%s", timeout, r.output())
		return nil
	}
}

// processesUnder lists the processes (other than this test) whose command line
// names dir or whose working directory is under it.
func processesUnder(dir string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.ReplaceAll(string(raw), "\x00", " ")
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if strings.Contains(args, dir) || strings.HasPrefix(cwd+"/", dir+"/") {
			found = append(found, e.Name()+": "+args)
		}
	}
	return found
}

// TestRunLocalSurvivesASecondInterruptAndCleansLeftovers runs scripts/run-local.sh
// (process runtime) four times in one run directory: a Ctrl-C followed by a second
// one while it stops leaves no process behind; a run killed outright leaves
// berthd, the agent, the gateway and the apps, and the next run stops them and
// starts instead of reporting its ports in use, leaving hello as the operator last
// changed it (the examples are applied only when missing); a run with another BERTH_LISTEN
// than the node was enrolled with refuses and names FRESH=1.
func TestRunLocalSurvivesASecondInterruptAndCleansLeftovers(t *testing.T) {
	root := moduleRoot(t)
	if _, err := os.Stat(filepath.Join(root, "core", "routes", "default_routes.wasm")); err != nil {
		t.Fatalf("berthd embeds the default route compiler: make build first (%v)", err)
	}
	tmp := t.TempDir()
	runDir := filepath.Join(tmp, "run")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The binaries of BERTH_BIN_DIR (make test's), else built here; the bundles as make bundles builds them.
	bin := os.Getenv("BERTH_BIN_DIR")
	builds := [][]string{
		{"-o", "build/bundles/hello/hello", "./examples/apps/hello"},
		{"-o", "build/bundles/httpbin/go-httpbin", "github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin"},
	}
	if bin == "" {
		bin = filepath.Join(tmp, "bin")
		builds = append(builds, []string{"-o", bin + "/", "./cmd/berth", "./cmd/berthd", "./cmd/berth-agent", "./cmd/berth-plugin-gateway", "./cmd/berth-plugin-process"})
	}
	for i, b := range builds {
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, b...)...)
		cmd.Dir = root
		if i < 2 {
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", b, err, out)
		}
	}
	t.Cleanup(func() {
		// Whatever a failed step left: every process of this run directory.
		for range 3 {
			left := processesUnder(runDir)
			if len(left) == 0 {
				return
			}
			for _, p := range left {
				pid, _ := strconv.Atoi(p[:strings.Index(p, ":")])
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	api, gateway := proctest.FreeAddr(t), proctest.FreeAddr(t)
	start := func(listen string) *runLocal {
		r := &runLocal{done: make(chan struct{})}
		r.cmd = exec.Command(filepath.Join(root, "scripts", "run-local.sh"))
		r.cmd.Dir = root
		r.cmd.Env = append(os.Environ(), "BERTH_RUN_DIR="+runDir, "BERTH_BIN_DIR="+bin, "BERTH_LISTEN="+listen,
			"BERTH_GATEWAY_LISTEN="+gateway, "BERTH_RUNTIME=process", "BERTH_RUN_FRESH=")
		r.cmd.Stdout, r.cmd.Stderr = r, r
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { r.err = r.cmd.Wait(); close(r.done) }()
		t.Cleanup(func() {
			select {
			case <-r.done:
			default:
				_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
				<-r.done
			}
		})
		return r
	}
	const ready = "Press Ctrl-C to stop everything"

	// berth runs the CLI against this run's berthd.
	berth := func(stdin string, args ...string) string {
		t.Helper()
		token, err := os.ReadFile(filepath.Join(runDir, "berthd", "admin-token"))
		if err != nil {
			t.Fatal(err)
		}
		fp, err := os.ReadFile(filepath.Join(runDir, "berthd", "server-fingerprint"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "berth"), args...)
		cmd.Env = append(os.Environ(), "BERTH_SERVER=https://"+api, "BERTH_TOKEN="+strings.TrimSpace(string(token)),
			"BERTH_FINGERPRINT="+strings.TrimSpace(string(fp)))
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("berth %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	r := start(api)
	r.waitOutput(t, ready, 3*time.Minute)
	// The operator changes hello; no later start of this run directory may undo that.
	hello, err := os.ReadFile(filepath.Join(root, "examples", "services", "hello.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(hello), "GREETING: hello", "GREETING: changed-by-the-operator", 1)
	berth(changed, "apply", "-f", "-")
	r.signal(t, syscall.SIGINT)
	r.waitOutput(t, "==> stopping", time.Minute)
	r.signal(t, syscall.SIGINT)
	_ = r.waitExit(t, 2*time.Minute)
	if left := processesUnder(runDir); len(left) > 0 {
		t.Fatalf("after a second Ctrl-C during the cleanup these still run:\n%s\nrun-local.sh said:\n%s", strings.Join(left, "\n"), r.output())
	}

	r = start(api)
	r.waitOutput(t, ready, 3*time.Minute)
	r.signal(t, syscall.SIGKILL)
	_ = r.waitExit(t, time.Minute)
	if left := processesUnder(runDir); len(left) == 0 {
		t.Fatal("a killed run left no process behind: the next step would prove nothing")
	}
	r = start(api)
	r.waitOutput(t, ready, 3*time.Minute)
	if !strings.Contains(r.output(), "earlier run") {
		t.Errorf("the run after a killed one did not say it stopped the leftovers:\n%s", r.output())
	}
	if out := berth("", "describe", "service", "hello"); !strings.Contains(out, "changed-by-the-operator") {
		t.Errorf("a later run undid the operator's change of hello:\n%s\nrun-local.sh said:\n%s", out, r.output())
	}
	r.signal(t, syscall.SIGINT)
	_ = r.waitExit(t, 2*time.Minute)
	if left := processesUnder(runDir); len(left) > 0 {
		t.Fatalf("after Ctrl-C these still run:\n%s", strings.Join(left, "\n"))
	}

	r = start(proctest.FreeAddr(t))
	if err := r.waitExit(t, 2*time.Minute); err == nil || !strings.Contains(r.output(), "FRESH=1") {
		t.Errorf("a run with another BERTH_LISTEN than the node's enrollment: exit %v, want a refusal naming FRESH=1:\n%s", err, r.output())
	}
	if left := processesUnder(runDir); len(left) > 0 {
		t.Fatalf("after the refused run these still run:\n%s", strings.Join(left, "\n"))
	}
}
