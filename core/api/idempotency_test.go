package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/berthhq/berth/core/idempotency"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// answer is one raw HTTP answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// raw sends r and returns the answer as it came.
func (f *fixture) raw(r req) answer {
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
		hr.Header.Set(HeaderIdempotencyKey, r.key)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}
}

func (a answer) code() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

func (a answer) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(a.body, &m)
	s, _ := m[name].(string)
	return s
}

// idemCase is one mutating route driven to a successful answer: first is the request, other
// the same route with another body, path or query.
type idemCase struct {
	route        string // "METHOD pattern" as the echo router names it
	first, other func() req
	// after, when not nil, runs on the first answer (to feed later cases).
	after func(a answer)
}

// exemptFromIdempotency lists the mutating routes that do not take Idempotency-Key, and why
// (docs/api.md section 1.7).
func exemptFromIdempotency() map[string]string {
	runner := "runner transport: a repeated call is settled by its lease token (docs/runner-protocol.md section 6)"
	return map[string]string{
		"POST /api/v1/nodes/enroll":    "unauthenticated: the single-use join token makes enrollment happen once",
		"POST /api/v1/login":           "unauthenticated: every login is a new session, never a replayed one",
		"POST /api/runner/v1/register": runner, "POST /api/runner/v1/heartbeat": runner, "POST /api/runner/v1/claim": runner,
		"POST /api/runner/v1/renew": runner, "POST /api/runner/v1/complete": runner, "POST /api/runner/v1/fail": runner,
		"POST /api/runner/v1/observe": runner, "POST /api/runner/v1/artifact": runner, "POST /api/runner/v1/runtime": runner,
		"POST /api/runner/v1/backup/begin": runner, "POST /api/runner/v1/backup/archive": runner, "POST /api/runner/v1/backup/commit": runner,
		"POST /api/runner/v1/backup/fail": runner, "POST /api/runner/v1/backup/record": runner, "POST /api/runner/v1/backup/source": runner,
		"POST /api/runner/v1/backup/drill": runner,
	}
}

// claimedOnlyRoutes lists the keyed routes TestIdempotencyKeyOnEveryMutatingRoute cannot drive
// to a success, and why; TestIdempotencyClaimRefusesEveryKeyedRoute shows that each passes
// through the middleware.
func claimedOnlyRoutes() map[string]string {
	return map[string]string{
		"POST /api/v1/projects/:project/placement/rollback": "needs a provider placement with a runner",
		// Its success needs a live agent that restarts; e2e.TestAgentUpgradeSkewAndRollback drives it.
		"POST /api/v1/nodes/:id/upgrade": "needs a node that upgrades and comes back",
		// Its success needs a live agent answering secret_key_rotate; e2e.TestSecretsNeverLeak drives it.
		"POST /api/v1/nodes/:id/secret-key/rotate": "needs a node with a live session",
		// Its success needs a binding made through the corestore plugin; core/bindings' tests and
		// e2e/corestore drive it.
		"DELETE /api/v1/projects/:project/services/:name/bindings/:binding": "needs a binding record",
		// Identity routes: their success paths are driven in identity_test.go; here it is shown
		// that each passes through the middleware.
		"POST /api/v1/logout": "identity", "POST /api/v1/users": "identity", "PUT /api/v1/users/:user/roles": "identity",
		"POST /api/v1/users/:user/credential": "identity", "POST /api/v1/tokens": "identity",
		"DELETE /api/v1/tokens/:token": "identity", "POST /api/v1/tokens/:token/rotate": "identity",
		// The job routes' success paths need a declared job and a run; e2e.TestJobs drives them.
		"POST /api/v1/projects/:project/jobs/:name/run": "needs a job", "POST /api/v1/projects/:project/jobs/:name/suspend": "needs a job",
		"POST /api/v1/projects/:project/jobs/:name/resume": "needs a job", "POST /api/v1/projects/:project/job-runs/:run/cancel": "needs a run",
	}
}

// drivenIdemRoutes lists the routes TestIdempotencyKeyOnEveryMutatingRoute drives to a
// success (that test checks its table against this list, so the two cannot drift apart).
func drivenIdemRoutes() []string {
	return []string{
		"PUT /api/v1/projects/:project", "PUT /api/v1/projects/:project/services/:name",
		"POST /api/v1/projects/:project/bundles", "PUT /api/v1/projects/:project/services/:name/spec",
		"POST /api/v1/projects/:project/services/:name/rollout/undo", "POST /api/v1/projects/:project/services/:name/backups",
		"POST /api/v1/projects/:project/services/:name/rollout/pause", "POST /api/v1/projects/:project/services/:name/rollout/resume",
		"POST /api/v1/projects/:project/services/:name/rollout/restart", "POST /api/v1/projects/:project/services/:name/rebalance",
		"POST /api/v1/projects/:project/backups/:id/restore", "POST /api/v1/projects/:project/backups/:id/drill",
		"POST /api/v1/projects/:project/services/:name/releases", "POST /api/v1/projects/:project/services/:name/releases/:tag/promote",
		"DELETE /api/v1/projects/:project/services/:name", "POST /api/v1/nodes/join-tokens", "POST /api/v1/nodes/join-codes", "POST /api/v1/nodes/:id/fence-ack",
		"POST /api/v1/nodes/:id/lost", "POST /api/v1/nodes/:id/retire", "DELETE /api/v1/nodes/:id",
		"PUT /api/v1/nodes/:id/capacity", "POST /api/v1/nodes/:id/cordon", "POST /api/v1/nodes/:id/uncordon", "POST /api/v1/nodes/:id/drain",
		"POST /api/v1/cluster/signing-key/rotate", "POST /api/v1/modules", "POST /api/v1/policy-bindings",
		"DELETE /api/v1/policy-bindings/:id", "POST /api/v1/runners/enrollment-tokens", "PUT /api/v1/projects/:project/placement",
		"POST /api/v1/projects/:project/operations", "DELETE /api/v1/projects/:project/placement",
		"PUT /api/v1/projects/:project/secrets/:secret", "PUT /api/v1/projects/:project/secret-sets/:set",
		"DELETE /api/v1/projects/:project/secret-sets/:set", "DELETE /api/v1/projects/:project/secrets/:secret",
		"POST /api/v1/secrets/keyring/rotate", "POST /api/v1/registry/gc", "POST /api/v1/projects/:project/services/:name/run",
	}
}

// TestIdempotencyKeyOnEveryMutatingRoute walks the echo router. Every mutating route but the
// exempt ones is driven to a successful answer with an Idempotency-Key: the exact replay
// answers the recorded status and body with Idempotency-Replayed: true and changes nothing; the
// same key with another request is 422 idempotency_key_reused and changes nothing. A route the
// table cannot drive to success (placement rollback needs a provider placement) is listed in
// claimedOnlyRoutes, and TestIdempotencyClaimRefusesEveryKeyedRoute shows that it, like every
// keyed route, passes through the middleware.
func TestIdempotencyKeyOnEveryMutatingRoute(t *testing.T) {
	t.Parallel()
	f := newFullFixture(t)
	ctx := context.Background()
	nodeID := seedServiceAndNode(t, f)
	enrollNode := func(host string) string {
		tok, _, err := f.reg.CreateJoinToken(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		code, out := f.json("POST", "/api/v1/nodes/enroll", map[string]any{"join_token": tok, "public_key": base64.StdEncoding.EncodeToString(pub),
			"hostname": host, "capacity": map[string]any{"cpus": 1, "memory_mb": 512}})
		if code != 201 {
			t.Fatalf("enroll %s: %d %v", host, code, out)
		}
		return out["node_id"].(string)
	}
	doomed, retiring := enrollNode("n2"), enrollNode("n3")
	auth := f.api.cfg.Leases
	l, _, err := auth.Grant(ctx, fencing.GrantRequest{ResourceType: node.LeaseResourceService, ResourceID: "svc_A", NodeID: nodeID, Mode: node.LeaseLocal})
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.RecordFenceFailure(ctx, nodeID, nodes.FenceFailure{LeaseID: l.ID, FencingToken: l.FencingToken, WorkloadIDs: []string{"wl_1"}}); err != nil {
		t.Fatal(err)
	}
	module := wasmtest.BuildGo(t, "examples/policies/require-digest")
	bundle := tarGz(t, &tar.Header{Name: "v2", Typeflag: tar.TypeReg, Mode: 0o755})

	js := func(method, path string, body any) func() req {
		return func() req {
			r := req{method: method, path: path, token: f.admin}
			if body != nil {
				r.ctype, r.body = "application/json", mustJSON(body)
			}
			return r
		}
	}
	upload := func(path, ctype string, body []byte) func() req {
		return func() req { return req{method: "POST", path: path, ctype: ctype, token: f.admin, body: body} }
	}
	const svc = "/api/v1/projects/default/services/"
	var moduleDigest, bindingID, backupID, drillOther string
	cases := []idemCase{
		{route: "PUT /api/v1/projects/:project", first: js("PUT", "/api/v1/projects/shop", map[string]any{}), other: js("PUT", "/api/v1/projects/shop2", map[string]any{})},
		{route: "PUT /api/v1/projects/:project/services/:name",
			first: js("PUT", svc+"api", map[string]any{"bundle": "app", "command": []string{"./app"}}),
			other: js("PUT", svc+"api", map[string]any{"bundle": "app", "command": []string{"./app", "-v"}})},
		{route: "POST /api/v1/projects/:project/bundles",
			first: upload("/api/v1/projects/default/bundles?name=v2", "application/gzip", bundle),
			other: upload("/api/v1/projects/default/bundles?name=v3", "application/gzip", bundle)},
		{route: "PUT /api/v1/projects/:project/services/:name/spec",
			first: js("PUT", svc+"web/spec", map[string]any{"expected_revision": nil, "spec": map[string]any{"replicas": map[string]any{"total": 2}}}),
			other: js("PUT", svc+"web/spec", map[string]any{"expected_revision": nil, "spec": map[string]any{"replicas": map[string]any{"total": 3}}})},
		{route: "POST /api/v1/projects/:project/services/:name/rollout/undo",
			first: func() req {
				// A second release gives undo something to go back to.
				if code, out := f.json("PUT", svc+"api", map[string]any{"bundle": "v2", "command": []string{"./app"}}); code != 200 {
					t.Fatalf("second release: %d %v", code, out)
				}
				return js("POST", svc+"api/rollout/undo", nil)()
			},
			other: js("POST", svc+"api/rollout/undo", map[string]any{})},
		{route: "POST /api/v1/projects/:project/services/:name/rollout/pause",
			first: js("POST", svc+"web/rollout/pause", nil), other: js("POST", svc+"web/rollout/pause", map[string]any{"expected_revision": 1})},
		{route: "POST /api/v1/projects/:project/services/:name/rollout/resume",
			first: js("POST", svc+"web/rollout/resume", nil), other: js("POST", svc+"web/rollout/resume", map[string]any{"expected_revision": 1})},
		{route: "POST /api/v1/projects/:project/services/:name/rollout/restart",
			first: js("POST", svc+"web/rollout/restart", nil), other: js("POST", svc+"web/rollout/restart", map[string]any{"expected_revision": 1})},
		{route: "POST /api/v1/projects/:project/services/:name/rebalance",
			first: js("POST", svc+"web/rebalance", nil), other: js("POST", svc+"web/rebalance", map[string]any{"dry_run": true})},
		{route: "POST /api/v1/projects/:project/services/:name/backups",
			first: js("POST", svc+"web/backups", map[string]any{"binding": "db"}),
			other: js("POST", svc+"web/backups", map[string]any{"binding": "files"})},
		{route: "POST /api/v1/projects/:project/backups/:id/restore",
			first: func() req {
				id := commitBackup(t, f, "web", "for-restore")
				backupID = id
				return js("POST", "/api/v1/projects/default/backups/"+id+"/restore", map[string]any{"into_scratch": true})()
			},
			other: func() req {
				return js("POST", "/api/v1/projects/default/backups/"+backupID+"/restore", map[string]any{"while_running": true})()
			}},
		{route: "POST /api/v1/projects/:project/backups/:id/drill",
			first: func() req {
				drillOther = commitBackup(t, f, "web", "for-drill-2")
				return js("POST", "/api/v1/projects/default/backups/"+commitBackup(t, f, "web", "for-drill")+"/drill", nil)()
			},
			other: func() req { return js("POST", "/api/v1/projects/default/backups/"+drillOther+"/drill", nil)() }},
		{route: "POST /api/v1/projects/:project/services/:name/releases",
			first: js("POST", svc+"api/releases", map[string]any{"tag": "v1.0.0"}),
			other: js("POST", svc+"api/releases", map[string]any{"tag": "v1.0.1"})},
		{route: "POST /api/v1/projects/:project/services/:name/releases/:tag/promote",
			first: func() req {
				if code, out := f.json("PUT", svc+"box", map[string]any{"runtime": "containerd", "image": "127.0.0.1:1/default/box@sha256:" + strings.Repeat("0a", 32)}); code != 201 {
					t.Fatalf("container service: %d %v", code, out)
				}
				f.recordPush("default/box", "v1", "sha256:"+strings.Repeat("1b", 32))
				f.recordPush("default/box", "v2", "sha256:"+strings.Repeat("2c", 32))
				return js("POST", svc+"box/releases/v1/promote", nil)()
			},
			other: js("POST", svc+"box/releases/v2/promote", nil)},
		{route: "DELETE /api/v1/projects/:project/services/:name", first: js("DELETE", svc+"api", nil), other: js("DELETE", svc+"api?expected_revision=1", nil)},
		{route: "POST /api/v1/nodes/join-tokens", first: js("POST", "/api/v1/nodes/join-tokens", map[string]any{"ttl_seconds": 60}),
			other: js("POST", "/api/v1/nodes/join-tokens", map[string]any{"ttl_seconds": 61})},
		{route: "POST /api/v1/nodes/join-codes", first: js("POST", "/api/v1/nodes/join-codes", map[string]any{"ttl_seconds": 60}),
			other: js("POST", "/api/v1/nodes/join-codes", map[string]any{"ttl_seconds": 61})},
		{route: "POST /api/v1/nodes/:id/fence-ack", first: js("POST", "/api/v1/nodes/"+nodeID+"/fence-ack", map[string]any{"lease_ids": []string{l.ID}}),
			other: js("POST", "/api/v1/nodes/"+nodeID+"/fence-ack", map[string]any{"lease_ids": []string{l.ID, "lse_other"}})},
		{route: "PUT /api/v1/nodes/:id/capacity", first: js("PUT", "/api/v1/nodes/"+nodeID+"/capacity", map[string]any{"memory_mib": 1024}),
			other: js("PUT", "/api/v1/nodes/"+nodeID+"/capacity", map[string]any{"memory_mib": 2048})},
		{route: "POST /api/v1/nodes/:id/cordon", first: js("POST", "/api/v1/nodes/"+nodeID+"/cordon", nil), other: js("POST", "/api/v1/nodes/"+doomed+"/cordon", nil)},
		{route: "POST /api/v1/nodes/:id/uncordon", first: js("POST", "/api/v1/nodes/"+nodeID+"/uncordon", nil), other: js("POST", "/api/v1/nodes/"+doomed+"/uncordon", nil)},
		{route: "POST /api/v1/nodes/:id/drain", first: js("POST", "/api/v1/nodes/"+nodeID+"/drain", map[string]any{"deadline_s": 60}),
			other: js("POST", "/api/v1/nodes/"+nodeID+"/drain", map[string]any{"deadline_s": 120})},
		{route: "POST /api/v1/nodes/:id/lost", first: js("POST", "/api/v1/nodes/"+nodeID+"/lost", nil), other: js("POST", "/api/v1/nodes/"+doomed+"/lost", nil)},
		{route: "POST /api/v1/nodes/:id/retire", first: js("POST", "/api/v1/nodes/"+retiring+"/retire", map[string]any{"disposition": "withdrawn"}),
			other: js("POST", "/api/v1/nodes/"+retiring+"/retire", map[string]any{"disposition": "lost"})},
		{route: "DELETE /api/v1/nodes/:id", first: js("DELETE", "/api/v1/nodes/"+doomed, nil), other: js("DELETE", "/api/v1/nodes/"+retiring, nil)},
		{route: "POST /api/v1/cluster/signing-key/rotate", first: js("POST", "/api/v1/cluster/signing-key/rotate", nil),
			other: js("POST", "/api/v1/cluster/signing-key/rotate", map[string]any{})},
		{route: "POST /api/v1/modules", first: upload("/api/v1/modules", "application/wasm", module),
			other: upload("/api/v1/modules", "application/wasm", append(bytes.Clone(module), 0)),
			after: func(a answer) { moduleDigest = a.field("digest") }},
		{route: "POST /api/v1/policy-bindings",
			first: func() req {
				return js("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": moduleDigest})()
			},
			other: func() req {
				return js("POST", "/api/v1/policy-bindings", map[string]any{"hook": "service.apply", "module": moduleDigest, "project": "shop"})()
			},
			after: func(a answer) { bindingID = a.field("id") }},
		{route: "DELETE /api/v1/policy-bindings/:id",
			first: func() req { return js("DELETE", "/api/v1/policy-bindings/"+bindingID, nil)() },
			other: js("DELETE", "/api/v1/policy-bindings/pb_other", nil)},
		{route: "POST /api/v1/runners/enrollment-tokens", first: js("POST", "/api/v1/runners/enrollment-tokens", map[string]any{"node_id": "west-1"}),
			other: js("POST", "/api/v1/runners/enrollment-tokens", map[string]any{"node_id": "west-2"})},
		{route: "PUT /api/v1/projects/:project/placement", first: js("PUT", "/api/v1/projects/default/placement", map[string]any{"release": "app"}),
			other: js("PUT", "/api/v1/projects/default/placement", map[string]any{"release": "v2"})},
		{route: "POST /api/v1/projects/:project/operations", first: js("POST", "/api/v1/projects/default/operations", map[string]any{"kind": "backup"}),
			other: js("POST", "/api/v1/projects/default/operations", map[string]any{"kind": "restore"})},
		{route: "DELETE /api/v1/projects/:project/placement", first: js("DELETE", "/api/v1/projects/default/placement", nil),
			other: js("DELETE", "/api/v1/projects/shop/placement", nil)},
		{route: "PUT /api/v1/projects/:project/secrets/:secret", first: js("PUT", "/api/v1/projects/default/secrets/db-url", map[string]any{"value": "one"}),
			other: js("PUT", "/api/v1/projects/default/secrets/db-url", map[string]any{"value": "two"})},
		{route: "PUT /api/v1/projects/:project/secret-sets/:set",
			first: js("PUT", "/api/v1/projects/default/secret-sets/payments", map[string]any{"secrets": map[string]any{"DB_URL": "db-url"}}),
			other: js("PUT", "/api/v1/projects/default/secret-sets/payments", map[string]any{"secrets": map[string]any{"DB": "db-url"}})},
		{route: "DELETE /api/v1/projects/:project/secret-sets/:set", first: js("DELETE", "/api/v1/projects/default/secret-sets/payments", nil),
			other: js("DELETE", "/api/v1/projects/default/secret-sets/payments?expected_revision=1", nil)},
		{route: "DELETE /api/v1/projects/:project/secrets/:secret", first: js("DELETE", "/api/v1/projects/default/secrets/db-url", nil),
			other: js("DELETE", "/api/v1/projects/default/secrets/db-url?expected_revision=1", nil)},
		{route: "POST /api/v1/secrets/keyring/rotate", first: js("POST", "/api/v1/secrets/keyring/rotate", nil),
			other: js("POST", "/api/v1/secrets/keyring/rotate", map[string]any{"retire_old": true})},
		{route: "POST /api/v1/registry/gc", first: js("POST", "/api/v1/registry/gc", map[string]any{"dry_run": true}),
			other: js("POST", "/api/v1/registry/gc", map[string]any{"dry_run": false})},
		{route: "POST /api/v1/projects/:project/services/:name/run", first: js("POST", svc+"web/run", map[string]any{"command": []string{"./app", "--once"}}),
			other: js("POST", svc+"web/run", map[string]any{"command": []string{"./app", "--twice"}})},
	}
	for i, tc := range cases {
		t.Run(tc.route, func(t *testing.T) {
			key := "key-" + strconv.Itoa(1000+i)
			first := tc.first()
			first.key = key
			a1 := f.raw(first)
			if a1.status < 200 || a1.status > 299 || a1.header.Get(HeaderIdempotencyReplayed) != "" {
				t.Fatalf("first request: %d %s", a1.status, a1.body)
			}
			if tc.after != nil {
				tc.after(a1)
			}
			before := f.snapshot()
			a2 := f.raw(first)
			if a2.status != a1.status || !bytes.Equal(a2.body, a1.body) || a2.header.Get(HeaderIdempotencyReplayed) != "true" {
				t.Fatalf("replay: %d %q %s, want %d %s", a2.status, a2.header.Get(HeaderIdempotencyReplayed), a2.body, a1.status, a1.body)
			}
			if ct := a2.header.Get("Content-Type"); ct != a1.header.Get("Content-Type") {
				t.Fatalf("replay Content-Type %q, want %q", ct, a1.header.Get("Content-Type"))
			}
			other := tc.other()
			other.key = key
			if a3 := f.raw(other); a3.status != 422 || a3.code() != "idempotency_key_reused" {
				t.Fatalf("same key, another request: %d %s", a3.status, a3.body)
			}
			if after := f.snapshot(); after != before {
				t.Fatalf("a replay or a reused key changed the store:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	var tableRoutes []string
	for _, tc := range cases {
		tableRoutes = append(tableRoutes, tc.route)
	}
	slices.Sort(tableRoutes)
	if want := slices.Sorted(slices.Values(drivenIdemRoutes())); !slices.Equal(tableRoutes, want) {
		t.Errorf("the table drives %v\ndrivenIdemRoutes lists %v", tableRoutes, want)
	}
}

// TestIdempotencyClaimRefusesEveryKeyedRoute walks the echo router: every mutating route but
// the exempt ones has a row (driven to success by TestIdempotencyKeyOnEveryMutatingRoute, or
// listed in claimedOnlyRoutes with the reason), and each passes through the middleware: a
// recorded claim of another request under the key refuses the request with 422
// idempotency_key_reused before the handler runs, and the store does not change. It has its
// own server so that it runs beside the table test.
func TestIdempotencyClaimRefusesEveryKeyedRoute(t *testing.T) {
	t.Parallel()
	f := newFullFixture(t)
	ctx := context.Background()
	nodeID := seedServiceAndNode(t, f)
	claimedOnly := claimedOnlyRoutes()
	driven := map[string]bool{}
	for _, r := range drivenIdemRoutes() {
		driven[r] = true
	}
	exempt := exemptFromIdempotency()
	seen := map[string]bool{}
	var keyed []*echo.Route
	for _, r := range f.api.e.Routes() {
		key := r.Method + " " + r.Path
		if !mutating(r.Method) || seen[key] {
			continue
		}
		seen[key] = true
		_, isExempt := exempt[key]
		_, isClaimed := claimedOnly[key]
		switch {
		case isExempt:
			continue
		case !driven[key] && !isClaimed:
			t.Errorf("mutating route %s has no row: drive it to success in TestIdempotencyKeyOnEveryMutatingRoute "+
				"(and list it in drivenIdemRoutes), list it in claimedOnlyRoutes, or list why it is exempt", key)
			continue
		}
		keyed = append(keyed, r)
	}
	// Every keyed route passes through the middleware: a claim of another request under the
	// key refuses this one before the handler runs. The claims, one key per route, are all
	// recorded first, so that the store is the same before each request and one snapshot
	// after each is the next one's before.
	claimKey := func(key string) string { return "claimed-" + key }
	now := f.clock.now().UTC()
	for _, r := range keyed {
		k := claimKey(r.Method + " " + r.Path)
		if err := f.api.cfg.Idempotency.Insert(ctx, idempotency.Record{ID: idempotencyID(f.admin, r.Method, r.Path, k), Claim: "c", State: idempotency.Pending,
			Request: "another", ClaimedAt: now, ExpiresAt: now.Add(IdempotencyTTL)}); err != nil {
			t.Fatal(err)
		}
	}
	w := f.watch()
	for _, r := range keyed {
		key := r.Method + " " + r.Path
		t.Run("claimed "+key, func(t *testing.T) {
			rq := req{method: r.Method, path: concretePath(r.Path, nodeID), token: f.admin, key: claimKey(key)}
			if everyRoute()[key].body != bodyNone {
				rq.ctype, rq.body = "application/json", []byte(`{}`)
			}
			a := f.raw(rq)
			_, _, changed := w.step()
			if a.status != 422 || a.code() != "idempotency_key_reused" {
				t.Fatalf("got %d %s", a.status, a.body)
			}
			if changed {
				t.Fatalf("the store changed")
			}
		})
	}
	for key := range exempt {
		if !seen[key] {
			t.Errorf("exempt route %s is not served", key)
		}
	}
}

// requestDigest is the digest the middleware computes for a request with a JSON body.
func requestDigest(bearer, key, method, path, query, ctype string, body []byte) string {
	seal := sha256.Sum256([]byte("berth.idempotency.seal.v1\x00" + bearer + "\x00" + key))
	h := hmac.New(sha256.New, seal[:])
	for _, p := range []string{method, path, query, ctype} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// TestIdempotencyInFlightFailedAndExpired: a key whose first request has not answered refuses a
// second arrival with 409 idempotency_key_in_flight until the claim times out, after which the
// request runs; a 5xx answer is not recorded, so a retry with the key runs again and succeeds;
// a recorded answer expires after IdempotencyTTL, the sweep deletes it, and the key is new again.
func TestIdempotencyInFlightFailedAndExpired(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	var rotations atomic.Int64
	f := newFixtureWith(t, func(c *Config) {
		c.KeyRotator = keyRotatorFunc(func(context.Context) (KeyRotation, error) {
			if fail.Load() {
				return KeyRotation{}, errors.New("keyring unwritable")
			}
			n := rotations.Add(1)
			return KeyRotation{KeyID: "key_" + string(rune('0'+n)), Nodes: []NodeKeyRotated{}}, nil
		})
	})
	ctx := context.Background()
	const path = "/api/v1/cluster/signing-key/rotate"
	rotate := func(key string) answer {
		return f.raw(req{method: "POST", path: path, token: f.admin, key: key})
	}

	// In flight: a fresh pending claim of the same request.
	now := f.clock.now().UTC()
	id := idempotencyID(f.admin, "POST", path, "k1")
	if err := f.api.cfg.Idempotency.Insert(ctx, idempotency.Record{ID: id, Claim: "other", State: idempotency.Pending,
		Request: requestDigest(f.admin, "k1", "POST", path, "", "", nil), ClaimedAt: now, ExpiresAt: now.Add(IdempotencyTTL)}); err != nil {
		t.Fatal(err)
	}
	if a := rotate("k1"); a.status != 409 || a.code() != "idempotency_key_in_flight" || a.header.Get("Retry-After") == "" {
		t.Fatalf("in flight: %d %s %v", a.status, a.body, a.header)
	}
	if rotations.Load() != 0 {
		t.Fatal("the handler ran while the key was in flight")
	}
	// The claim's process died: after the claim timeout the request takes the key over.
	f.clock.add(IdempotencyClaimTimeout)
	a := rotate("k1")
	if a.status != 200 || a.field("key_id") != "key_1" {
		t.Fatalf("after the claim timeout: %d %s", a.status, a.body)
	}
	if a := rotate("k1"); a.status != 200 || a.field("key_id") != "key_1" || a.header.Get(HeaderIdempotencyReplayed) != "true" {
		t.Fatalf("replay after takeover: %d %s", a.status, a.body)
	}

	// A 5xx is not recorded: the retry runs the handler again.
	fail.Store(true)
	if a := rotate("k2"); a.status != 500 {
		t.Fatalf("failing rotation: %d %s", a.status, a.body)
	}
	fail.Store(false)
	if a := rotate("k2"); a.status != 200 || a.field("key_id") != "key_2" || a.header.Get(HeaderIdempotencyReplayed) != "" {
		t.Fatalf("retry after a 5xx: %d %s", a.status, a.body)
	}

	// Expiry: a day later the record is absent for lookups and the sweep deletes it.
	if n, err := f.api.SweepIdempotency(ctx); err != nil || n != 0 {
		t.Fatalf("early sweep: %d %v", n, err)
	}
	f.clock.add(IdempotencyTTL)
	if n, err := f.api.SweepIdempotency(ctx); err != nil || n != 2 {
		t.Fatalf("sweep after a day: %d %v", n, err)
	}
	if a := rotate("k1"); a.status != 200 || a.field("key_id") != "key_3" || a.header.Get(HeaderIdempotencyReplayed) != "" {
		t.Fatalf("the key after expiry: %d %s", a.status, a.body)
	}
	// A lookup does not depend on the sweep: an expired, unswept record is taken over.
	f.clock.add(IdempotencyTTL + time.Second)
	if a := rotate("k1"); a.status != 200 || a.field("key_id") != "key_4" {
		t.Fatalf("an expired record before the sweep: %d %s", a.status, a.body)
	}
}

// TestIdempotencyRecordsRevealNoAnswer: the record of a join token's answer holds neither the
// token nor the bearer, and the replay still answers the token.
func TestIdempotencyRecordsRevealNoAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.raw(req{method: "POST", path: "/api/v1/nodes/join-tokens", token: f.admin, key: "k"})
	tok := a.field("token")
	if a.status != 201 || !strings.HasPrefix(tok, "brj_") {
		t.Fatalf("join token: %d %s", a.status, a.body)
	}
	if snap := f.snapshot(); strings.Contains(snap, tok) || strings.Contains(snap, f.admin) || !strings.Contains(snap, "idempotency") {
		t.Fatalf("the store holds the token or the bearer, or no record:\n%s", snap)
	}
	if b := f.raw(req{method: "POST", path: "/api/v1/nodes/join-tokens", token: f.admin, key: "k"}); b.field("token") != tok {
		t.Fatalf("replay: %d %s", b.status, b.body)
	}
}

// TestIdempotencyConcurrentArrivals: eight requests with one key arriving at once run the
// handler once: every success carries the one join token created, every other answer is 409
// idempotency_key_in_flight.
func TestIdempotencyConcurrentArrivals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 8
	answers := make(chan answer, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			hr, _ := http.NewRequest("POST", f.srv.URL+"/api/v1/nodes/join-tokens", nil)
			hr.Header.Set("Authorization", "Bearer "+f.admin)
			hr.Header.Set(HeaderIdempotencyKey, "same")
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				answers <- answer{body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers <- answer{status: resp.StatusCode, header: resp.Header, body: body}
		}()
	}
	close(start)
	tokens := map[string]bool{}
	for range n {
		a := <-answers
		switch {
		case a.status == 201:
			tokens[a.field("token")] = true
		case a.status == 409 && a.code() == "idempotency_key_in_flight":
		default:
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
	if len(tokens) != 1 {
		t.Fatalf("%d different join tokens were created under one key", len(tokens))
	}
}

// TestClientIdempotencyKey: the Go client's WithIdempotencyKey makes a repeated apply answer the
// first apply's result (the same revision, not a second write), and the key with another spec
// fails with idempotency_key_reused.
func TestClientIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	c, err := client.New(f.srv.URL, client.WithToken(f.admin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(ctx, "default", "app", bytes.NewReader(tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755}))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyService(ctx, "default", "web", client.ServiceSpec{Bundle: "app", Command: []string{"./app"}}); err != nil {
		t.Fatal(err)
	}
	keyed := c.WithIdempotencyKey("deploy-2")
	spec := client.ServiceSpec{Bundle: "app", Command: []string{"./app", "-v"}}
	first, err := keyed.ApplyService(ctx, "default", "web", spec)
	if err != nil || first.Revision != 2 || first.Changed == nil || !*first.Changed {
		t.Fatalf("first keyed apply: %+v %v", first, err)
	}
	// Meanwhile another change lands; the repeat still answers what the first call did.
	if _, err := c.ApplyService(ctx, "default", "web", client.ServiceSpec{Bundle: "app", Command: []string{"./app", "-q"}}); err != nil {
		t.Fatal(err)
	}
	again, err := keyed.ApplyService(ctx, "default", "web", spec)
	if err != nil || again.Revision != 2 || again.Changed == nil || !*again.Changed {
		t.Fatalf("repeated keyed apply: %+v %v", again, err)
	}
	if got, _ := c.GetService(ctx, "default", "web"); got.Revision != 3 {
		t.Fatalf("the repeat wrote: revision %d, want 3", got.Revision)
	}
	if _, err := keyed.ApplyService(ctx, "default", "web", client.ServiceSpec{Bundle: "app", Command: []string{"./app", "-x"}}); !client.IsCode(err, "idempotency_key_reused") {
		t.Fatalf("the key with another spec: %v", err)
	}
}
