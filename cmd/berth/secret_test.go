package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// apiOnStore serves berthd's real API handlers (core/api) over loopback HTTP on a test store
// (storetest.Open) and returns the store, its catalog, the server's URL and an admin token; with,
// when not nil, adds to the API's configuration (dir is a directory of the test's own).
func apiOnStore(t *testing.T, with func(dir string, st *store.Store, cfg *api.Config)) (*store.Store, *services.Catalog, string, string) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	st := storetest.Open(t)
	tokens := identity.NewTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(dir, "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	cfg := api.Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Catalog: cat, Nodes: nodes.NewRegistry(st, nil), Bundles: bs, Tokens: tokens, Hinter: quietHinter{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test", ClusterPublicKey: pub, Changelog: changelog.New(st, 1, nil)}
	if with != nil {
		with(dir, st, &cfg)
	}
	srv := httptest.NewServer(api.New(cfg))
	t.Cleanup(srv.Close)
	return st, cat, srv.URL, admin
}

// secretAPI is [apiOnStore] with the secret store.
func secretAPI(t *testing.T) (*secrets.Store, *services.Catalog, string, string) {
	t.Helper()
	var sec *secrets.Store
	_, cat, url, admin := apiOnStore(t, func(dir string, st *store.Store, cfg *api.Config) {
		kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(dir, secrets.KeyringFile), true)
		if err != nil {
			t.Fatal(err)
		}
		sec = secrets.NewStore(st, kr, nil)
		cfg.Secrets = &api.SecretsConfig{Store: sec}
	})
	return sec, cat, url, admin
}

// TestSecretCommands writes values from stdin and from a file, never from argv, and shows that
// no command prints a value.
func TestSecretCommands(t *testing.T) {
	sec, cat, url, admin := secretAPI(t)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = url, admin
	ctx := context.Background()
	open := func(project, name string) string {
		t.Helper()
		p, err := cat.GetProject(ctx, project)
		if err != nil {
			t.Fatal(err)
		}
		s, err := sec.Get(ctx, p.ID, name)
		if err != nil {
			t.Fatal(err)
		}
		v, err := sec.Open(s, s.Current())
		if err != nil {
			t.Fatal(err)
		}
		return string(v)
	}
	var printed []string
	ok := func(stdin string, args ...string) string {
		t.Helper()
		out := c.ok(stdin, args...)
		printed = append(printed, out)
		return out
	}
	out := ok("from-stdin-1\n", "secret", "set", "shop/stripe-key")
	if out != "Secret shop/stripe-key is at version 1.\n" || open("shop", "stripe-key") != "from-stdin-1" {
		t.Fatalf("set from stdin: %q, stored %q", out, open("shop", "stripe-key"))
	}
	file := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(file, []byte("line1\nline2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok("", "secret", "set", "shop/stripe-key", "--from-file", file)
	if got := open("shop", "stripe-key"); got != "line1\nline2\n" {
		t.Fatalf("set from file stored %q, want the file's exact bytes", got)
	}
	if _, errOut, code := c.run("", "secret", "set", "shop/stripe-key", "argv-value"); code == 0 || !strings.Contains(errOut, "never read from arguments") {
		t.Fatalf("a value in argv: exit %d %q", code, errOut)
	}
	if _, errOut, code := c.run("", "secret", "set", "shop/empty"); code == 0 || !strings.Contains(errOut, "empty") {
		t.Fatalf("an empty value: exit %d %q", code, errOut)
	}
	ok("x", "--project", "shop", "secret", "set", "db")
	out = ok("", "--project", "shop", "secret", "ls")
	if !strings.Contains(out, "stripe-key") || !strings.Contains(out, "db") {
		t.Fatalf("ls: %q", out)
	}
	out = ok("", "secret", "get", "shop/stripe-key")
	if !strings.Contains(out, "hmac-sha256:") || !strings.Contains(out, "Current:  2") {
		t.Fatalf("get: %q", out)
	}
	ok("", "secret", "get", "shop/stripe-key", "-o", "json")
	out = ok("", "secrets", "keyring", "check")
	if !strings.Contains(out, "State:    ok") || !strings.Contains(out, "kek_") {
		t.Fatalf("keyring check: %q", out)
	}
	out = ok("", "secrets", "keyring", "rotate", "--retire-old")
	if !strings.Contains(out, "Rotation: running") {
		t.Fatalf("keyring rotate: %q", out)
	}
	ok("", "secret", "rm", "shop/db")
	if _, errOut, code := c.run("", "secret", "get", "shop/db"); code == 0 || !strings.Contains(errOut, "secret_not_found") {
		t.Fatalf("get after rm: exit %d %q", code, errOut)
	}
	for _, p := range printed {
		for _, v := range []string{"from-stdin-1", "line1"} {
			if strings.Contains(p, v) {
				t.Fatalf("a command printed the value %q:\n%s", v, p)
			}
		}
	}
}

// TestSecretSetFromFileIsBinarySafe: every byte value 0x00..0xff in a file reaches the store
// exactly through `berth secret set --from-file`, and so does a file of the largest size.
func TestSecretSetFromFileIsBinarySafe(t *testing.T) {
	sec, cat, url, admin := secretAPI(t)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = url, admin
	ctx := context.Background()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	large := bytes.Repeat(every, maxSecretBytes/len(every))
	for name, want := range map[string][]byte{"every-byte": every, "largest": large} {
		file := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(file, want, 0o600); err != nil {
			t.Fatal(err)
		}
		c.ok("", "secret", "set", "shop/"+name, "--from-file", file)
		p, err := cat.GetProject(ctx, "shop")
		if err != nil {
			t.Fatal(err)
		}
		s, err := sec.Get(ctx, p.ID, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sec.Open(s, s.Current())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: stored %d bytes differing from the %d of the file:\n got %x\nwant %x", name, len(got), len(want), got[:min(len(got), 512)], want[:min(len(want), 512)])
		}
	}
}

func TestParseServiceFileSecrets(t *testing.T) {
	docs, err := parseServiceFiles(strings.NewReader(`
name: shop
secrets:
  STRIPE_KEY: stripe-key
  DB_URL: {secret: db, version: 3}
  TLS_KEY: {secret: tls, as: file}
secret_sets: [payments]
`), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(docs[0].spec())
	want := `"secrets":{"DB_URL":{"secret":"db","version":3},"STRIPE_KEY":"stripe-key","TLS_KEY":{"secret":"tls","as":"file"}},"secret_sets":["payments"]`
	if !strings.Contains(string(got), want) {
		t.Fatalf("spec %s\nwant it to hold %s", got, want)
	}
	for in, wantErr := range map[string]string{
		"name: a\nsecrets: {X: {secret: db, value: v}}\n":       `unknown field "value"`,
		"name: a\nsecrets: {X: [db]}\n":                         "a secret reference is a name",
		`{"name":"a","secrets":{"X":{"secret":"db","vers":1}}}`: `unknown field "vers"`,
	} {
		if _, err := parseServiceFiles(strings.NewReader(in), "-"); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: error %v, want %q", in, err, wantErr)
		}
	}
}
