package corestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/internal/ferrettest"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/plugins/corestore"

	"github.com/berthhq/berth/internal/proctest"
)

// One PostgreSQL, one FerretDB and one versitygw (with IAM) for the package,
// and the plugin binary, made in TestMain.
var servers struct {
	pg     *pgtest.Server
	ferret *ferrettest.Server
	s3     *s3test.Server
	bin    string
}

func freeAddr() (string, error) { return proctest.ReserveAddr() }

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "corestore-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "corestore tests: %s: %v\n", what, err)
		return 1
	}
	pgBin, err := pgtest.BinDir()
	if err != nil {
		return fail("PostgreSQL", err)
	}
	addr, err := freeAddr()
	if err != nil {
		return fail("port", err)
	}
	_, port, _ := net.SplitHostPort(addr)
	var p int
	fmt.Sscan(port, &p)
	if servers.pg, err = pgtest.StartDir(pgBin, p, ""); err != nil {
		return fail("PostgreSQL", err)
	}
	defer servers.pg.Stop()
	ferretBin, err := ferrettest.Build(tmp)
	if err != nil {
		return fail("FerretDB", err)
	}
	if addr, err = freeAddr(); err != nil {
		return fail("port", err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, "ferret"), 0o700); err != nil {
		return fail("FerretDB", err)
	}
	if servers.ferret, err = ferrettest.StartSQLite(ferretBin, addr, filepath.Join(tmp, "ferret")); err != nil {
		return fail("FerretDB", err)
	}
	defer servers.ferret.Stop()
	s3Bin, err := s3test.BinaryPath()
	if err != nil {
		return fail("versitygw", err)
	}
	if addr, err = freeAddr(); err != nil {
		return fail("port", err)
	}
	for _, d := range []string{"s3", "iam"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o700); err != nil {
			return fail("versitygw", err)
		}
	}
	if servers.s3, err = s3test.StartDirIAM(s3Bin, addr, filepath.Join(tmp, "s3"), filepath.Join(tmp, "iam")); err != nil {
		return fail("versitygw", err)
	}
	defer servers.s3.Stop()
	servers.bin = filepath.Join(tmp, "berth-plugin-corestore")
	if out, err := exec.Command("go", "build", "-o", servers.bin, "github.com/berthhq/berth/cmd/berth-plugin-corestore").CombinedOutput(); err != nil {
		return fail("build the plugin", fmt.Errorf("%w: %s", err, out))
	}
	return m.Run()
}

// config is the plugin configuration of the package's servers.
func config(t testing.TB) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(corestore.Config{
		Postgres: &corestore.ServerConfig{AdminURL: servers.pg.URL("postgres")},
		MongoDB:  &corestore.ServerConfig{AdminURL: servers.ferret.URI()},
		S3:       &corestore.S3Config{Endpoint: servers.s3.Addr, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey, AdminAPI: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func desired(t testing.TB, typ string, r bindings.Request) provider.Resource {
	t.Helper()
	attrs, err := bindings.DesiredAttributes(typ, r)
	if err != nil {
		t.Fatal(err)
	}
	return provider.Resource{Type: typ, ID: r.ID(), Attributes: attrs}
}

func samples(t testing.TB, typ, service string) [2]provider.Resource {
	r := bindings.Request{Project: "conf", Service: service, Binding: "db", Generation: 1}
	a := desired(t, typ, r)
	r.Generation = 2
	return [2]provider.Resource{a, desired(t, typ, r)}
}

// TestConformance runs the provider suite: on the binary for PostgreSQL
// (handshake, crash, durable state included) and in process for MongoDB and
// S3.
func TestConformance(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Binary:       servers.bin,
			Args:         func(dir string) []string { return []string{"--state-dir", dir} },
			PluginConfig: config(t),
			Samples:      samples(t, bindings.TypePostgres, "pg"),
		})
	})
	for _, typ := range []string{bindings.TypeMongoDB, bindings.TypeS3} {
		t.Run(strings.TrimPrefix(typ, "corestore."), func(t *testing.T) {
			conformance.RunProvider(t, conformance.ProviderConfig{
				Factory:      func(dir string) (provider.Provider, error) { return corestore.Open(dir) },
				PluginConfig: config(t),
				Samples:      samples(t, typ, "conf-"+strings.TrimPrefix(typ, "corestore.")),
			})
		})
	}
}

// open returns a configured in-process plugin on a fresh state directory.
func open(t *testing.T, cfg json.RawMessage) *corestore.Plugin {
	t.Helper()
	p, err := corestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if err := p.Configure(t.Context(), &provider.ConfigRequest{Config: cfg, APIVersion: provider.APIVersion}); err != nil {
		t.Fatal(err)
	}
	return p
}

type applied struct {
	state provider.Resource
	creds map[string]string
}

func apply(t *testing.T, p *corestore.Plugin, d provider.Resource, key string, token uint64) (applied, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: d})
	if err != nil {
		return applied{}, err
	}
	r, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: token}})
	if err != nil {
		return applied{}, err
	}
	var creds map[string]string
	if err := json.Unmarshal(r.Credentials, &creds); err != nil {
		t.Fatalf("credentials %s: %v", r.Credentials, err)
	}
	return applied{state: r.State, creds: creds}, nil
}

func mustApply(t *testing.T, p *corestore.Plugin, d provider.Resource, key string, token uint64) applied {
	t.Helper()
	a, err := apply(t, p, d, key, token)
	if err != nil {
		t.Fatalf("apply %s: %v", d.ID, err)
	}
	return a
}

// TestPostgresBindingIsolatedAndKept: a binding's role reaches its own
// database and not another's; the state carries no password; a delete
// without purge keeps the rows; a purge drops database and role.
func TestPostgresBindingIsolatedAndKept(t *testing.T) {
	p := open(t, config(t))
	ctx := t.Context()
	a := mustApply(t, p, desired(t, bindings.TypePostgres, bindings.Request{Project: "shop", Service: "web", Binding: "db", Generation: 1}), "a1", 1)
	b := mustApply(t, p, desired(t, bindings.TypePostgres, bindings.Request{Project: "shop", Service: "api", Binding: "db", Generation: 1}), "b1", 1)
	for _, k := range []string{"URL", "HOST", "PORT", "USER", "PASSWORD", "DATABASE"} {
		if a.creds[k] == "" {
			t.Errorf("credential %s missing from %v", k, keys(a.creds))
		}
	}
	if strings.Contains(string(a.state.Attributes), a.creds["PASSWORD"]) {
		t.Fatalf("the state carries the password: %s", a.state.Attributes)
	}
	conn, err := pgx.Connect(ctx, a.creds["URL"])
	if err != nil {
		t.Fatalf("connect with the binding's credentials: %v", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	// Another binding's role cannot connect to this database.
	cross := strings.Replace(b.creds["URL"], "/"+b.creds["DATABASE"]+"?", "/"+a.creds["DATABASE"]+"?", 1)
	if c, err := pgx.Connect(ctx, cross); err == nil {
		c.Close(ctx)
		t.Fatalf("binding %s's role connected to %s's database", b.state.ID, a.state.ID)
	}
	// A replay returns the same credentials; they still work.
	again := mustApply(t, p, desired(t, bindings.TypePostgres, bindings.Request{Project: "shop", Service: "web", Binding: "db", Generation: 1}), "a1", 1)
	if again.creds["PASSWORD"] != a.creds["PASSWORD"] {
		t.Errorf("a replayed apply handed out another password")
	}
	if _, err := p.Delete(ctx, &provider.DeleteRequest{Type: bindings.TypePostgres, ID: a.state.ID, Mutation: pluginapi.Mutation{IdempotencyKey: "a-del", FencingToken: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read(ctx, &provider.ReadRequest{Type: bindings.TypePostgres, ID: a.state.ID}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("read after delete: %v, want not_found", err)
	}
	inv := inventory(t, p, "postgres")
	if st := itemState(inv, a.state.ID); st != "released" {
		t.Fatalf("inventory after a delete without purge: %s is %q, want released (%+v)", a.state.ID, st, inv)
	}
	// Bound again at a new generation: new password, the rows are there.
	a2 := mustApply(t, p, desired(t, bindings.TypePostgres, bindings.Request{Project: "shop", Service: "web", Binding: "db", Generation: 2}), "a2", 3)
	if a2.creds["PASSWORD"] == a.creds["PASSWORD"] {
		t.Errorf("a new generation kept the old password")
	}
	if c, err := pgx.Connect(ctx, a.creds["URL"]); err == nil {
		c.Close(ctx)
		t.Errorf("the previous generation's password still connects")
	}
	conn, err = pgx.Connect(ctx, a2.creds["URL"])
	if err != nil {
		t.Fatal(err)
	}
	var body string
	if err := conn.QueryRow(ctx, "SELECT body FROM notes").Scan(&body); err != nil || body != "kept" {
		t.Fatalf("rows after release and rebind: %q, %v", body, err)
	}
	conn.Close(ctx)
	// Purge needs a fencing token, then drops everything.
	if _, err := p.Delete(ctx, &provider.DeleteRequest{Type: bindings.TypePostgres, ID: a.state.ID, Purge: true}); abierrors.CodeOf(err) != abierrors.ValidationFailed {
		t.Fatalf("purge without a fencing token: %v, want validation_failed", err)
	}
	if _, err := p.Delete(ctx, &provider.DeleteRequest{Type: bindings.TypePostgres, ID: a.state.ID, Purge: true, Mutation: pluginapi.Mutation{IdempotencyKey: "a-purge", FencingToken: 4}}); err != nil {
		t.Fatal(err)
	}
	if st := itemState(inventory(t, p, "postgres"), a.state.ID); st != "" {
		t.Fatalf("inventory after purge still lists %s (%s)", a.state.ID, st)
	}
	admin, err := pgx.Connect(ctx, servers.pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname = $1", a.creds["USER"]).Scan(&n); err != nil || n != 0 {
		t.Fatalf("role after purge: %d, %v", n, err)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func inventory(t *testing.T, p *corestore.Plugin, kind string) bindings.Inventory {
	t.Helper()
	r, err := p.Read(t.Context(), &provider.ReadRequest{Type: bindings.TypeInventory, ID: kind})
	if err != nil {
		t.Fatalf("inventory %s: %v", kind, err)
	}
	var inv bindings.Inventory
	if err := json.Unmarshal(r.State.Attributes, &inv); err != nil {
		t.Fatal(err)
	}
	return inv
}

func itemState(inv bindings.Inventory, id string) string {
	for _, it := range inv.Resources {
		if it.ID == id {
			return it.State
		}
	}
	return ""
}

// TestApplyNeedsAMatchingGrant: no grant, a grant of another generation, a
// grant for another service: binding_not_granted, and nothing is created.
func TestApplyNeedsAMatchingGrant(t *testing.T) {
	p := open(t, config(t))
	r := bindings.Request{Project: "shop", Service: "nogrant", Binding: "db", Generation: 1}
	other := r
	other.Generation = 2
	otherGrant, _ := bindings.Digest(bindings.TypePostgres, other)
	svc := r
	svc.Service = "other"
	svcGrant, _ := bindings.Digest(bindings.TypePostgres, svc)
	for name, grant := range map[string]string{"none": "", "other generation": otherGrant, "other service": svcGrant, "garbage": "sha256:00"} {
		attrs, _ := json.Marshal(bindings.Desired{Request: r, Grant: grant})
		d := provider.Resource{Type: bindings.TypePostgres, ID: r.ID(), Attributes: attrs}
		if _, err := p.Plan(t.Context(), &provider.PlanRequest{Desired: d}); abierrors.CodeOf(err) != abierrors.BindingNotGranted {
			t.Errorf("%s: plan: %v, want binding_not_granted", name, err)
		}
		// Apply of a hand-made plan is refused the same way.
		_, err := p.Apply(t.Context(), &provider.ApplyRequest{Planned: d, Mutation: pluginapi.Mutation{IdempotencyKey: "k-" + name, FencingToken: 1}})
		if abierrors.CodeOf(err) != abierrors.BindingNotGranted {
			t.Errorf("%s: apply: %v, want binding_not_granted", name, err)
		}
	}
	for _, it := range inventory(t, p, "postgres").Resources {
		if strings.Contains(it.Name, "nogrant") {
			t.Fatalf("an ungranted request created %s", it.Name)
		}
	}
}

// TestUnreachableServerIsNotAnEmptyInventory: a server that does not answer
// is reachable false with the reason; Apply and Read fail with
// binding_unavailable.
func TestUnreachableServerIsNotAnEmptyInventory(t *testing.T) {
	addr, err := freeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(corestore.Config{
		Postgres: &corestore.ServerConfig{AdminURL: "postgres://postgres:x@" + addr + "/postgres?sslmode=disable&connect_timeout=2"},
		MongoDB:  &corestore.ServerConfig{AdminURL: "mongodb://" + addr + "/?serverSelectionTimeoutMS=1000"},
		S3:       &corestore.S3Config{Endpoint: addr, AccessKey: "a", SecretKey: "b"},
	})
	p := open(t, raw)
	for _, kind := range []string{"postgres", "mongodb", "s3"} {
		inv := inventory(t, p, kind)
		if inv.Reachable || inv.Reason == "" {
			t.Errorf("%s inventory of a dead server: %+v, want reachable false with a reason", kind, inv)
		}
	}
	d := desired(t, bindings.TypePostgres, bindings.Request{Project: "shop", Service: "web", Binding: "db", Generation: 1})
	if _, err := apply(t, p, d, "k", 1); abierrors.CodeOf(err) != abierrors.BindingUnavailable {
		t.Fatalf("apply on a dead server: %v, want binding_unavailable", err)
	}
}

// TestMongoBinding: the database exists after Apply and the credentials'
// URL writes and reads through it. FerretDB v1 answers usersInfo with
// CommandNotFound, so there the binding has no user of its own and says so.
func TestMongoBinding(t *testing.T) {
	p := open(t, config(t))
	a := mustApply(t, p, desired(t, bindings.TypeMongoDB, bindings.Request{Project: "shop", Service: "web", Binding: "cache", Generation: 1}), "m1", 1)
	var st bindings.State
	if err := json.Unmarshal(a.state.Attributes, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("FerretDB users: %s", st.Users)
	if st.Users == bindings.UsersUnsupported && (a.creds["USER"] != "" || a.creds["PASSWORD"] != "") {
		t.Fatalf("users unsupported but credentials carry a user: %v", keys(a.creds))
	}
	ctx := t.Context()
	c, err := mongo.Connect(options.Client().ApplyURI(a.creds["URL"]))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.WithoutCancel(ctx))
	coll := c.Database(a.creds["DATABASE"]).Collection("items")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "x"}, {Key: "n", Value: 7}}); err != nil {
		t.Fatal(err)
	}
	var got struct{ N int }
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "x"}}).Decode(&got); err != nil || got.N != 7 {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	if itemState(inventory(t, p, "mongodb"), a.state.ID) != "bound" {
		t.Fatalf("inventory does not list %s as bound", a.state.ID)
	}
}

// TestS3BindingOwnKey: each bucket gets its own key (versitygw's admin API),
// which writes its own bucket and is refused another's.
func TestS3BindingOwnKey(t *testing.T) {
	p := open(t, config(t))
	a := mustApply(t, p, desired(t, bindings.TypeS3, bindings.Request{Project: "shop", Service: "web", Binding: "files", Generation: 1}), "s1", 1)
	b := mustApply(t, p, desired(t, bindings.TypeS3, bindings.Request{Project: "shop", Service: "api", Binding: "files", Generation: 1}), "s2", 1)
	for _, k := range []string{"ENDPOINT", "BUCKET", "ACCESS_KEY", "SECRET_KEY"} {
		if a.creds[k] == "" {
			t.Fatalf("credential %s missing from %v", k, keys(a.creds))
		}
	}
	if a.creds["ACCESS_KEY"] == s3test.AccessKey {
		t.Fatalf("the binding got the admin key")
	}
	client, err := minio.New(servers.s3.Addr, &minio.Options{Creds: credentials.NewStaticV4(a.creds["ACCESS_KEY"], a.creds["SECRET_KEY"], "")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.PutObject(ctx, a.creds["BUCKET"], "hello.txt", strings.NewReader("hi"), 2, minio.PutObjectOptions{}); err != nil {
		t.Fatalf("put into its own bucket: %v", err)
	}
	if _, err := client.PutObject(ctx, b.creds["BUCKET"], "intruder.txt", strings.NewReader("no"), 2, minio.PutObjectOptions{}); err == nil {
		t.Fatalf("binding %s's key wrote into %s's bucket", a.state.ID, b.state.ID)
	}
}
