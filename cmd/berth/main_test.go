package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// testNow is the clock of every test run.
func testNow() time.Time { return time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC) }

// fakeAPI stands for berthd's /api/v1: a handful of endpoints over an
// in-memory map, enough for the CLI's calls.
type fakeAPI struct {
	t     *testing.T
	token string

	mu       sync.Mutex
	services map[string]client.Service // key project/name
	bundles  map[string][]byte
	requests []string // "METHOD path"
}

func newFakeAPI(t *testing.T, token string) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{t: t, token: token, services: map[string]client.Service{}, bundles: map[string][]byte{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(client.Problem{Title: http.StatusText(status), Status: status, Code: code, Detail: detail})
}

func answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		problem(w, 401, "unauthenticated", "authentication failed")
		return
	}
	if r.Header.Get("User-Agent") != userAgent {
		f.t.Errorf("User-Agent %q", r.Header.Get("User-Agent"))
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/"), "/")
	route := r.Method + " " + strings.Join(parts, "/")
	switch {
	case route == "GET projects":
		answer(w, 200, client.List[client.Project]{Items: []client.Project{{ID: "prj_1", Name: "default"}}})
	case route == "GET nodes":
		seen := testNow().Add(-5 * time.Second)
		answer(w, 200, client.List[client.Node]{Items: []client.Node{
			{ID: "nod_1", Hostname: "h1", Status: "connected", Region: "eu", Address: "10.0.0.1", Workloads: 2, AppliedRev: 4, DesiredRev: 5, LastSeenAt: &seen},
			{ID: "nod_2", Hostname: "h2", Status: "pending"},
		}})
	case route == "POST nodes/join-tokens":
		var req client.JoinTokenRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.Header.Get("Content-Type") != "application/json" {
			problem(w, 400, "bad_request", "bad body")
			return
		}
		answer(w, 201, client.JoinToken{Token: "brj_tok", JoinCommand: "berth-agent join --server x --token brj_tok",
			ExpiresAt: testNow().Add(time.Duration(req.TTLSeconds) * time.Second)})
	case len(parts) == 3 && parts[0] == "projects" && parts[2] == "workloads" && r.Method == "GET":
		answer(w, 200, client.List[client.Workload]{Items: []client.Workload{
			{ID: "wl_1", Project: parts[1], Service: "hello", Slot: 0, NodeID: "nod_1", DesiredStatus: "running", ObservedStatus: "running", Health: "healthy", Address: "10.0.0.1:30001", RestartCount: 1},
			{ID: "wl_2", Project: parts[1], Service: "other", Slot: 0, NodeID: "nod_1", DesiredStatus: "running", ObservedStatus: "starting"},
		}})
	case len(parts) == 3 && parts[0] == "projects" && parts[2] == "services" && r.Method == "GET":
		var items []client.Service
		for k, v := range f.services {
			if strings.HasPrefix(k, parts[1]+"/") {
				items = append(items, v)
			}
		}
		sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
		answer(w, 200, client.List[client.Service]{Items: items})
	case len(parts) == 4 && parts[0] == "projects" && parts[2] == "services":
		f.service(w, r, parts[1], parts[3])
	case len(parts) == 3 && parts[0] == "projects" && parts[2] == "bundles" && r.Method == "POST":
		if r.Header.Get("Content-Type") != "application/gzip" {
			problem(w, 415, "unsupported_media_type", "want application/gzip")
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			problem(w, 400, "bad_request", err.Error())
			return
		}
		if err := bundle.Validate(r.Context(), bytes.NewReader(b), 0); err != nil {
			problem(w, 422, "bundle_invalid", err.Error())
			return
		}
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		f.bundles[d] = b
		answer(w, 201, client.Bundle{Digest: d, Size: int64(len(b)), Name: r.URL.Query().Get("name"), Project: parts[1]})
	default:
		problem(w, 404, "not_found", "no route "+route)
	}
}

func (f *fakeAPI) service(w http.ResponseWriter, r *http.Request, project, name string) {
	key := project + "/" + name
	cur, exists := f.services[key]
	switch r.Method {
	case "GET":
		if !exists {
			problem(w, 404, "service_not_found", fmt.Sprintf("no service %q in project %q", name, project))
			return
		}
		answer(w, 200, cur)
	case "PUT":
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		var spec client.ServiceSpec
		if err := dec.Decode(&spec); err != nil {
			problem(w, 400, "bad_request", err.Error())
			return
		}
		if spec.ExpectedRevision != nil && *spec.ExpectedRevision != cur.Revision {
			problem(w, 409, "revision_conflict", "stale revision")
			return
		}
		replicas := 1
		if spec.Replicas != nil {
			replicas = *spec.Replicas
		}
		svc := client.Service{ID: "svc_" + name, Project: project, Name: name, Revision: cur.Revision + 1,
			Bundle: spec.Bundle, BundleDigest: "sha256:0123456789abcdef0123", Command: spec.Command, Env: spec.Env,
			Port: spec.Port, Domains: spec.Domains, Replicas: replicas, HealthCheck: spec.HealthCheck,
			CreatedAt: testNow().Add(-3 * time.Hour), UpdatedAt: testNow().Add(-time.Minute)}
		f.services[key] = svc
		answer(w, 200, svc)
	case "DELETE":
		if !exists {
			problem(w, 404, "service_not_found", fmt.Sprintf("no service %q in project %q", name, project))
			return
		}
		delete(f.services, key)
		w.WriteHeader(204)
	default:
		problem(w, 405, "method_not_allowed", r.Method)
	}
}

// cli runs the CLI in process with its own config home and environment.
type cli struct {
	t    *testing.T
	env  map[string]string
	home string
}

func newCLI(t *testing.T) *cli {
	home := t.TempDir()
	return &cli{t: t, home: home, env: map[string]string{"HOME": home}}
}

// run returns stdout, stderr and the exit code.
func (c *cli) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	a := &app{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errOut,
		getenv: func(k string) string { return c.env[k] },
		now:    testNow,
	}
	code := run(context.Background(), a, args)
	return out.String(), errOut.String(), code
}

// ok runs the CLI and fails the test unless it exits 0.
func (c *cli) ok(stdin string, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run(stdin, args...)
	if code != 0 {
		c.t.Fatalf("berth %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestLoginThenUseSavedConfig(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t, "brt_good")
	c := newCLI(t)

	// A refused token saves nothing.
	_, errOut, code := c.run("brt_bad\n", "login", "--server", srv.URL, "--token-stdin")
	if code != 1 || !strings.HasPrefix(errOut, "error: ") || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("bad login: exit %d stderr %q", code, errOut)
	}
	cfg := filepath.Join(c.home, ".config", "berth", "config.json")
	if _, err := os.Stat(cfg); !os.IsNotExist(err) {
		t.Fatalf("config written after a refused login: %v", err)
	}

	out := c.ok("brt_good\n", "login", "--server", srv.URL, "--token-stdin", "--project", "shop")
	if !strings.Contains(out, cfg) {
		t.Errorf("login output %q does not say where it saved", out)
	}
	info, err := os.Stat(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600", info.Mode().Perm())
	}
	dinfo, err := os.Stat(filepath.Dir(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if dinfo.Mode().Perm() != 0o700 {
		t.Errorf("config dir mode %v, want 0700", dinfo.Mode().Perm())
	}
	b, _ := os.ReadFile(cfg)
	var fc fileConfig
	if err := json.Unmarshal(b, &fc); err != nil {
		t.Fatal(err)
	}
	if fc != (fileConfig{Server: srv.URL, Token: "brt_good", Project: "shop"}) {
		t.Errorf("saved config %+v", fc)
	}

	// Later commands use the saved server, token and project.
	out = c.ok("", "get", "services")
	if !strings.HasPrefix(out, "NAME") {
		t.Errorf("get services: %q", out)
	}
	last := api.requests[len(api.requests)-1]
	if last != "GET /api/v1/projects/shop/services" {
		t.Errorf("last request %q", last)
	}

	// A config others can read is refused.
	if err := os.Chmod(cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = c.run("", "get", "services")
	if code != 1 || !strings.Contains(errOut, "chmod 600") {
		t.Errorf("world-readable config: exit %d stderr %q", code, errOut)
	}
}

func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		file  *fileConfig
		env   map[string]string
		args  []string
		xdg   bool
		wantS settings
	}{
		{name: "nothing", wantS: settings{Project: "default"}},
		{
			name:  "file only",
			file:  &fileConfig{Server: "https://file", Token: "brt_file", Project: "pf"},
			wantS: settings{Server: "https://file", Token: "brt_file", Project: "pf"},
		},
		{
			name:  "env over file",
			file:  &fileConfig{Server: "https://file", Token: "brt_file", Project: "pf"},
			env:   map[string]string{"BERTH_SERVER": "https://env", "BERTH_TOKEN": "brt_env", "BERTH_PROJECT": "pe"},
			wantS: settings{Server: "https://env", Token: "brt_env", Project: "pe"},
		},
		{
			name:  "flags over env",
			file:  &fileConfig{Server: "https://file", Token: "brt_file", Project: "pf"},
			env:   map[string]string{"BERTH_SERVER": "https://env", "BERTH_TOKEN": "brt_env", "BERTH_PROJECT": "pe"},
			args:  []string{"--server", "https://flag", "--token", "brt_flag", "--project", "pflag"},
			wantS: settings{Server: "https://flag", Token: "brt_flag", Project: "pflag"},
		},
		{
			name:  "mixed",
			file:  &fileConfig{Server: "https://file", Token: "brt_file"},
			env:   map[string]string{"BERTH_TOKEN": "brt_env"},
			args:  []string{"--project", "pflag"},
			wantS: settings{Server: "https://file", Token: "brt_env", Project: "pflag"},
		},
		{
			name:  "explicit default project flag beats env",
			env:   map[string]string{"BERTH_PROJECT": "pe"},
			args:  []string{"--project", "default"},
			wantS: settings{Project: "default"},
		},
		{
			name:  "xdg config home",
			file:  &fileConfig{Server: "https://xdg", Token: "brt_xdg"},
			xdg:   true,
			wantS: settings{Server: "https://xdg", Token: "brt_xdg", Project: "default"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			env := map[string]string{"HOME": home}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg := filepath.Join(home, ".config", "berth", "config.json")
			if tc.xdg {
				env["XDG_CONFIG_HOME"] = filepath.Join(home, "xdg")
				cfg = filepath.Join(home, "xdg", "berth", "config.json")
			}
			if tc.file != nil {
				if err := saveConfig(cfg, *tc.file); err != nil {
					t.Fatal(err)
				}
			}
			a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return env[k] }}
			root := newRootCmd(a)
			if err := root.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := a.resolve(root)
			if err != nil {
				t.Fatal(err)
			}
			tc.wantS.ConfigPath = cfg
			if got != tc.wantS {
				t.Errorf("resolve = %+v, want %+v", got, tc.wantS)
			}
		})
	}
}

func TestParseServiceFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		file    string
		in      string
		want    []string // names
		wantErr string
	}{
		{name: "yaml", file: "a.yaml", in: "name: hello\nbundle: hello\ncommand: [./run]\nhealth_check: {path: /h, interval_s: 5}\n", want: []string{"hello"}},
		{name: "yaml several documents", file: "-", in: "---\nname: a\n---\n# nothing here\n---\nname: b\nreplicas: 0\n", want: []string{"a", "b"}},
		{name: "json object", file: "-", in: ` {"name":"j","command":["x"],"expected_revision":0}`, want: []string{"j"}},
		{name: "json stream and array", file: "s.json", in: `{"name":"a"} [{"name":"b"},{"name":"c"}]`, want: []string{"a", "b", "c"}},
		{name: "yaml unknown field", file: "a.yml", in: "name: a\nreplicaz: 2\n", wantErr: `document 1: line 2: unknown field "replicaz"`},
		{name: "yaml nested unknown field", file: "-", in: "name: a\n---\nname: b\nhealth_check:\n  paht: /\n", wantErr: `document 2: line 5: unknown field "paht"`},
		{name: "json unknown field", file: "-", in: `{"name":"a","bundel":"x"}`, wantErr: `unknown field "bundel"`},
		{name: "json nested unknown field", file: "-", in: `{"name":"a","health_check":{"intervall_s":3}}`, wantErr: `unknown field "intervall_s"`},
		{name: "missing name", file: "-", in: "bundle: x\n", wantErr: "service 1: name is required"},
		{name: "empty", file: "-", in: "---\n", wantErr: "no service"},
		{name: "command as string", file: "-", in: "name: a\ncommand: ./run --x\n", wantErr: "cannot unmarshal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			docs, err := parseServiceFiles(strings.NewReader(tc.in), tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range docs {
				names = append(names, d.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("names %v, want %v", names, tc.want)
			}
		})
	}

	docs, err := parseServiceFiles(strings.NewReader(`
name: hello
project: shop
bundle: sha256:abc
command: ["./server", "--port", "8080"]
env: {GREETING: hi}
port: 8080
domains: [hello.example.com]
replicas: 2
health_check: {path: /healthz, interval_s: 5, timeout_s: 1, failures: 4}
expected_revision: 3
`), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(docs[0].spec())
	want := `{"bundle":"sha256:abc","command":["./server","--port","8080"],"env":{"GREETING":"hi"},"port":8080,"domains":["hello.example.com"],"replicas":2,"health_check":{"path":"/healthz","interval_s":5,"timeout_s":1,"failures":4},"expected_revision":3}`
	if string(got) != want {
		t.Errorf("spec %s\nwant %s", got, want)
	}
}

func TestCommandsAgainstServer(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t, "brt_good")
	c := newCLI(t)
	c.env["BERTH_SERVER"] = srv.URL
	c.env["BERTH_TOKEN"] = "brt_good"

	// apply: YAML from stdin, two documents.
	out := c.ok("name: hello\nbundle: hello\ncommand: [./run]\nport: 8080\ndomains: [hello.example.com]\nreplicas: 2\n---\nname: worker\ncommand: [./work]\n", "apply", "-f", "-")
	if out != "service default/hello applied (revision 1)\nservice default/worker applied (revision 1)\n" {
		t.Errorf("apply output %q", out)
	}
	out = c.ok(`{"name":"hello","bundle":"hello","command":["./run"],"replicas":2,"domains":["hello.example.com"],"expected_revision":1}`, "apply", "-f", "-")
	if out != "service default/hello applied (revision 2)\n" {
		t.Errorf("apply json output %q", out)
	}
	// An unknown field fails before any call.
	before := len(api.requests)
	_, errOut, code := c.run("name: x\nbogus: 1\n", "apply", "-f", "-")
	if code != 1 || !strings.Contains(errOut, `unknown field "bogus"`) || len(api.requests) != before {
		t.Errorf("unknown field: exit %d stderr %q", code, errOut)
	}
	// File project against a different --project.
	_, errOut, code = c.run("name: x\nproject: shop\n", "apply", "-f", "-", "--project", "other")
	if code != 1 || !strings.Contains(errOut, `project "shop"`) {
		t.Errorf("project mismatch: exit %d stderr %q", code, errOut)
	}

	// get services: table and JSON.
	out = c.ok("", "get", "services")
	wantTable := "NAME     REVISION   REPLICAS   READY   VERDICT   DOMAINS             BUNDLE/IMAGE          AGE\n" +
		"hello    2          2          0/2     -         hello.example.com   sha256:0123456789ab   3h\n" +
		"worker   1          1          0/1     -         -                   sha256:0123456789ab   3h\n"
	if out != wantTable {
		t.Errorf("get services:\n%s\nwant:\n%s", out, wantTable)
	}
	out = c.ok("", "get", "svc", "-o", "json")
	var svcs []client.Service
	if err := json.Unmarshal([]byte(out), &svcs); err != nil || len(svcs) != 2 || svcs[0].Name != "hello" {
		t.Errorf("get services -o json: %v %q", err, out)
	}
	out = c.ok("", "get", "services", "--project", "empty", "-o", "json")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("empty list prints %q, want []", out)
	}

	out = c.ok("", "get", "nodes")
	for _, want := range []string{"ID", "APPLIED/DESIRED", "LAST-SEEN", "nod_1", "4/5", "5s ago", "never"} {
		if !strings.Contains(out, want) {
			t.Errorf("get nodes lacks %q:\n%s", want, out)
		}
	}
	out = c.ok("", "get", "workloads")
	for _, want := range []string{"RESTARTS", "wl_1", "hello", "10.0.0.1:30001", "healthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("get workloads lacks %q:\n%s", want, out)
		}
	}

	// describe shows the service and only its workloads.
	out = c.ok("", "describe", "service", "hello")
	for _, want := range []string{"Name:", "hello", "Revision:", "./run", "hello.example.com", "2 desired, 0 ready", "GET / every 10s", "Workloads:", "wl_1"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "wl_2") {
		t.Errorf("describe shows another service's workload:\n%s", out)
	}

	// delete, then the service is gone and errors carry the API's message.
	if out := c.ok("", "delete", "service", "worker"); out != "service default/worker deleting: its workloads stop, then it is removed\n" {
		t.Errorf("delete output %q", out)
	}
	_, errOut, code = c.run("", "describe", "service", "worker")
	wantErr := `error: get service default/worker: service_not_found: no service "worker" in project "default" (404)` + "\n"
	if code != 1 || errOut != wantErr {
		t.Errorf("describe missing: exit %d stderr %q, want %q", code, errOut, wantErr)
	}

	// join-token create.
	out = c.ok("", "join-token", "create", "--ttl", "30m", "-o", "json")
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "expires_at,join_command,token" || m["expires_at"] != "2030-01-02T12:30:00Z" {
		t.Errorf("join-token json %s", out)
	}
	out = c.ok("", "join-token", "create")
	if !strings.Contains(out, "berth-agent join --server x --token brj_tok") || !strings.Contains(out, "shown once") {
		t.Errorf("join-token table %q", out)
	}
}

func TestBundlePush(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t, "brt_good")
	c := newCLI(t)
	c.env["BERTH_SERVER"] = srv.URL
	c.env["BERTH_TOKEN"] = "brt_good"

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	digest, _, err := bundle.Create(context.Background(), dir, &want)
	if err != nil {
		t.Fatal(err)
	}
	out := c.ok("", "bundle", "push", dir, "--name", "hello")
	if !strings.Contains(out, digest) || !strings.Contains(out, "as hello") {
		t.Errorf("push output %q, want digest %s", out, digest)
	}
	api.mu.Lock()
	stored := api.bundles[digest]
	api.mu.Unlock()
	if !bytes.Equal(stored, want.Bytes()) {
		t.Error("server stored other bytes than bundle.Create makes")
	}

	// An existing .tar.gz goes as is.
	tgz := filepath.Join(t.TempDir(), "release.tar.gz")
	if err := os.WriteFile(tgz, want.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out = c.ok("", "bundle", "push", tgz, "-o", "json")
	var b client.Bundle
	if err := json.Unmarshal([]byte(out), &b); err != nil || b.Digest != digest || b.Size != int64(want.Len()) {
		t.Errorf("push -o json: %v %q", err, out)
	}

	// A .tar.gz that is not one is refused before upload.
	bad := filepath.Join(t.TempDir(), "bad.tar.gz")
	if err := os.WriteFile(bad, []byte("nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := c.run("", "bundle", "push", bad)
	if code != 1 || !strings.Contains(errOut, "invalid bundle") {
		t.Errorf("bad bundle: exit %d stderr %q", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, args := range [][]string{
		{"get", "services"},              // no server
		{"get", "services", "-o", "xml"}, // bad output
		{"nosuch"},
		{"get", "nosuch"},
		{"apply"},
		{"rollout", "nosuch"},
		{"rollout", "status"},
		{"spec", "set", "hello"},
	} {
		_, errOut, code := c.run("", args...)
		if code != 1 || !strings.HasPrefix(errOut, "error: ") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("berth %v: exit %d stderr %q", args, code, errOut)
		}
	}
	for _, args := range [][]string{{"--help"}, {"apply", "--help"}, {"bundle", "push", "--help"}, {"join-token", "create", "--help"},
		{"rollout", "status", "--help"}, {"rollout", "undo", "--help"}, {"spec", "get", "--help"}, {"spec", "set", "--help"},
		{"get", "slots", "--help"}, {"node", "retire", "--help"}} {
		out := c.ok("", args...)
		if !strings.Contains(out, "Examples:") {
			t.Errorf("berth %v has no examples:\n%s", args, out)
		}
	}
}
