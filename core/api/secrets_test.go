package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestSecretsAPIIsValueFree writes distinctive values (one short enough to guess) and shows
// that no answer (first or replayed), no change-log entry and no stored document, the
// Idempotency-Key record included, holds a value or a plain SHA-256 of it or of the body.
func TestSecretsAPIIsValueFree(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	long, short := "Zq-"+rand.Text(), "4711"
	var answers []string
	keep := func(a answer) answer { answers = append(answers, string(a.body)); return a }
	put := func(name, value, key string) answer {
		return keep(f.raw(req{method: "PUT", path: "/api/v1/projects/shop/secrets/" + name, ctype: "application/json", token: f.admin,
			body: mustJSON(map[string]any{"value": value}), key: key}))
	}
	a := put("stripe-key", long, "k-1")
	if a.status != 201 || !strings.Contains(string(a.body), `"current":1`) || !strings.Contains(string(a.body), `"digest":"hmac-sha256:`) {
		t.Fatalf("first put: %d %s", a.status, a.body)
	}
	if r := put("stripe-key", long, "k-1"); r.status != 201 || string(r.body) != string(a.body) || r.header.Get(HeaderIdempotencyReplayed) != "true" {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	if r := put("stripe-key", short, ""); r.status != 200 || !strings.Contains(string(r.body), `"current":2`) {
		t.Fatalf("second version: %d %s", r.status, r.body)
	}
	if r := put("pin", short, "k-2"); r.status != 201 {
		t.Fatalf("short secret: %d %s", r.status, r.body)
	}
	for _, p := range []string{"/api/v1/projects/shop/secrets", "/api/v1/projects/shop/secrets/stripe-key", "/api/v1/changelog"} {
		keep(f.raw(req{method: "GET", path: p, token: f.admin}))
	}
	got := strings.Join(answers, "\n")
	if !strings.Contains(got, "stripe-key") {
		t.Fatalf("the change log and reads should name the secret:\n%s", got)
	}
	store := f.snapshot()
	hexOf := func(b string) string { s := sha256.Sum256([]byte(b)); return hex.EncodeToString(s[:]) }
	// The request digest of an Idempotency-Key record is keyed: the plain SHA-256 of the request
	// a guesser would compute for the short value is not stored.
	plain := hexOf("PUT\x00/api/v1/projects/shop/secrets/pin\x00\x00application/json\x00" + string(mustJSON(map[string]any{"value": short})))
	if strings.Contains(store, plain) {
		t.Errorf("the store holds the plain SHA-256 of the request that carried %q", short)
	}
	for _, v := range []string{long, short} {
		for where, text := range map[string]string{"an answer": got, "the store": store} {
			for _, needle := range []string{v, hexOf(v), hexOf(string(mustJSON(map[string]any{"value": v})))} {
				if strings.Contains(text, needle) {
					t.Errorf("%s holds %q (value %q or a plain hash of it)", where, needle, v)
				}
			}
		}
	}
	// Bounds: a value over 64 KiB, a missing value, a bad name.
	if r := put("big", strings.Repeat("x", 64<<10+1), ""); r.status != 413 || r.code() != "secret_too_large" {
		t.Fatalf("big value: %d %s", r.status, r.body)
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/x", map[string]any{}); code != 422 || out["code"] != "validation_failed" {
		t.Fatalf("missing value: %d %v", code, out)
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/Bad_Name", map[string]any{"value": "x"}); code != 422 || out["code"] != "invalid_name" {
		t.Fatalf("bad name: %d %v", code, out)
	}
	if code, out := f.json("GET", "/api/v1/projects/shop/secrets/none", nil); code != 404 || out["code"] != "secret_not_found" {
		t.Fatalf("missing secret: %d %v", code, out)
	}
}

// TestServiceSecretReferences applies services that reference secrets and sets: unknown ones are
// 422 secret_unknown naming them, a change of reference is a new revision of what the service
// runs, and deleting what a service uses is 409 secret_in_use naming the service.
func TestServiceSecretReferences(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	for _, n := range []string{"stripe-key", "db"} {
		for i := range 3 {
			if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/"+n, map[string]any{"value": fmt.Sprint(n, i)}); code/100 != 2 {
				t.Fatalf("put %s: %d %v", n, code, out)
			}
		}
	}
	apply := func(body map[string]any) (int, map[string]any) {
		body["bundle"], body["command"] = "app", []string{"./app"}
		return f.json("PUT", "/api/v1/projects/shop/services/api", body)
	}
	for name, tc := range map[string]struct {
		body map[string]any
		code string
		want string
	}{
		"unknown secret":   {map[string]any{"secrets": map[string]any{"X": "nope"}}, "secret_unknown", "nope"},
		"unknown version":  {map[string]any{"secrets": map[string]any{"X": map[string]any{"secret": "db", "version": 9}}}, "secret_unknown", "db"},
		"unknown set":      {map[string]any{"secret_sets": []string{"ghost"}}, "secret_unknown", "ghost"},
		"bad key":          {map[string]any{"secrets": map[string]any{"1X": "db"}}, "validation_failed", "1X"},
		"reserved key":     {map[string]any{"secrets": map[string]any{"BERTH_X": "db"}}, "validation_failed", "BERTH_X"},
		"bad as":           {map[string]any{"secrets": map[string]any{"X": map[string]any{"secret": "db", "as": "disk"}}}, "validation_failed", "as"},
		"also in env":      {map[string]any{"env": map[string]any{"X": "1"}, "secrets": map[string]any{"X": "db"}}, "validation_failed", "X"},
		"unknown ref key":  {map[string]any{"secrets": map[string]any{"X": map[string]any{"secret": "db", "value": "v"}}}, "bad_request", ""},
		"value not a name": {map[string]any{"secrets": map[string]any{"X": 7}}, "bad_request", ""},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := apply(tc.body)
			if out["code"] != tc.code || !strings.Contains(fmt.Sprint(out["detail"]), tc.want) || code < 400 {
				t.Fatalf("%d %v; want %s naming %q", code, out, tc.code, tc.want)
			}
		})
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/secret-sets/payments", map[string]any{"secrets": map[string]any{"STRIPE_KEY": "stripe-key"}}); code != 201 {
		t.Fatalf("put set: %d %v", code, out)
	}
	code, out := apply(map[string]any{"secrets": map[string]any{"DB_URL": map[string]any{"secret": "db", "version": 2}, "DB_FILE": map[string]any{"secret": "db", "as": "file"}},
		"secret_sets": []string{"payments"}})
	if code != 201 {
		t.Fatalf("apply: %d %v", code, out)
	}
	rev := out["revision"]
	if code, out := apply(map[string]any{"secrets": map[string]any{"STRIPE_KEY": "db"}, "secret_sets": []string{"payments"}}); code != 422 || !strings.Contains(fmt.Sprint(out["detail"]), "STRIPE_KEY") {
		t.Fatalf("a key given by a set and directly: %d %v", code, out)
	}
	// The same references again change nothing; another pinned version is a new revision.
	code, out = apply(map[string]any{"secrets": map[string]any{"DB_URL": map[string]any{"secret": "db", "version": 2}, "DB_FILE": map[string]any{"secret": "db", "as": "file"}},
		"secret_sets": []string{"payments"}})
	if code != 200 || out["changed"] != false || out["revision"] != rev {
		t.Fatalf("same apply: %d %v", code, out)
	}
	code, out = apply(map[string]any{"secrets": map[string]any{"DB_URL": map[string]any{"secret": "db", "version": 3}, "DB_FILE": map[string]any{"secret": "db", "as": "file"}},
		"secret_sets": []string{"payments"}, "expected_revision": rev})
	if code != 200 || out["changed"] != true || out["revision"] == rev {
		t.Fatalf("changed version: %d %v", code, out)
	}
	if code, out := apply(map[string]any{"secrets": map[string]any{"DB_URL": "db"}, "expected_revision": rev}); code != 409 || out["code"] != "revision_conflict" {
		t.Fatalf("stale expected_revision: %d %v", code, out)
	}
	code, out = f.json("GET", "/api/v1/projects/shop/services/api", nil)
	if code != 200 || fmt.Sprint(out["secrets"]) != "map[DB_FILE:map[as:file secret:db] DB_URL:map[secret:db version:3]]" || fmt.Sprint(out["secret_sets"]) != "[payments]" {
		t.Fatalf("get service: %d secrets %v sets %v", code, out["secrets"], out["secret_sets"])
	}
	code, out = f.json("GET", "/api/v1/projects/shop/secrets/stripe-key", nil)
	if code != 200 || fmt.Sprint(out["used_by"]) != "[map[keys:[STRIPE_KEY] service:api via:payments]]" {
		t.Fatalf("used_by: %d %v", code, out["used_by"])
	}
	code, out = f.json("GET", "/api/v1/projects/shop/services/api", nil)
	if fmt.Sprint(out["resolved_secrets"]) != "map[DB_FILE:map[as:file secret:db version:3] DB_URL:map[secret:db version:3] STRIPE_KEY:map[secret:stripe-key version:3]]" {
		t.Fatalf("resolved secrets: %v", out["resolved_secrets"])
	}
	rev = out["revision"]
	// A new version of a secret the service uses unpinned (through the set) is a new revision of
	// what it runs, so it rolls out; a pinned one would not move.
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/stripe-key", map[string]any{"value": "new"}); code != 200 {
		t.Fatalf("new version: %d %v", code, out)
	}
	code, out = f.json("GET", "/api/v1/projects/shop/services/api", nil)
	if out["revision"] == rev || fmt.Sprint(out["resolved_secrets"].(map[string]any)["STRIPE_KEY"]) != "map[secret:stripe-key version:4]" {
		t.Fatalf("after a new version: revision %v (was %v), resolved %v", out["revision"], rev, out["resolved_secrets"])
	}
	rev = out["revision"]
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/db", map[string]any{"value": "pinned-stays"}); code != 200 {
		t.Fatalf("new db version: %d %v", code, out)
	}
	// DB_FILE is unpinned and moves; DB_URL is pinned at 3 and stays.
	code, out = f.json("GET", "/api/v1/projects/shop/services/api", nil)
	res := out["resolved_secrets"].(map[string]any)
	if fmt.Sprint(res["DB_URL"]) != "map[secret:db version:3]" || fmt.Sprint(res["DB_FILE"]) != "map[as:file secret:db version:4]" || out["revision"] == rev {
		t.Fatalf("after a db version: %v", res)
	}
	for _, p := range []string{"/api/v1/projects/shop/secrets/db", "/api/v1/projects/shop/secrets/stripe-key", "/api/v1/projects/shop/secret-sets/payments"} {
		if code, out := f.json("DELETE", p, nil); code != 409 || out["code"] != "secret_in_use" || !strings.Contains(fmt.Sprint(out["detail"]), "api") {
			t.Fatalf("delete %s in use: %d %v", p, code, out)
		}
	}
	if code, out := apply(map[string]any{}); code != 200 {
		t.Fatalf("drop references: %d %v", code, out)
	}
	for _, p := range []string{"/api/v1/projects/shop/secret-sets/payments", "/api/v1/projects/shop/secrets/stripe-key", "/api/v1/projects/shop/secrets/db"} {
		if code, out := f.json("DELETE", p, nil); code != 204 {
			t.Fatalf("delete %s: %d %v", p, code, out)
		}
	}
}

// TestSecretScopes: secret:read reads but does not write, services:write neither.
func TestSecretScopes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/k", map[string]any{"value": "v"}); code != 201 {
		t.Fatalf("put: %d %v", code, out)
	}
	tok := func(name string, scopes ...string) string {
		code, out := f.json("POST", "/api/v1/tokens", map[string]any{"name": name, "scopes": scopes})
		if code != 201 {
			t.Fatalf("token %s: %d %v", name, code, out)
		}
		return out["token"].(string)
	}
	reader, deployer, writer := tok("reader", "secret:read"), tok("deployer", "services:write"), tok("writer", "secret:write")
	for _, c := range []struct {
		token, method, path string
		body                any
		want                int
	}{
		{reader, "GET", "/api/v1/projects/shop/secrets/k", nil, 200},
		{reader, "PUT", "/api/v1/projects/shop/secrets/k", map[string]any{"value": "x"}, 403},
		{deployer, "GET", "/api/v1/projects/shop/secrets", nil, 403},
		{deployer, "PUT", "/api/v1/projects/shop/secrets/k", map[string]any{"value": "x"}, 403},
		{writer, "GET", "/api/v1/projects/shop/secrets", nil, 200},
		{writer, "PUT", "/api/v1/projects/shop/secrets/k", map[string]any{"value": "x"}, 200},
		{writer, "GET", "/api/v1/secrets/keyring", nil, 403},
	} {
		if code, out := f.as(c.token, c.method, c.path, c.body); code != c.want {
			t.Errorf("%s %s: %d %v, want %d", c.method, c.path, code, out, c.want)
		}
	}
}

// TestKeyringRoutes rotates through the API: the status shows both KEKs until the re-wrap ran,
// and a second rotation while one runs is 409.
func TestKeyringRoutes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if code, out := f.json("PUT", "/api/v1/projects/shop/secrets/k", map[string]any{"value": "v"}); code != 201 {
		t.Fatalf("put: %d %v", code, out)
	}
	code, out := f.json("GET", "/api/v1/secrets/keyring", nil)
	if code != 200 || out["ok"] != true || len(out["keks"].([]any)) != 1 {
		t.Fatalf("status: %d %v", code, out)
	}
	code, out = f.json("POST", "/api/v1/secrets/keyring/rotate", nil)
	if code != 202 || len(out["keks"].([]any)) != 2 || out["rotation"].(map[string]any)["state"] != "running" {
		t.Fatalf("rotate: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/secrets/keyring/rotate", map[string]any{"retire_old": true}); code != 409 || out["code"] != "keyring_rotation_running" {
		t.Fatalf("second rotate: %d %v", code, out)
	}
}

// allBytes is every byte value once, 0x00 to 0xff.
func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// TestSecretValuesAreExactBytes: value_base64 carries every byte value and the store seals
// exactly those bytes; a "value" that is not UTF-8 text (raw bytes JSON decoding would replace,
// or a lone surrogate escape) is refused instead of stored changed; a value with a NUL byte or
// bytes that are not UTF-8 may be delivered as a file but not as an environment variable, at
// apply, in a set and at a new version.
func TestSecretValuesAreExactBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	opened := func(name string) []byte {
		t.Helper()
		p, err := f.api.cfg.Catalog.GetProject(ctx, "shop")
		if err != nil {
			t.Fatal(err)
		}
		st := f.api.cfg.Secrets.Store
		sec, v, err := st.Resolve(ctx, p.ID, name, 0)
		if err != nil {
			t.Fatal(err)
		}
		value, err := st.Open(sec, v)
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
	put := func(name string, body []byte) answer {
		return f.raw(req{method: "PUT", path: "/api/v1/projects/shop/secrets/" + name, ctype: "application/json", token: f.admin, body: body})
	}
	want := allBytes()
	// Raw bytes that are not UTF-8 would reach the store as U+FFFD: refused, nothing stored.
	if a := put("raw", append(append([]byte(`{"value":"`), want[0x80:]...), `"}`...)); a.status != 422 || a.code() != "validation_failed" {
		t.Errorf("raw bytes 0x80..0xff as value: %d %s; want 422 validation_failed", a.status, a.body)
		if a.status/100 == 2 {
			t.Fatalf("stored %d bytes for the 128 sent: %x", len(opened("raw")), opened("raw"))
		}
	}
	if a := put("bin", mustJSON(map[string]any{"value_base64": base64.StdEncoding.EncodeToString(want)})); a.status != 201 {
		t.Fatalf("value_base64: %d %s", a.status, a.body)
	}
	if got := opened("bin"); !bytes.Equal(got, want) {
		t.Fatalf("stored value differs from the bytes sent:\n got %x\nwant %x", got, want)
	}
	// Text still goes as "value", U+FFFD included when the client sent it.
	if a := put("text", []byte(`{"value":"gr\u00fc\u00dfe \ufffd `+"\uFFFD"+`"}`)); a.status != 201 {
		t.Fatalf("text value: %d %s", a.status, a.body)
	}
	if got := string(opened("text")); got != "grüße \uFFFD \uFFFD" {
		t.Fatalf("text value stored as %q", got)
	}
	for name, body := range map[string][]byte{
		"raw high bytes": append(append([]byte(`{"value":"`), want[0x80:]...), `"}`...),
		"lone surrogate": []byte(`{"value":"ab\udc80"}`),
		"both fields":    []byte(`{"value":"a","value_base64":"YQ=="}`),
		"bad base64":     []byte(`{"value_base64":"not base64!"}`),
		"neither":        []byte(`{}`),
	} {
		if a := put("bad", body); a.status != 422 || a.code() != "validation_failed" || !strings.Contains(string(a.body), "value") {
			t.Errorf("%s: %d %s; want 422 validation_failed naming the value", name, a.status, a.body)
		}
	}
	if code, out := f.json("GET", "/api/v1/projects/shop/secrets/bad", nil); code != 404 {
		t.Fatalf("a refused value was stored: %d %v", code, out)
	}
	if a := put("big", mustJSON(map[string]any{"value_base64": base64.StdEncoding.EncodeToString(make([]byte, 64<<10+1))})); a.status != 413 || a.code() != "secret_too_large" {
		t.Fatalf("big binary value: %d %s", a.status, a.body)
	}

	// Delivery: a file takes any bytes; an environment variable cannot hold a NUL byte.
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/shop/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	apply := func(body map[string]any) (int, map[string]any) {
		body["bundle"], body["command"] = "app", []string{"./app"}
		return f.json("PUT", "/api/v1/projects/shop/services/api", body)
	}
	if code, out := apply(map[string]any{"secrets": map[string]any{"BIN": "bin"}}); code != 422 || out["code"] != "validation_failed" || !strings.Contains(fmt.Sprint(out["detail"]), "BIN") {
		t.Fatalf("a NUL value as env: %d %v; want 422 naming BIN", code, out)
	}
	if a := put("high", mustJSON(map[string]any{"value_base64": base64.StdEncoding.EncodeToString(want[1:])})); a.status != 201 {
		t.Fatalf("high bytes: %d %s", a.status, a.body)
	}
	if code, out := apply(map[string]any{"secrets": map[string]any{"HIGH": "high"}}); code != 422 || out["code"] != "validation_failed" || !strings.Contains(fmt.Sprint(out["detail"]), "HIGH") {
		t.Fatalf("a value that is not UTF-8 as env: %d %v; want 422 naming HIGH", code, out)
	}
	if code, out := f.json("PUT", "/api/v1/projects/shop/secret-sets/binset", map[string]any{"secrets": map[string]any{"BIN": "bin"}}); code != 422 || !strings.Contains(fmt.Sprint(out["detail"]), "BIN") {
		t.Fatalf("a set giving a NUL value as env: %d %v; want 422 naming BIN", code, out)
	}
	if code, out := apply(map[string]any{"secrets": map[string]any{"BIN": map[string]any{"secret": "bin", "as": "file"}, "TEXT": "text"}}); code != 201 {
		t.Fatalf("a NUL value as a file: %d %v", code, out)
	}
	// A new version with a NUL byte of a secret a service takes as env unpinned is refused, and
	// the service keeps its version.
	if a := put("text", mustJSON(map[string]any{"value_base64": base64.StdEncoding.EncodeToString([]byte("a\x00b"))})); a.status != 422 || !strings.Contains(string(a.body), "TEXT") || !strings.Contains(string(a.body), "api") {
		t.Fatalf("a NUL version of an env secret: %d %s; want 422 naming api and TEXT", a.status, a.body)
	}
	if got := string(opened("text")); got != "grüße \uFFFD \uFFFD" {
		t.Fatalf("the refused version was stored: %q", got)
	}
	if a := put("bin", mustJSON(map[string]any{"value_base64": base64.StdEncoding.EncodeToString([]byte("\x00again"))})); a.status != 200 {
		t.Fatalf("a NUL version of a file secret: %d %s", a.status, a.body)
	}
}
