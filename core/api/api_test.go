package api

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

type nopHinter struct{}

func (nopHinter) Hint(string) {}

// fakeClock is a settable clock for join-token expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type fixture struct {
	t     *testing.T
	st    *store.Store
	srv   *httptest.Server
	admin string
	clock *fakeClock
	blobs string
	reg   *nodes.Registry
	api   *Server
	// dir is the data directory: the store and DATA/admin-token.
	dir string
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, nil) }

// cheapArgon2 are argon2id parameters for the fixtures' identity stores. identity.NewTokens
// hashes a dummy password at once, and with the default parameters (64 MiB) that took 0.6 to
// 1.2 s under -race on a loaded machine, once per test; the tests of the password rules pass
// their own.
var cheapArgon2 = identity.Argon2Params{Memory: 64, Time: 1, Threads: 1, KeyLen: 32, SaltLen: 16}

// testTokens is identity.NewTokens with cheapArgon2 (opts may replace it).
func testTokens(st *store.Store, opts ...identity.TokensOption) *identity.Tokens {
	return identity.NewTokens(st, append([]identity.TokensOption{identity.WithArgon2Params(cheapArgon2)}, opts...)...)
}

// newFixtureWith is newFixture with a change to the API configuration.
func newFixtureWith(t *testing.T, change func(*Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	ctx := context.Background()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	clock := &fakeClock{t: time.Now()}
	tokens := testTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.NewRegistry(st, clock.now)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	blobDir := filepath.Join(dir, "blobs")
	bs, err := bundles.New(blobDir, st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(dir, secrets.KeyringFile), true)
	if err != nil {
		t.Fatal(err)
	}
	testStores.Store(cat, st)
	cfg := Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Certificates: certs.NewStatusReader(st), DNSRecords: dnsrecords.NewReader(st),
		Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: nopHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Changelog: changelog.New(st, 1, nil), Now: clock.now,
		Secrets:       &SecretsConfig{Store: secrets.NewStore(st, kr, nil)},
		ImageReleases: registry.NewReleases(st, nil)}
	if change != nil {
		change(&cfg)
	}
	if cfg.Tokens != tokens {
		// The identity store berthd serves with is the one that keeps DATA/admin-token.
		if _, _, err := cfg.Tokens.EnsureAdmin(ctx, dir); err != nil {
			t.Fatal(err)
		}
	}
	s := New(cfg)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &fixture{t: t, st: st, srv: srv, admin: admin, clock: clock, blobs: blobDir, reg: reg, api: s, dir: dir}
}

type req struct {
	method, path, ctype, token string
	body                       []byte
	// key, when not empty, is sent as the Idempotency-Key header.
	key string
}

func (f *fixture) do(r req) (int, map[string]any) {
	f.t.Helper()
	hr, err := http.NewRequest(r.method, f.srv.URL+r.path, bytes.NewReader(r.body))
	if err != nil {
		f.t.Fatal(err)
	}
	if r.ctype != "" {
		hr.Header.Set("Content-Type", r.ctype)
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
		f.t.Fatalf("%s %s: error answer with Content-Type %q: %s", r.method, r.path, resp.Header.Get("Content-Type"), raw)
	}
	return resp.StatusCode, out
}

// json sends body as JSON; a nil body sends no body at all.
func (f *fixture) json(method, path string, body any) (int, map[string]any) {
	if body == nil {
		return f.do(req{method: method, path: path, token: f.admin})
	}
	raw, _ := json.Marshal(body)
	return f.do(req{method: method, path: path, ctype: "application/json", token: f.admin, body: raw})
}

// snapshot is every document of every non-empty collection plus the blob files.
func (f *fixture) snapshot() string {
	f.t.Helper()
	ctx := context.Background()
	names, err := f.st.DB().ListCollectionNames(ctx, bson.M{})
	if err != nil {
		f.t.Fatal(err)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		cur, err := f.st.Collection(n).Find(ctx, bson.M{})
		if err != nil {
			f.t.Fatal(err)
		}
		var docs []bson.M
		if err := cur.All(ctx, &docs); err != nil {
			f.t.Fatal(err)
		}
		var lines []string
		for _, d := range docs {
			// Field order is not stable across reads: compare sorted JSON.
			raw, _ := bson.MarshalExtJSON(d, true, false)
			var v any
			_ = json.Unmarshal(raw, &v)
			if m, ok := v.(map[string]any); ok {
				// A bearer's last use is written (at most once a minute) by whatever request
				// used it, refused or not: it is bookkeeping, not state a request changed.
				delete(m, "last_used_at")
			}
			sorted, _ := json.Marshal(v)
			lines = append(lines, string(sorted))
		}
		if len(lines) == 0 {
			continue // an empty collection holds nothing, however it came to exist
		}
		sort.Strings(lines)
		fmt.Fprintf(&b, "%s: %s\n", n, strings.Join(lines, "\n  "))
	}
	_ = filepath.WalkDir(f.blobs, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			fmt.Fprintln(&b, "blob", p)
		}
		return nil
	})
	return b.String()
}

// storeWatch checks that each of a sequence of requests leaves the store as it found it. The
// snapshot taken after one request is the one before the next, so a sequence of n requests
// takes n+1 snapshots instead of 2n (a snapshot reads every collection; it was most of the
// time of the route-walking tests). Nothing else may write the store between two steps.
type storeWatch struct {
	f    *fixture
	last string
}

// watch starts a storeWatch from the store as it is now.
func (f *fixture) watch() *storeWatch { return &storeWatch{f: f, last: f.snapshot()} }

// step takes a snapshot after a request and reports it, the one before the request and
// whether they differ; the new snapshot is the next step's before. Call it right after the
// request, before any check that may end the test, so the next step starts from the truth.
func (w *storeWatch) step() (before, after string, changed bool) {
	before, after = w.last, w.f.snapshot()
	w.last = after
	return before, after, after != before
}

func tarGz(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range entries {
		body := []byte("x")
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write(body)
		}
	}
	_ = tw.Close()
	_ = gz.Close()
	return buf.Bytes()
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push good bundle: %d %v", code, out)
	}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/web", map[string]any{"bundle": "app", "command": []string{"./app"}}); code != 201 {
		t.Fatalf("create service: %d %v", code, out)
	}
	usedToken, _, err := f.reg.CreateJoinToken(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	enroll := func(tok string) map[string]any {
		return map[string]any{"join_token": tok, "public_key": base64.StdEncoding.EncodeToString(pub), "hostname": "n1", "capacity": map[string]any{"cpus": 1, "memory_mb": 512}}
	}
	if code, out := f.json("POST", "/api/v1/nodes/enroll", enroll(usedToken)); code != 201 {
		t.Fatalf("enroll: %d %v", code, out)
	}
	expiring, _, err := f.reg.CreateJoinToken(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.clock.add(2 * time.Minute)
	nodeCred := "brn_" + strings.Repeat("A", 43)
	wrongDigest := "sha256:" + hex.EncodeToString(make([]byte, 32))

	svc := func(mut func(m map[string]any)) []byte {
		m := map[string]any{"bundle": "app", "command": []string{"./app"}}
		mut(m)
		raw, _ := json.Marshal(m)
		return raw
	}
	put := func(name string, body []byte) req {
		return req{method: "PUT", path: "/api/v1/projects/default/services/" + name, ctype: "application/json", token: f.admin, body: body}
	}
	tests := []struct {
		name   string
		req    req
		status int
		code   string
	}{
		{"unknown field", put("web", svc(func(m map[string]any) { m["replicaz"] = 2 })), 400, "bad_request"},
		{"wrong type", put("web", svc(func(m map[string]any) { m["replicas"] = "two" })), 400, "bad_request"},
		{"two JSON values", put("web", append(svc(func(map[string]any) {}), []byte(` {}`)...)), 400, "bad_request"},
		{"malformed JSON", put("web", []byte(`{"bundle":`)), 400, "bad_request"},
		{"oversized body", put("web", svc(func(m map[string]any) { m["env"] = map[string]string{"BIG": strings.Repeat("x", 2<<20)} })), 413, "body_too_large"},
		{"not JSON", req{method: "PUT", path: "/api/v1/projects/default/services/web", ctype: "text/plain", token: f.admin, body: []byte("hi")}, 415, "unsupported_media_type"},
		{"bad service name", put("Web_1", svc(func(map[string]any) {})), 422, "invalid_name"},
		{"service name of 64", put(strings.Repeat("a", 64), svc(func(map[string]any) {})), 422, "invalid_name"},
		{"bad project name", req{method: "PUT", path: "/api/v1/projects/-x/services/web", ctype: "application/json", token: f.admin, body: svc(func(map[string]any) {})}, 422, "invalid_name"},
		{"unknown project", req{method: "GET", path: "/api/v1/projects/nope/services", token: f.admin}, 404, "project_not_found"},
		{"unknown service", req{method: "DELETE", path: "/api/v1/projects/default/services/nope", token: f.admin}, 404, "service_not_found"},
		{"stale expected_revision", put("web", svc(func(m map[string]any) { m["expected_revision"] = 7 })), 409, "revision_conflict"},
		{"create with revision of an existing", put("web", svc(func(m map[string]any) { m["expected_revision"] = 0 })), 409, "revision_conflict"},
		{"stale delete", req{method: "DELETE", path: "/api/v1/projects/default/services/web?expected_revision=9", token: f.admin}, 409, "revision_conflict"},
		{"reserved env", put("web", svc(func(m map[string]any) { m["env"] = map[string]string{"PORT": "1"} })), 422, "validation_failed"},
		{"negative replicas", put("web", svc(func(m map[string]any) { m["replicas"] = -1 })), 422, "validation_failed"},
		{"label key with a dot", put("web", svc(func(m map[string]any) { m["labels"] = map[string]string{"team.name": "x"} })), 422, "validation_failed"},
		{"enroll label key with a dot", req{method: "POST", path: "/api/v1/nodes/enroll", ctype: "application/json", body: mustJSON(func() map[string]any { m := enroll(expiring); m["labels"] = map[string]string{"zone.a": "1"}; return m }())}, 422, "validation_failed"},
		{"negative gateway timeout", put("web", svc(func(m map[string]any) { m["timeouts"] = map[string]int{"connect_ms": -1} })), 422, "validation_failed"},
		{"gateway timeout above an hour", put("web", svc(func(m map[string]any) { m["timeouts"] = map[string]int{"response_header_ms": 3_600_001} })), 422, "validation_failed"},
		{"unknown gateway timeout", put("web", svc(func(m map[string]any) { m["timeouts"] = map[string]int{"read_ms": 5} })), 400, "bad_request"},
		{"bad domain", put("web", svc(func(m map[string]any) { m["domains"] = []string{"not a host"} })), 422, "validation_failed"},
		{"IPv4 literal as a domain", put("web", svc(func(m map[string]any) { m["domains"] = []string{"127.0.0.1"} })), 422, "validation_failed"},
		{"IPv4 literal with a trailing dot", put("web", svc(func(m map[string]any) { m["domains"] = []string{"10.0.0.1."} })), 422, "validation_failed"},
		{"short IPv4 form as a domain", put("web", svc(func(m map[string]any) { m["domains"] = []string{"127.1"} })), 422, "validation_failed"},
		{"IPv6 literal as a domain", put("web", svc(func(m map[string]any) { m["domains"] = []string{"::1"} })), 422, "validation_failed"},
		{"unknown dns mode", put("web", svc(func(m map[string]any) { m["dns"] = "automatic" })), 422, "validation_failed"},
		{"bracketed IPv6 literal as a domain", put("web", svc(func(m map[string]any) { m["domains"] = []string{"[2001:db8::1]"} })), 422, "validation_failed"},
		{"env value of 1000 KiB", put("web", svc(func(m map[string]any) { m["env"] = map[string]string{"BIG": strings.Repeat("x", 1000<<10)} })), 422, "validation_failed"},
		{"env over the total", put("web", svc(func(m map[string]any) {
			m["env"] = map[string]string{"A": strings.Repeat("x", 100<<10), "B": strings.Repeat("x", 100<<10), "C": strings.Repeat("x", 100<<10)}
		})), 422, "validation_failed"},
		{"command argument of 200 KiB", put("web", svc(func(m map[string]any) { m["command"] = []string{"./app", strings.Repeat("x", 200<<10)} })), 422, "validation_failed"},
		{"command over the total", put("web", svc(func(m map[string]any) {
			m["command"] = []string{"./app", strings.Repeat("x", 100<<10), strings.Repeat("x", 100<<10), strings.Repeat("x", 100<<10)}
		})), 422, "validation_failed"},
		{"unknown bundle", put("web", svc(func(m map[string]any) { m["bundle"] = "ghost" })), 404, "bundle_not_found"},
		{"unknown runtime", put("web", svc(func(m map[string]any) { m["runtime"] = "vm" })), 422, "validation_failed"},
		{"image on the process runtime", put("web", svc(func(m map[string]any) {
			m["image"] = "example.com/app@sha256:abababababababababababababababababababababababababababababababab"
		})), 422, "validation_failed"},
		{"container image by tag", put("web", svc(func(m map[string]any) { m["runtime"], m["image"] = "containerd", "example.com/app:v1" })), 422, "validation_failed"},
		{"container without image", put("web", svc(func(m map[string]any) { m["runtime"] = "containerd" })), 422, "validation_failed"},
		{"bare image digest without bundle", put("web", svc(func(m map[string]any) {
			m["runtime"], m["image"] = "containerd", "sha256:abababababababababababababababababababababababababababababababab"
			delete(m, "bundle")
		})), 422, "validation_failed"},
		{"negative memory limit", put("web", svc(func(m map[string]any) {
			m["runtime"], m["image"], m["memory_mb"] = "containerd", "example.com/app@sha256:abababababababababababababababababababababababababababababababab", -1
		})), 422, "validation_failed"},
		{"missing command", put("web", svc(func(m map[string]any) { delete(m, "command") })), 422, "validation_failed"},
		{"reused join token", req{method: "POST", path: "/api/v1/nodes/enroll", ctype: "application/json", body: mustJSON(enroll(usedToken))}, 409, "join_token_used"},
		{"expired join token", req{method: "POST", path: "/api/v1/nodes/enroll", ctype: "application/json", body: mustJSON(enroll(expiring))}, 422, "join_token_expired"},
		{"unknown join token", req{method: "POST", path: "/api/v1/nodes/enroll", ctype: "application/json", body: mustJSON(enroll("brj_nope"))}, 422, "join_token_expired"},
		{"missing credentials", req{method: "GET", path: "/api/v1/projects"}, 401, "unauthenticated"},
		{"wrong credentials", req{method: "GET", path: "/api/v1/projects", token: "brt_wrong"}, 401, "unauthenticated"},
		{"node credential on the operator API", req{method: "GET", path: "/api/v1/projects", token: nodeCred}, 401, "unauthenticated"},
		{"wrong credentials on a write", req{method: "PUT", path: "/api/v1/projects/default/services/web", ctype: "application/json", token: "brt_wrong", body: svc(func(map[string]any) {})}, 401, "unauthenticated"},
		{"bundle digest mismatch", req{method: "POST", path: "/api/v1/projects/default/bundles?digest=" + wrongDigest, ctype: "application/gzip", token: f.admin, body: good}, 422, "digest_mismatch"},
		{"bundle with ../", req{method: "POST", path: "/api/v1/projects/default/bundles", ctype: "application/gzip", token: f.admin, body: tarGz(t, &tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644})}, 422, "bundle_invalid"},
		{"bundle with link out", req{method: "POST", path: "/api/v1/projects/default/bundles", ctype: "application/gzip", token: f.admin, body: tarGz(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc/passwd"})}, 422, "bundle_invalid"},
		{"bundle with absolute path", req{method: "POST", path: "/api/v1/projects/default/bundles", ctype: "application/gzip", token: f.admin, body: tarGz(t, &tar.Header{Name: "/etc/x", Typeflag: tar.TypeReg, Mode: 0o644})}, 422, "bundle_invalid"},
		{"bundle not gzip", req{method: "POST", path: "/api/v1/projects/default/bundles", ctype: "application/gzip", token: f.admin, body: []byte("plain text")}, 422, "bundle_invalid"},
		{"bundle too large", req{method: "POST", path: "/api/v1/projects/default/bundles", ctype: "application/gzip", token: f.admin, body: bytes.Repeat([]byte{1}, 2<<20)}, 413, "body_too_large"},
		{"bundle bad name", req{method: "POST", path: "/api/v1/projects/default/bundles?name=A_B", ctype: "application/gzip", token: f.admin, body: good}, 422, "invalid_name"},
		{"unknown endpoint", req{method: "GET", path: "/api/v1/nope", token: f.admin}, 404, "not_found"},
		{"unknown node", req{method: "GET", path: "/api/v1/nodes/nod_nope", token: f.admin}, 404, "node_not_found"},
		{"join token ttl out of range", req{method: "POST", path: "/api/v1/nodes/join-tokens", ctype: "application/json", token: f.admin, body: []byte(`{"ttl_seconds": -5}`)}, 422, "validation_failed"},
	}
	details := map[string]string{ // a part the problem's detail must hold
		"IPv4 literal as a domain":           "127.0.0.1",
		"IPv4 literal with a trailing dot":   "IP address",
		"short IPv4 form as a domain":        "IP address",
		"IPv6 literal as a domain":           "IP address",
		"bracketed IPv6 literal as a domain": "IP address",
		"env value of 1000 KiB":              `"BIG"`,
		"env over the total":                 `"C"`,
	}
	w := f.watch()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, out := f.do(tt.req)
			before, after, changed := w.step()
			if status != tt.status || out["code"] != tt.code {
				t.Fatalf("got %d %v, want %d %s", status, out, tt.status, tt.code)
			}
			if d, _ := out["detail"].(string); !strings.Contains(d, details[tt.name]) {
				t.Fatalf("detail %q does not say %s", d, details[tt.name])
			}
			if out["detail"] == nil || out["title"] == nil {
				t.Fatalf("problem without title or detail: %v", out)
			}
			if changed {
				t.Fatalf("the store changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func mustJSON(v any) []byte {
	raw, _ := json.Marshal(v)
	return raw
}

// TestEnrollAfterKeyRotationPinsCurrentKey: a node enrolled after the
// cluster signing key was rotated is handed the key in use now, not the one
// berthd started with (docs/node-protocol.md sections 2.4 and 5.21).
func TestEnrollAfterKeyRotationPinsCurrentKey(t *testing.T) {
	t.Parallel()
	rotated, _, _ := ed25519.GenerateKey(rand.Reader)
	f := newFixtureWith(t, func(c *Config) { c.CurrentPublicKey = func() ed25519.PublicKey { return rotated } })
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
	if got := out["cluster_public_key"]; got != base64.StdEncoding.EncodeToString(rotated) {
		t.Fatalf("enroll answered cluster_public_key %v, want the rotated key", got)
	}
}

// TestEnvLimitsAtTheBoundary: a variable of exactly services.MaxEnvEntryBytes (KEY=VALUE and its
// NUL) and an environment of exactly services.MaxEnvBytes apply; one byte more is refused with
// 422 validation_failed naming the variable, and the refused apply changes nothing.
func TestEnvLimitsAtTheBoundary(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	full := strings.Repeat("v", services.MaxEnvEntryBytes-len("A=")-1)
	apply := func(env map[string]string) (int, map[string]any) {
		return f.json("PUT", "/api/v1/projects/default/services/web", map[string]any{"bundle": "app", "command": []string{"./app"}, "env": env})
	}
	if code, out := apply(map[string]string{"A": full}); code != 201 {
		t.Fatalf("one variable of exactly %d bytes: %d %v", services.MaxEnvEntryBytes, code, out["detail"])
	}
	if code, out := apply(map[string]string{"A": full + "v"}); code != 422 || out["code"] != "validation_failed" || !strings.Contains(out["detail"].(string), `"A"`) {
		t.Fatalf("one variable a byte over: %d %v", code, out)
	}
	if code, out := apply(map[string]string{"A": full, "B": full}); code != 200 {
		t.Fatalf("an environment of exactly %d bytes: %d %v", services.MaxEnvBytes, code, out["detail"])
	}
	before := f.snapshot()
	if code, out := apply(map[string]string{"A": full, "B": full, "C": ""}); code != 422 || out["code"] != "validation_failed" || !strings.Contains(out["detail"].(string), `"C"`) {
		t.Fatalf("an environment over the total: %d %v", code, out)
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a refused apply changed the store")
	}
}

// TestUnchangedApplyWritesNothing: re-applying exactly what is stored answers 200 with the
// current revision and "changed": false and writes nothing (no revision bump, no change-log
// entry); expected_revision still applies; any difference is a write with "changed": true.
func TestUnchangedApplyWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	spec := func(mut func(m map[string]any)) map[string]any {
		m := map[string]any{"bundle": "app", "command": []string{"./app", "-v"}, "env": map[string]string{"A": "1"},
			"domains": []string{"Web.Example.com."}, "replicas": 2, "labels": map[string]string{}}
		if mut != nil {
			mut(m)
		}
		return m
	}
	const path = "/api/v1/projects/default/services/web"
	code, out := f.json("PUT", path, spec(nil))
	if code != 201 || out["changed"] != true || out["revision"] != float64(1) {
		t.Fatalf("create: %d %v", code, out)
	}
	before := f.snapshot()
	code, out = f.json("PUT", path, spec(nil))
	if code != 200 || out["changed"] != false || out["revision"] != float64(1) {
		t.Fatalf("identical apply: %d changed=%v revision=%v", code, out["changed"], out["revision"])
	}
	code, out = f.json("PUT", path, spec(func(m map[string]any) { m["expected_revision"] = 1; delete(m, "labels") }))
	if code != 200 || out["changed"] != false || out["revision"] != float64(1) {
		t.Fatalf("identical apply at the current expected_revision: %d changed=%v revision=%v", code, out["changed"], out["revision"])
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("an unchanged apply wrote to the store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if code, out = f.json("PUT", path, spec(func(m map[string]any) { m["expected_revision"] = 0 })); code != 409 || out["code"] != "revision_conflict" {
		t.Fatalf("identical apply with a stale expected_revision: %d %v", code, out)
	}
	code, out = f.json("PUT", path, spec(func(m map[string]any) { m["env"] = map[string]string{"A": "2"} }))
	if code != 200 || out["changed"] != true || out["revision"] != float64(2) {
		t.Fatalf("changed apply: %d changed=%v revision=%v", code, out["changed"], out["revision"])
	}
	code, out = f.json("GET", path, nil)
	if _, has := out["changed"]; code != 200 || has {
		t.Fatalf("GET answers changed: %d %v", code, out)
	}
}

// testStores maps a fixture's catalog to its store, for the fixture changes that build parts
// of their own over it (storeOf).
var testStores sync.Map // *services.Catalog -> *store.Store

// storeOf returns the store the fixture being built opened c's catalog over.
func storeOf(c *Config) *store.Store {
	st, ok := testStores.Load(c.Catalog)
	if !ok {
		panic("api test: storeOf: the catalog was not made by newFixtureWith")
	}
	return st.(*store.Store)
}
