// Package corestore runs service bindings end to end: berthd with the corestore plugin, a real
// PostgreSQL 15, an agent with the process driver, and a service whose workload gets its own
// database and credentials as secrets in its environment.
package corestore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthhq/berth/internal/ferrettest"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// env holds what TestMain made: the binaries, the hello bundle and the PostgreSQL server.
var env struct {
	bin         string
	helloDir    string
	minifluxDir string // holds miniflux.app, built from its module path
	pg          *pgtest.Server
	ferret      *ferrettest.Server // a MongoDB-wire server (FerretDB on SQLite)
	s3          *s3test.Server     // versitygw with its admin API
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "e2e/corestore: %s: %v\n", what, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "berth-e2e-corestore-")
	if err != nil {
		return fail("temp dir", err)
	}
	defer os.RemoveAll(tmp)
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fail("go env GOMOD", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	build := func(out string, pkgs ...string) error {
		cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %v: %w\n%s", pkgs, err, b)
		}
		return nil
	}
	env.bin = os.Getenv("BERTH_BIN_DIR")
	if env.bin == "" {
		env.bin = filepath.Join(tmp, "bin")
		if err := build(env.bin+"/", "./cmd/..."); err != nil {
			return fail("build", err)
		}
	}
	env.helloDir = filepath.Join(tmp, "hello")
	if err := build(filepath.Join(env.helloDir, "hello"), "./examples/apps/hello"); err != nil {
		return fail("build", err)
	}
	// A third-party app on PostgreSQL, built by its module path (not a dependency of ours).
	env.minifluxDir = filepath.Join(tmp, "miniflux")
	mf := exec.Command("go", "install", minifluxModule)
	mf.Env = append(os.Environ(), "GOBIN="+env.minifluxDir)
	if b, err := mf.CombinedOutput(); err != nil {
		return fail("go install "+minifluxModule, fmt.Errorf("%w\n%s", err, b))
	}
	pgBin, err := pgtest.BinDir()
	if err != nil {
		return fail("PostgreSQL", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail("port", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if env.pg, err = pgtest.StartDir(pgBin, port, ""); err != nil {
		return fail("PostgreSQL", err)
	}
	defer env.pg.Stop()
	ferretBin, err := ferrettest.Build(tmp)
	if err != nil {
		return fail("FerretDB", err)
	}
	free := func() (string, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer l.Close()
		return l.Addr().String(), nil
	}
	addr, err := free()
	if err != nil {
		return fail("port", err)
	}
	for _, d := range []string{"ferret", "s3", "iam"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o700); err != nil {
			return fail("server directories", err)
		}
	}
	if env.ferret, err = ferrettest.StartSQLite(ferretBin, addr, filepath.Join(tmp, "ferret")); err != nil {
		return fail("FerretDB", err)
	}
	defer env.ferret.Stop()
	s3Bin, err := s3test.BinaryPath()
	if err != nil {
		return fail("versitygw", err)
	}
	if addr, err = free(); err != nil {
		return fail("port", err)
	}
	if env.s3, err = s3test.StartDirIAM(s3Bin, addr, filepath.Join(tmp, "s3"), filepath.Join(tmp, "iam")); err != nil {
		return fail("versitygw", err)
	}
	defer env.s3.Stop()
	return m.Run()
}

const converge = 90 * time.Second

// minifluxModule is the third-party app the backup test keeps alive across a lost database.
const minifluxModule = "miniflux.app/v2@v2.3.5"

// workloadEnv returns the environment of the processes (working directory under dir) that
// run workload ids, by workload id.
func workloadEnv(t *testing.T, dir string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := map[string]string{}
		for _, kv := range bytes.Split(raw, []byte{0}) {
			if k, v, ok := strings.Cut(string(kv), "="); ok {
				vars[k] = v
			}
		}
		if id := vars["BERTH_WORKLOAD_ID"]; id != "" {
			vars["PID"] = e.Name()
			out[id] = vars
		}
	}
	return out
}

// TestServiceGetsItsDatabase: a service declaring a postgres binding gets a database of its own
// made by the corestore plugin through an operation; the credentials are sealed secrets that
// reach the workload's environment (and no API answer); writes and reads through them work;
// and an apply without the binding releases it while its data stays.
func TestServiceGetsItsDatabase(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, map[string]any{"postgres": map[string]any{"admin_url": env.pg.URL("postgres")}})
	c, ctx := p.c, t.Context()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, env.helloDir, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		t.Fatal(err)
	}
	spec := client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"}, Bindings: []client.BindingSpec{{Name: "db", Kind: "postgres"}}}
	if _, err := c.ApplyService(ctx, "default", "web", spec); err != nil {
		t.Fatal(err)
	}
	var b client.ServiceBinding
	proctest.WaitFor(t, converge, "binding db ready", func() (bool, string) {
		bs, err := c.ListServiceBindings(ctx, "default", "web")
		if err != nil || len(bs) != 1 {
			return false, fmt.Sprint(bs, err)
		}
		b = bs[0]
		return b.State == "ready", b.State + " " + b.LastError
	})
	if b.Endpoint != env.pg.Addr() || b.Database == "" {
		t.Fatalf("binding %+v: want endpoint %s and a database", b, env.pg.Addr())
	}
	var vars map[string]string
	proctest.WaitFor(t, converge, "a workload with the binding's environment", func() (bool, string) {
		for _, v := range workloadEnv(t, p.dir) {
			if v["BERTH_BINDING_DB_URL"] != "" {
				vars = v
				return true, ""
			}
		}
		return false, fmt.Sprint(len(workloadEnv(t, p.dir)), " workloads without it")
	})
	for _, k := range []string{"HOST", "PORT", "USER", "PASSWORD", "DATABASE"} {
		if vars["BERTH_BINDING_DB_"+k] == "" {
			t.Errorf("BERTH_BINDING_DB_%s missing from the workload's environment", k)
		}
	}
	if vars["BERTH_BINDING_DB_DATABASE"] != b.Database {
		t.Fatalf("workload database %q, binding %q", vars["BERTH_BINDING_DB_DATABASE"], b.Database)
	}
	conn, err := pgx.Connect(ctx, vars["BERTH_BINDING_DB_URL"])
	if err != nil {
		t.Fatalf("connect with the workload's URL: %v", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	var body string
	if err := conn.QueryRow(ctx, "SELECT body FROM notes").Scan(&body); err != nil || body != "kept" {
		t.Fatalf("read back %q, %v", body, err)
	}
	conn.Close(ctx)
	// No API answer carries the password.
	password := vars["BERTH_BINDING_DB_PASSWORD"]
	svc, err := c.GetService(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := c.ListServiceBindings(ctx, "default", "")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal([]any{svc, bs})
	if strings.Contains(string(raw), password) {
		t.Fatalf("an API answer carries the binding's password")
	}
	// Dropped from the spec: released, the data kept.
	spec.Bindings = nil
	if _, err := c.ApplyService(ctx, "default", "web", spec); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, converge, "binding db released", func() (bool, string) {
		bs, err := c.ListServiceBindings(ctx, "default", "web")
		if err != nil || len(bs) != 1 {
			return false, fmt.Sprint(bs, err)
		}
		op := bs[0].OperationID
		ops, err := c.ListOperations(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		for _, o := range ops {
			if o.ID == op {
				return bs[0].State == "released" && o.State == "succeeded", o.Kind + " " + o.State
			}
		}
		return false, "operation " + op + " not listed"
	})
	admin, err := pgx.Connect(ctx, env.pg.URL(b.Database))
	if err != nil {
		t.Fatalf("the released database is gone: %v", err)
	}
	defer admin.Close(ctx)
	if err := admin.QueryRow(ctx, "SELECT body FROM notes").Scan(&body); err != nil || body != "kept" {
		t.Fatalf("released database lost its rows: %q, %v", body, err)
	}
}

// platform is one berthd with the corestore plugin and one enrolled agent
// running the process driver, for one test.
type platform struct {
	dir, data, url string
	berthd         proctest.Berthd
	c              *client.Client
}

// startPlatform starts berthd with conf as its corestore configuration
// (written 0600) and enrols and runs one agent; everything, the workloads
// included, is stopped when t ends, and the logs' tails are shown if it
// failed.
func startPlatform(t *testing.T, conf map[string]any) *platform {
	t.Helper()
	p := &platform{dir: t.TempDir()}
	api := proctest.FreeAddr(t)
	t.Cleanup(func() {
		for _, vars := range workloadEnv(t, p.dir) {
			if pid, err := strconv.Atoi(vars["PID"]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	raw, _ := json.Marshal(conf)
	confPath := filepath.Join(p.dir, "corestore.json")
	if err := os.WriteFile(confPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p.data = filepath.Join(p.dir, "berthd")
	berthd := proctest.Start(t, filepath.Join(p.dir, "berthd.log"), filepath.Join(env.bin, "berthd"),
		"--data-dir", p.data, "--listen", api, "--gateway-listen", "off", "--sweep-floor", "1s", "--corestore-config", confPath)
	proctest.LogTailsOnFailure(t, p.dir, "berthd.log", "agent.log")
	p.url = "https://" + api
	p.berthd = proctest.WaitBerthdReady(t, berthd, p.data, p.url, 60*time.Second)
	var err error
	if p.c, err = client.New(p.url, client.WithToken(p.berthd.Token), client.WithFingerprint(p.berthd.Fingerprint)); err != nil {
		t.Fatal(err)
	}
	jt, err := p.c.CreateJoinToken(t.Context(), client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir, agentLog := filepath.Join(p.dir, "agent"), filepath.Join(p.dir, "agent.log")
	enroll := proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "enroll", "--server", p.url, "--join-token", jt.Token,
		"--fingerprint", p.berthd.Fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("enroll exited %d", code)
	}
	proctest.Start(t, agentLog, filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", agentDir)
	return p
}
