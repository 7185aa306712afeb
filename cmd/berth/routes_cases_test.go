package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/routes"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestPolicyTestRunsRouteCompilerCases: `berth policy test` on a route
// compiler (the default one berthd embeds) runs cases of services in and
// routes out through the host's CompileRoutes, passes those the compiler
// meets and fails, naming the route that differs, the one it does not.
func TestPolicyTestRunsRouteCompilerCases(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "routes.wasm"), routes.DefaultModule(), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := `module: routes.wasm
cases:
  - name: a domain goes to the workloads with an address
    input:
      services:
        - {id: svc_2, project: shop, name: web, domains: [Shop.Example.com.]}
        - {id: svc_1, project: blog, name: www, domains: [blog.example.com], tls_mode: acme}
      workloads:
        - {id: wl_3, service_id: svc_2, observed_status: starting, health: unknown}
        - {id: wl_2, service_id: svc_2, address: "10.0.0.2:8080", observed_status: starting, health: unknown}
        - {id: wl_1, service_id: svc_2, address: "10.0.0.1:8080", observed_status: running, health: passing}
    expect:
      routes:
        - {hostname: blog.example.com, project: blog, service: www, upstreams: [], tls_mode: acme, https_redirect: true}
        - hostname: shop.example.com
          project: shop
          service: web
          tls_mode: none
          upstreams:
            - {workload_id: wl_1, address: "10.0.0.1:8080", healthy: true}
            - {workload_id: wl_2, address: "10.0.0.2:8080", healthy: false}
  - name: no services, no routes
    input: {}
    expect: {routes: []}
  - name: a wrong expectation fails
    input:
      services: [{id: svc_1, project: shop, name: web, domains: [shop.example.com]}]
    expect:
      routes: [{hostname: shop.example.com, project: shop, service: api, upstreams: [], tls_mode: none}]
  - name: a field berthd never sends fails
    input:
      services: [{id: svc_1, project: shop, name: web, domain: [shop.example.com]}]
    expect: {routes: []}
`
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := newCLI(t).run("", "policy", "test", dir)
	for _, want := range []string{
		"ok    a domain goes to the workloads with an address\n",
		"ok    no services, no routes\n",
		`FAIL  a wrong expectation fails: route shop.example.com: got {"hostname":"shop.example.com","project":"shop","service":"web"`,
		`FAIL  a field berthd never sends fails: input: `,
		`unknown field "domain"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the report; exit %d, stdout:\n%s\nstderr:\n%s", want, code, out, errOut)
		}
	}
	t.Logf("report:\n%s", out)
	if code != 1 || !strings.Contains(errOut, "2 of 4 cases failed") {
		t.Errorf("exit %d, stderr %q; want 1 and 2 of 4 cases failed", code, errOut)
	}
}

// TestConformanceWasmDefaultRouteCompiler: the route compiler berthd embeds
// passes `berth conformance wasm`, whose sample check reads its table as
// berthd does.
func TestConformanceWasmDefaultRouteCompiler(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "default_routes.wasm")
	if err := os.WriteFile(file, routes.DefaultModule(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := newCLI(t).run("", "conformance", "wasm", file)
	if code != 0 || strings.Count(out, "ok    ") != 6 {
		t.Errorf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestPolicyTestAssertsMatchConditions: `berth policy test` cases of a
// route compiler that sets path prefixes and headers assert each route of
// a hostname by its conditions, and `berth conformance wasm` fails a
// compiler whose path prefix berthd refuses, naming the code.
func TestPolicyTestAssertsMatchConditions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rs := []abiroutes.Route{
		{Hostname: "shop.example.com", Project: "shop", Service: "web"},
		{Hostname: "shop.example.com", Project: "shop", Service: "web", PathPrefix: "/api", StripPrefix: true,
			Headers: []abiroutes.HeaderMatch{{Name: "X-Env", Value: "canary"}}},
	}
	raw, err := json.Marshal(abiwasm.RoutesOutput{Routes: rs, SHA256: abiroutes.Table{Routes: rs}.Digest()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "routes.wasm"), wasmtest.Routes("matching", string(raw)), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := `module: routes.wasm
cases:
  - name: the api route strips its prefix for canaries
    expect:
      routes:
        - {hostname: shop.example.com, project: shop, service: web, upstreams: []}
        - {hostname: shop.example.com, project: shop, service: web, upstreams: [],
           path_prefix: /api, strip_prefix: true, headers: [{name: X-Env, value: canary}]}
  - name: a missing strip fails
    expect:
      routes:
        - {hostname: shop.example.com, project: shop, service: web, upstreams: []}
        - {hostname: shop.example.com, project: shop, service: web, upstreams: [],
           path_prefix: /api, headers: [{name: X-Env, value: canary}]}
`
	if err := os.WriteFile(filepath.Join(dir, "policy_test.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := newCLI(t).run("", "policy", "test", dir)
	for _, want := range []string{
		"ok    the api route strips its prefix for canaries\n",
		`FAIL  a missing strip fails: route shop.example.com/api [x-env: canary]: got`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the report; exit %d, stdout:\n%s\nstderr:\n%s", want, code, out, errOut)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}

	bad := []abiroutes.Route{{Hostname: "shop.example.com", PathPrefix: "api"}}
	if raw, err = json.Marshal(abiwasm.RoutesOutput{Routes: bad, SHA256: abiroutes.Table{Routes: bad}.Digest()}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "bad.wasm")
	if err := os.WriteFile(file, wasmtest.Routes("bad-prefix", string(raw)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = newCLI(t).run("", "conformance", "wasm", file)
	if code == 0 || !strings.Contains(out+errOut, "route_path_prefix_invalid") {
		t.Errorf("conformance of a compiler with a relative path prefix: exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
