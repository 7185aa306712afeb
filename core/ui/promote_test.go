package ui_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// TestPromoteThroughTheAPI links a pushed tag from the registry page to its promote page, which
// shows the image the service runs and the digest it would run; the promotion moves the
// service's image through the API and lands on the service's page. Once an admission policy
// denies every service write, the next promotion shows the API's policy_denied with the
// policy's reason and changes nothing; a form at a stale revision is the API's
// revision_conflict.
func TestPromoteThroughTheAPI(t *testing.T) {
	f := newFixtureAPI(t, false, nil, func(st *store.Store, bs *bundles.Store, cfg *api.Config) {
		rt, err := hostwasm.New(context.Background(), hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rt.Close(context.Background()) })
		eng := policy.New(policy.Config{Store: st, Blobs: bs, Runtime: rt, Changelog: cfg.Changelog})
		if err := eng.EnsureIndexes(context.Background()); err != nil {
			t.Fatal(err)
		}
		cfg.Policy = eng
	})
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	d0, d1, d2 := "sha256:"+strings.Repeat("0a", 32), "sha256:"+strings.Repeat("1b", 32), "sha256:"+strings.Repeat("2c", 32)
	app := &services.Service{Name: "app", Replicas: 1, Port: 8080}
	app.Runtime, app.Image = "containerd", "127.0.0.1:1/default/app@"+d0
	if _, _, err := f.cat.PutService(ctx, p, app, nil); err != nil {
		t.Fatal(err)
	}
	for tag, d := range map[string]string{"v1": d1, "v2": d2} {
		if err := f.rels.Record(ctx, registry.Push{Repository: "default/app", Reference: tag, Digest: d, Actor: "tok_ci", ActorKind: "machine"}); err != nil {
			t.Fatal(err)
		}
	}
	page := "/ui/services/default/app/promote/v1"
	anon := f.browser(t)
	if resp, _ := get(t, anon, f.srv.URL, page); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
		t.Fatalf("the promote page without a session answered %d, want 303 to /ui/login", resp.StatusCode)
	}
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/registry"); !strings.Contains(body, `href="`+page+`"`) {
		t.Fatalf("the registry page does not link the promotion of v1:\n%s", body)
	}
	resp, body := get(t, hc, f.srv.URL, page)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, app.Image) || !strings.Contains(body, d1) || !strings.Contains(body, `name="expected_revision" value="1"`) {
		t.Fatalf("the promote page answered %d without the image, the tag's digest and revision 1:\n%s", resp.StatusCode, body)
	}
	csrf := csrfRE.FindStringSubmatch(body)[1]
	form := url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]}, "expected_revision": {"1"}}
	if resp, body := post(t, hc, f.srv.URL, page, form); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/services/default/app" {
		t.Fatalf("the promotion answered %d (Location %q):\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	c := f.api(t, f.admin)
	svc, err := c.GetService(ctx, "default", "app")
	if err != nil || svc.Image != "127.0.0.1:1/default/app@"+d1 || svc.Revision != 2 {
		t.Fatalf("after the promotion the service runs %q at revision %d (%v), want v1's digest at 2", svc.Image, svc.Revision, err)
	}
	// A form rendered at revision 1 is stale now.
	page2 := "/ui/services/default/app/promote/v2"
	resp, body = post(t, hc, f.srv.URL, page2, url.Values{"csrf": {csrf}, "idempotency_key": {"ui-stale-form"}, "expected_revision": {"1"}})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "<code>revision_conflict</code>") || !strings.Contains(body, `name="expected_revision" value="2"`) {
		t.Fatalf("a stale promotion answered %d without revision_conflict and a fresh form:\n%s", resp.StatusCode, body)
	}
	mod, err := c.PushModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "no-promotions",
		Answer: `{"decision":"deny","reasons":["promotions are frozen this week"]}`})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(ctx, client.BindingRequest{Hook: "service.apply", Module: mod.Digest, Project: "default"}); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, hc, f.srv.URL, page2)
	resp, body = post(t, hc, f.srv.URL, page2, url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]}, "expected_revision": {"2"}})
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "<code>policy_denied</code>") || !strings.Contains(body, "promotions are frozen this week") {
		t.Fatalf("a denied promotion answered %d without policy_denied and its reason:\n%s", resp.StatusCode, body)
	}
	if svc, err := c.GetService(ctx, "default", "app"); err != nil || svc.Revision != 2 {
		t.Fatalf("a denied promotion changed the service: revision %d (%v)", svc.Revision, err)
	}
	for _, secret := range []string{envSecret, secretValue, f.admin} {
		if strings.Contains(body, secret) {
			t.Fatalf("the promote page renders a secret value (%.8s...)", secret)
		}
	}
}
