package bindings_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.mongodb.org/mongo-driver/v2/bson"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/pgtest"
)

// One PostgreSQL server and the corestore plugin binary for the package.
var (
	pg        *pgtest.Server
	pluginBin string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "bindings tests: %s: %v\n", what, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "bindings-test-")
	if err != nil {
		return fail("temp dir", err)
	}
	defer os.RemoveAll(tmp)
	bin, err := pgtest.BinDir()
	if err != nil {
		return fail("PostgreSQL", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail("port", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if pg, err = pgtest.StartDir(bin, port, ""); err != nil {
		return fail("PostgreSQL", err)
	}
	defer pg.Stop()
	pluginBin = filepath.Join(tmp, "berth-plugin-corestore")
	if out, err := exec.Command("go", "build", "-o", pluginBin, "github.com/berthhq/berth/cmd/berth-plugin-corestore").CombinedOutput(); err != nil {
		return fail("build the plugin", fmt.Errorf("%w: %s", err, out))
	}
	return m.Run()
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type env struct {
	st    *store.Store
	q     *operations.Queue
	sec   *secrets.Store
	m     *bindings.Manager
	clk   *clock
	ready chan *bindings.Binding
}

// newEnv opens a store, a queue, a secrets store and the real plugin process configured with
// adminURL as its PostgreSQL server.
func newEnv(t *testing.T, adminURL string) *env {
	t.Helper()
	st := storetest.Open(t)
	clk := &clock{t: time.Now().UTC().Truncate(time.Millisecond)} // the store keeps milliseconds
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keys", "secrets.keyring"), true)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"postgres": map[string]string{"admin_url": adminURL}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	prov, err := plugin.LaunchProvider(ctx, plugin.Config{Name: "corestore", Path: pluginBin,
		Args: []string{"--state-dir", t.TempDir()}, PluginConfig: cfg})
	if err != nil {
		t.Fatalf("launch the corestore plugin: %v", err)
	}
	t.Cleanup(func() { _ = prov.Close() })
	e := &env{st: st, clk: clk, ready: make(chan *bindings.Binding, 8)}
	e.q = operations.NewQueue(st, operations.Config{Now: clk.now})
	e.sec = secrets.NewStore(st, kr, clk.now)
	e.m = bindings.New(bindings.Config{Store: st, Queue: e.q, Secrets: e.sec, Provider: prov, Now: clk.now,
		OnReady: func(_ context.Context, b *bindings.Binding) error { e.ready <- b; return nil }})
	return e
}

func (e *env) work(t *testing.T) int {
	t.Helper()
	n, err := e.m.Work(t.Context(), 8)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) secret(t *testing.T, projectID string, ref secrets.Ref) string {
	t.Helper()
	sec, v, err := e.sec.Resolve(t.Context(), projectID, ref.Secret, ref.Version)
	if err != nil {
		t.Fatal(err)
	}
	val, err := e.sec.Open(sec, v)
	if err != nil {
		t.Fatal(err)
	}
	return string(val)
}

func TestValidateRefusesUnknownKindsAndClashes(t *testing.T) {
	for _, c := range []struct {
		specs []bindings.Spec
		code  abierrors.Code
	}{
		{[]bindings.Spec{{Name: "db", Kind: "postgres"}, {Name: "files", Kind: "s3"}, {Name: "cache", Kind: "mongodb"}}, ""},
		{[]bindings.Spec{{Name: "db", Kind: "redis"}}, abierrors.BindingKindUnknown},
		{[]bindings.Spec{{Name: "db", Kind: "postgres"}, {Name: "db", Kind: "s3"}}, abierrors.BindingNameClash},
		{[]bindings.Spec{{Name: "DB", Kind: "postgres"}}, abierrors.BindingNameClash},
		{[]bindings.Spec{{Name: "", Kind: "postgres"}}, abierrors.BindingNameClash},
	} {
		err := bindings.Validate(c.specs)
		if c.code == "" && err != nil || c.code != "" && abierrors.CodeOf(err) != c.code {
			t.Errorf("Validate(%v) = %v, want code %q", c.specs, err, c.code)
		}
		if c.code != "" && c.code.HTTPStatus() != 422 {
			t.Errorf("%s is HTTP %d, want 422", c.code, c.code.HTTPStatus())
		}
	}
}

// TestBindingBecomesReadyWithSealedCredentials: a declared postgres binding runs as an operation
// through the real plugin process; its credentials are sealed secrets that connect to the new
// database; nothing plain is stored; a repeated Declare and Work change nothing.
func TestBindingBecomesReadyWithSealedCredentials(t *testing.T) {
	e := newEnv(t, pg.URL("postgres"))
	ctx := t.Context()
	if err := e.m.Declare(ctx, "prj_1", "shop", "web", []bindings.Spec{{Name: "db", Kind: "postgres"}}); err != nil {
		t.Fatal(err)
	}
	if n := e.work(t); n != 1 {
		t.Fatalf("worked %d operations, want 1", n)
	}
	b, err := e.m.Get(ctx, "prj_1", "web", "db")
	if err != nil {
		t.Fatal(err)
	}
	if b.State != bindings.StateReady || b.Endpoint != pg.Addr() || b.LastError != "" {
		t.Fatalf("binding after work: %+v", b)
	}
	op, err := e.q.Get(ctx, b.OperationID)
	if err != nil || op.State != operations.Succeeded || op.Kind != bindings.KindApply {
		t.Fatalf("operation %+v, %v", op, err)
	}
	select {
	case got := <-e.ready:
		if got.ID != b.ID {
			t.Fatalf("OnReady for %s", got.ID)
		}
	default:
		t.Fatal("OnReady was not called")
	}
	want := []string{"BERTH_BINDING_DB_URL", "BERTH_BINDING_DB_HOST", "BERTH_BINDING_DB_PORT", "BERTH_BINDING_DB_USER", "BERTH_BINDING_DB_PASSWORD", "BERTH_BINDING_DB_DATABASE"}
	for _, k := range want {
		if _, ok := b.Secrets[k]; !ok {
			t.Errorf("secret reference %s missing: %v", k, b.Secrets)
		}
	}
	url := e.secret(t, "prj_1", b.Secrets["BERTH_BINDING_DB_URL"])
	password := e.secret(t, "prj_1", b.Secrets["BERTH_BINDING_DB_PASSWORD"])
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect with the sealed URL: %v", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	// The password is in no binding, operation or secret document in plain.
	for _, coll := range []string{bindings.Collection, "secrets", "operation_keys", "operations_done"} {
		cur, err := e.st.Collection(coll).Find(ctx, bson.M{})
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.M
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(docs)
		if strings.Contains(string(raw), password) {
			t.Fatalf("collection %s holds the password in plain", coll)
		}
	}
	// Again: no new operation, no new secret version.
	if err := e.m.Declare(ctx, "prj_1", "shop", "web", []bindings.Spec{{Name: "db", Kind: "postgres"}}); err != nil {
		t.Fatal(err)
	}
	if n := e.work(t); n != 0 {
		t.Fatalf("a repeated declaration ran %d operations", n)
	}
	b2, _ := e.m.Get(ctx, "prj_1", "web", "db")
	if b2.Secrets["BERTH_BINDING_DB_URL"] != b.Secrets["BERTH_BINDING_DB_URL"] {
		t.Fatalf("a repeated declaration changed the secrets: %v -> %v", b.Secrets, b2.Secrets)
	}
}

// TestServerDownRetriesWithBackoff: with the database server down the apply operation retries
// 5 s, 10 s, 20 s, 40 s, then every 60 s, and the binding shows the reason; once the server is
// back (the plugin pointed at it) the binding becomes ready.
func TestServerDownRetriesWithBackoff(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	e := newEnv(t, "postgres://postgres:x@"+dead+"/postgres?sslmode=disable&connect_timeout=2")
	ctx := t.Context()
	if err := e.m.Declare(ctx, "prj_1", "shop", "web", []bindings.Spec{{Name: "db", Kind: "postgres"}}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 60 * time.Second, 60 * time.Second} {
		if n := e.work(t); n != 1 {
			t.Fatalf("attempt %d: worked %d operations, want 1", i+1, n)
		}
		b, err := e.m.Get(ctx, "prj_1", "web", "db")
		if err != nil {
			t.Fatal(err)
		}
		if b.State != bindings.StateFailed || !strings.Contains(b.LastError, "binding_unavailable") {
			t.Fatalf("attempt %d: binding %s, last error %q; want failed with binding_unavailable", i+1, b.State, b.LastError)
		}
		op, err := e.q.Get(ctx, b.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		if op.State != operations.Retry || !op.AvailableAt.Equal(e.clk.now().Add(want)) {
			t.Fatalf("attempt %d: operation %s available at %s, want retry at now+%s", i+1, op.State, op.AvailableAt.Sub(e.clk.now()), want)
		}
		// Not before its time.
		if n := e.work(t); n != 0 {
			t.Fatalf("attempt %d: the operation ran again before its backoff", i+1)
		}
		e.clk.add(want)
	}
}

func TestBackoffClasses(t *testing.T) {
	var refusals, failures []time.Duration
	for n := 1; n <= 8; n++ {
		refusals = append(refusals, bindings.Backoff(n, true))
		failures = append(failures, bindings.Backoff(n, false))
	}
	s := time.Second
	wantR := []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s}
	wantF := []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, 60 * s, 60 * s, 60 * s, 60 * s}
	if fmt.Sprint(refusals) != fmt.Sprint(wantR) || fmt.Sprint(failures) != fmt.Sprint(wantF) {
		t.Fatalf("refusals %v, failures %v; want %v and %v", refusals, failures, wantR, wantF)
	}
}

// TestReleaseKeepsDataPurgeDrops: a binding the service stops declaring is released with its
// data kept; a purge (fenced by the project's sequence) drops the database.
func TestReleaseKeepsDataPurgeDrops(t *testing.T) {
	e := newEnv(t, pg.URL("postgres"))
	ctx := t.Context()
	if err := e.m.Declare(ctx, "prj_2", "blog", "web", []bindings.Spec{{Name: "db", Kind: "postgres"}}); err != nil {
		t.Fatal(err)
	}
	e.work(t)
	b, _ := e.m.Get(ctx, "prj_2", "web", "db")
	if b.State != bindings.StateReady {
		t.Fatalf("binding %s: %s", b.State, b.LastError)
	}
	dbName := b.Database
	exists := func() bool {
		t.Helper()
		c, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if err := e.m.Declare(ctx, "prj_2", "blog", "web", nil); err != nil {
		t.Fatal(err)
	}
	if n := e.work(t); n != 1 {
		t.Fatalf("release ran %d operations", n)
	}
	b, _ = e.m.Get(ctx, "prj_2", "web", "db")
	if b.State != bindings.StateReleased || !exists() {
		t.Fatalf("after release: state %s, database exists %v; want released and kept", b.State, exists())
	}
	if _, err := e.m.Purge(ctx, "prj_2", "web", "db"); err != nil {
		t.Fatal(err)
	}
	if n := e.work(t); n != 1 {
		t.Fatalf("purge ran %d operations", n)
	}
	b, _ = e.m.Get(ctx, "prj_2", "web", "db")
	if b.State != bindings.StatePurged || exists() {
		t.Fatalf("after purge: state %s (%s), database exists %v", b.State, b.LastError, exists())
	}
	op, _ := e.q.Get(ctx, b.OperationID)
	if op.Kind != bindings.KindPurge || op.Fence == 0 {
		t.Fatalf("purge operation %+v: want kind %s with a fence", op, bindings.KindPurge)
	}
}

// TestSecretNamesAreValidForEveryCredentialKey: the S3 binding's keys (ACCESS_KEY,
// SECRET_KEY) hold an underscore, which a secret name may not; every key of every kind names
// a secret the store accepts, short service names and long ones alike.
func TestSecretNamesAreValidForEveryCredentialKey(t *testing.T) {
	for _, key := range []string{"URL", "HOST", "PORT", "USER", "PASSWORD", "DATABASE", "ACCESS_KEY", "SECRET_KEY", "BUCKET", "ENDPOINT", "REGION"} {
		for _, svc := range []string{"assets", strings.Repeat("s", 40)} {
			if n := bindings.SecretName(svc, "files", key); !secrets.ValidName(n) {
				t.Errorf("SecretName(%s, files, %s) = %q: not a valid secret name", svc, key, n)
			}
		}
	}
}
