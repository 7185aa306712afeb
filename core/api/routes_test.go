package api

import (
	"archive/tar"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/session"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// keyRotatorFunc adapts a function to [KeyRotator].
type keyRotatorFunc func(ctx context.Context) (KeyRotation, error)

func (f keyRotatorFunc) RotateSigningKey(ctx context.Context) (KeyRotation, error) { return f(ctx) }

var _ KeyRotator = keyRotatorFunc(nil)

// registryGCFunc adapts a function to [RegistryCollector].
type registryGCFunc func(ctx context.Context, dryRun bool) (*registry.GCReport, error)

func (f registryGCFunc) Collect(ctx context.Context, dryRun bool) (*registry.GCReport, error) {
	return f(ctx, dryRun)
}

var _ RegistryCollector = registryGCFunc(nil)

// stubGC answers every pass with an empty report of its mode.
var stubGC = registryGCFunc(func(_ context.Context, dryRun bool) (*registry.GCReport, error) {
	return &registry.GCReport{DryRun: dryRun, Deletions: []registry.GCItem{}}, nil
})

// newFullFixture serves every route the API has: leases, key rotation, events, node sessions
// and node operations (a real session server with no node connected), orchestration with the
// runner transport on, and a policy engine over a real wazero runtime.
func newFullFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, func(c *Config) {
		st := storeOf(c)
		ctx := context.Background()
		rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Close(context.Background()) })
		eng := policy.New(policy.Config{Store: st, Blobs: c.Bundles, Runtime: rt, Changelog: c.Changelog})
		if err := eng.EnsureIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		reg := runners.NewRegistry(st, runners.Config{})
		ops := operations.NewQueue(st, operations.Config{})
		if err := ops.EnsureIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		sess := session.New(session.Config{Nodes: c.Nodes, Catalog: c.Catalog, SigningKey: key, ClusterID: c.ClusterID})
		c.Sessions, c.NodeOps = sess, sess
		c.Policy = eng
		c.Events = events.New(st, nil)
		c.Leases = fencing.New(st, fencing.Config{})
		c.Guard = fencing.NewGuard(st, nil)
		c.KeyRotator = keyRotatorFunc(func(context.Context) (KeyRotation, error) {
			return KeyRotation{KeyID: "key_test", Nodes: []NodeKeyRotated{}}, nil
		})
		c.RegistryGC = stubGC
		c.Orchestration = &Orchestration{Leases: leases.NewManager(st, leases.Config{Owner: "brd_test"}), Runners: reg,
			Operations: ops, Placement: placement.NewService(st, reg, ops), Transport: true}
		c.Bindings = bindings.New(bindings.Config{Store: st, Queue: ops, Secrets: c.Secrets.Store})
		c.Backups = testBackups(t, st, ops)
		jc, err := jobs.NewController(jobs.ControllerConfig{Store: st, Catalog: c.Catalog, Nodes: c.Nodes})
		if err != nil {
			t.Fatal(err)
		}
		c.Jobs = jc
		c.Platform = jobs.NewPlatform(st, nil)
	})
}

// testBackups is the backup routes' configuration of the fixtures: a real manager over the
// store, the queue and a filesystem blob store, and services web and api declaring a
// PostgreSQL binding "db" (the core's bindings stand in for this on a full server).
func testBackups(t *testing.T, st *store.Store, ops *operations.Queue) *BackupsConfig {
	t.Helper()
	fs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &BackupsConfig{Manager: backups.New(backups.Config{Store: st, Queue: ops, Blobs: fs}),
		Bindings: BindingKindsFunc(func(_ context.Context, _, service string) (map[string]abibackups.Kind, error) {
			if service == "web" || service == "api" {
				return map[string]abibackups.Kind{"db": abibackups.KindPostgres}, nil
			}
			return map[string]abibackups.Kind{}, nil
		})}
}

// routeRow is how the route tables treat one route of the echo router.
type routeRow struct {
	body bodyKind
	// note says why a route is handled apart from its kind's rule; required for uploads, the
	// node session and the runner transport.
	note string
}

// everyRoute lists every route the full fixture serves, by "METHOD pattern". A route added to
// the router without a row here fails TestEveryRouteRefusesBodiesItDoesNotTake.
func everyRoute() map[string]routeRow {
	none, obj := routeRow{body: bodyNone}, routeRow{body: bodyJSON}
	upload := routeRow{body: bodyUpload, note: "binary upload: a JSON body is refused by media type"}
	runner := routeRow{body: bodyJSON, note: "runner transport (docs/runner-protocol.md): one JSON object per call"}
	return map[string]routeRow{
		"GET /healthz": none, "GET /readyz": none, "GET /metrics": none,
		"POST /api/v1/nodes/enroll":      {body: bodyJSON, note: "unauthenticated: the join token in the body is the proof"},
		"GET /api/v1/nodes/session":      {body: bodyNone, note: "WebSocket upgrade: no body before the upgrade"},
		"GET /api/v1/bundles/:digest":    none,
		"POST /api/v1/nodes/join-tokens": obj, "POST /api/v1/nodes/join-codes": obj, "GET /join/:code/setup.sh": none, "GET /downloads/:name": none, "GET /api/v1/nodes": none, "GET /api/v1/nodes/:id": none,
		"DELETE /api/v1/nodes/:id": none, "GET /api/v1/leases": none, "GET /api/v1/nodes/:id/fence": none,
		"POST /api/v1/nodes/:id/lost": none, "POST /api/v1/nodes/:id/fence-ack": obj,
		"POST /api/v1/nodes/:id/upgrade": obj, "PUT /api/v1/nodes/:id/capacity": obj, "POST /api/v1/nodes/:id/drain": obj,
		"POST /api/v1/nodes/:id/cordon": none, "POST /api/v1/nodes/:id/uncordon": none, "GET /api/v1/releases": none, "GET /api/v1/releases/:sha256": none,
		"POST /api/v1/cluster/signing-key/rotate": obj, "GET /api/v1/plugins": none, "GET /api/v1/events": none,
		"GET /api/v1/changelog": none, "GET /api/v1/projects": none, "PUT /api/v1/projects/:project": obj,
		"GET /api/v1/projects/:project": none, "GET /api/v1/projects/:project/services": none,
		"PUT /api/v1/projects/:project/services/:name": obj, "GET /api/v1/projects/:project/services/:name": none,
		"DELETE /api/v1/projects/:project/services/:name": none, "GET /api/v1/projects/:project/workloads": none,
		"GET /api/v1/projects/:project/services/:name/spec": none, "PUT /api/v1/projects/:project/services/:name/spec": obj,
		"GET /api/v1/projects/:project/services/:name/workloads":        none,
		"GET /api/v1/projects/:project/services/:name/rollout":          none,
		"GET /api/v1/projects/:project/services/:name/placement":        none,
		"GET /api/v1/projects/:project/services/:name/releases":         none,
		"POST /api/v1/projects/:project/services/:name/rollout/undo":    obj,
		"POST /api/v1/projects/:project/services/:name/rollout/pause":   obj,
		"POST /api/v1/projects/:project/services/:name/rollout/resume":  obj,
		"POST /api/v1/projects/:project/services/:name/rollout/restart": obj,
		"POST /api/v1/projects/:project/services/:name/rebalance":       obj,
		"GET /api/v1/projects/:project/jobs":                            none, "GET /api/v1/projects/:project/jobs/:name/runs": none,
		"GET /api/v1/platform-jobs":                     none,
		"GET /api/v1/dns-records":                       none,
		"POST /api/v1/projects/:project/jobs/:name/run": none, "POST /api/v1/projects/:project/jobs/:name/suspend": none,
		"POST /api/v1/projects/:project/jobs/:name/resume": none, "GET /api/v1/projects/:project/job-runs/:run": none,
		"POST /api/v1/projects/:project/job-runs/:run/cancel": none, "GET /api/v1/projects/:project/job-runs/:run/logs": none,
		"POST /api/v1/projects/:project/services/:name/run":                   obj,
		"POST /api/v1/projects/:project/services/:name/releases":              obj,
		"POST /api/v1/projects/:project/services/:name/releases/:tag/promote": obj,
		"POST /api/v1/projects/:project/services/:name/backups":               obj,
		"GET /api/v1/projects/:project/backups":                               none,
		"GET /api/v1/projects/:project/backups/:id":                           none,
		"POST /api/v1/projects/:project/backups/:id/restore":                  obj,
		"POST /api/v1/projects/:project/backups/:id/drill":                    none,
		"POST /api/v1/nodes/:id/retire":                                       obj, "GET /api/v1/workloads": none,
		"POST /api/v1/projects/:project/bundles": upload, "GET /api/v1/projects/:project/bundles": none,
		"GET /api/v1/routes": none, "POST /api/v1/modules": upload, "GET /api/v1/modules": none,
		"POST /api/v1/policy-bindings": obj, "GET /api/v1/policy-bindings": none,
		"DELETE /api/v1/policy-bindings/:id": none, "GET /api/v1/policy-decisions": none,
		"GET /api/v1/policy-inputs/:sha256": none,
		"POST /api/v1/login":                {body: bodyJSON, note: "unauthenticated: the name and password in the body are the proof"},
		"POST /api/v1/logout":               none, "GET /api/v1/whoami": none,
		"POST /api/v1/users": obj, "GET /api/v1/users": none, "GET /api/v1/users/:user": none,
		"POST /api/v1/users/:user/credential": obj, "PUT /api/v1/users/:user/roles": obj,
		"POST /api/v1/tokens": obj, "GET /api/v1/tokens": none, "DELETE /api/v1/tokens/:token": none,
		"POST /api/v1/tokens/:token/rotate": none,
		"GET /api/v1/workloads/:id/logs":    none, "GET /api/v1/nodes/:id/logs": none, "GET /api/v1/nodes/:id/metrics": none,
		"POST /api/v1/runners/enrollment-tokens": obj, "GET /api/v1/runners": none,
		"PUT /api/v1/projects/:project/placement": obj, "GET /api/v1/projects/:project/placement": none,
		"DELETE /api/v1/projects/:project/placement": none, "POST /api/v1/projects/:project/placement/rollback": obj,
		"POST /api/v1/projects/:project/operations": obj, "GET /api/v1/projects/:project/operations": none,
		"GET /api/v1/operations/:id":   none,
		"POST /api/runner/v1/register": runner, "POST /api/runner/v1/heartbeat": runner, "POST /api/runner/v1/claim": runner,
		"POST /api/runner/v1/renew": runner, "POST /api/runner/v1/complete": runner, "POST /api/runner/v1/fail": runner,
		"GET /api/v1/projects/:project/secrets": none, "PUT /api/v1/projects/:project/secrets/:secret": obj,
		"GET /api/v1/projects/:project/secrets/:secret": none, "DELETE /api/v1/projects/:project/secrets/:secret": none,
		"GET /api/v1/projects/:project/bindings": none, "DELETE /api/v1/projects/:project/services/:name/bindings/:binding": none,
		"GET /api/v1/projects/:project/secret-sets": none, "PUT /api/v1/projects/:project/secret-sets/:set": obj,
		"GET /api/v1/projects/:project/secret-sets/:set": none, "DELETE /api/v1/projects/:project/secret-sets/:set": none,
		"GET /api/v1/secrets/keyring": none, "POST /api/v1/secrets/keyring/rotate": obj, "POST /api/v1/nodes/:id/secret-key/rotate": obj,
		"POST /api/v1/registry/gc":    obj,
		"POST /api/runner/v1/observe": runner, "POST /api/runner/v1/artifact": runner, "POST /api/runner/v1/runtime": runner,
		"POST /api/runner/v1/backup/begin": runner, "POST /api/runner/v1/backup/commit": runner, "POST /api/runner/v1/backup/fail": runner,
		"POST /api/runner/v1/backup/record": runner, "POST /api/runner/v1/backup/source": runner, "POST /api/runner/v1/backup/drill": runner,
		"POST /api/runner/v1/backup/archive": {body: bodyUpload, note: "backup archive upload: the streamed body is the archive, the lease in headers"},
	}
}

// concretePath fills the route pattern's parameters: project "default", service "web", and
// nodeID for every :id (an unknown id where the route means another kind of object).
func concretePath(pattern, nodeID string) string {
	r := strings.NewReplacer(":project", "default", ":name", "web", ":id", nodeID, ":secret", "db-url", ":set", "payments",
		":digest", "sha256:"+strings.Repeat("0", 64))
	return r.Replace(pattern)
}

// seedServiceAndNode gives the fixture project "default" with service "web" (one replica of a
// pushed bundle) and one enrolled node, whose id it returns, so that the routes' bad inputs
// meet real objects a wrongly accepted body could change.
func seedServiceAndNode(t *testing.T, f *fixture) string {
	t.Helper()
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", map[string]any{"bundle": "app", "command": []string{"./app"}}); code != 201 {
		t.Fatalf("create service: %d %v", code, out)
	}
	tok, _, err := f.reg.CreateJoinToken(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	code, out := f.json("POST", "/api/v1/nodes/enroll", map[string]any{"join_token": tok, "public_key": base64.StdEncoding.EncodeToString(pub),
		"hostname": "n1", "capacity": map[string]any{"cpus": 1, "memory_mb": 512}})
	if code != 201 {
		t.Fatalf("enroll: %d %v", code, out)
	}
	// The enrollment's change-log entry is appended in the background: wait for it, so the
	// walk starts from a store nothing else is writing to.
	deadline := time.Now().Add(30 * time.Second)
	for strings.Contains(f.snapshot(), `"log_outbox":[{`) {
		if time.Now().After(deadline) {
			t.Fatal("the change log outboxes did not drain in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out["node_id"].(string)
}

// TestEveryRouteRefusesBodiesItDoesNotTake walks the echo router: a route that takes a JSON
// body refuses null, an array, a string, a number and a boolean with 400 bad_request; a route
// that takes none refuses a non-empty body with 400 bad_request; an upload route refuses a
// JSON body by media type. None of them changes the store.
func TestEveryRouteRefusesBodiesItDoesNotTake(t *testing.T) {
	t.Parallel()
	f := newFullFixture(t)
	nodeID := seedServiceAndNode(t, f)
	rows := everyRoute()
	seen := map[string]bool{}
	w := f.watch()
	for _, r := range f.api.e.Routes() {
		if r.Method == "echo_route_not_found" {
			continue
		}
		key := r.Method + " " + r.Path
		if seen[key] {
			continue
		}
		seen[key] = true
		row, ok := rows[key]
		if !ok {
			t.Errorf("route %s has no row in everyRoute: say which body it takes", key)
			continue
		}
		if row.body == bodyUpload && row.note == "" {
			t.Errorf("route %s: an upload row needs a note", key)
		}
		type probe struct{ body, ctype, code string }
		var probes []probe
		status := 400
		switch row.body {
		case bodyNone:
			probes = []probe{{`{}`, "application/json", "bad_request"}, {"x", "text/plain", "bad_request"}}
		case bodyJSON:
			for _, b := range []string{`null`, `[]`, `[{}]`, `"x"`, `7`, `true`} {
				probes = append(probes, probe{b, "application/json", "bad_request"})
			}
		case bodyUpload:
			status = 415
			probes = []probe{{`null`, "application/json", "unsupported_media_type"}}
		}
		token := f.admin
		if strings.HasPrefix(r.Path, "/api/runner/") || r.Path == "/api/v1/nodes/enroll" {
			token = ""
		}
		for _, p := range probes {
			t.Run(key+" "+p.body, func(t *testing.T) {
				rq := req{method: r.Method, path: concretePath(r.Path, nodeID), ctype: p.ctype, token: token, body: []byte(p.body)}
				if r.Path == "/api/v1/projects/:project/operations" {
					rq.key = "k1" // required there before the body is read
				}
				got, out := f.do(rq)
				before, after, changed := w.step()
				if got != status || out["code"] != p.code {
					t.Fatalf("got %d %v, want %d %s", got, out, status, p.code)
				}
				if changed {
					t.Fatalf("the store changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
			})
		}
	}
	for key := range rows {
		if !seen[key] {
			t.Errorf("everyRoute lists %s, which the router does not serve", key)
		}
	}
}
