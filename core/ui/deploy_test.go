package ui_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// TestDeployFormWritesThroughTheAPI deploys a service from the dashboard's form: a name the
// API refuses is shown with the API's own code and the form keeps what was typed; a valid
// form creates the service once however often it is submitted; a second form for the same
// name is the API's conflict (the form never replaces a service); a token without
// service:deploy is refused by the API, not by the dashboard.
func TestDeployFormWritesThroughTheAPI(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app"), []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, dir, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := f.api(t, f.admin).PushBundle(ctx, "default", "app", &buf); err != nil {
		t.Fatal(err)
	}
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	keyRE := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)
	form := func() url.Values {
		resp, page := get(t, hc, f.srv.URL, "/ui/deploy")
		if resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="deploy-form"`) {
			t.Fatalf("the deploy page answered %d:\n%s", resp.StatusCode, page)
		}
		return url.Values{"csrf": {csrfRE.FindStringSubmatch(page)[1]}, "idempotency_key": {keyRE.FindStringSubmatch(page)[1]},
			"project": {"default"}, "runtime": {"process"}, "bundle": {"app"}, "command": {"./app\r\n"}, "replicas": {"2"}}
	}

	bad := form()
	bad.Set("name", "Not_A_Label")
	resp, body := post(t, hc, f.srv.URL, "/ui/deploy", bad)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `id="deploy-error"`) ||
		!strings.Contains(body, "<code>invalid_name</code>") || !strings.Contains(body, `value="Not_A_Label"`) {
		t.Fatalf("a bad name answered %d without the API's refusal in the form:\n%s", resp.StatusCode, body)
	}

	good := form()
	good.Set("name", "fresh")
	for i := range 2 { // a double submit of one rendered form is one write
		resp, body := post(t, hc, f.srv.URL, "/ui/deploy", good)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/services/default/fresh" {
			t.Fatalf("deploy %d answered %d (to %q):\n%s", i, resp.StatusCode, resp.Header.Get("Location"), body)
		}
	}
	svc, err := f.api(t, f.admin).GetService(ctx, "default", "fresh")
	if err != nil {
		t.Fatal(err)
	}
	if svc.Revision != 1 || svc.Replicas != 2 || len(svc.Command) != 1 || svc.Command[0] != "./app" || svc.BundleDigest == "" {
		t.Fatalf("the deployed service is %+v, want revision 1, 2 replicas, command [./app], the bundle pinned", svc)
	}

	again := form()
	again.Set("name", "fresh")
	if resp, body := post(t, hc, f.srv.URL, "/ui/deploy", again); resp.StatusCode != http.StatusConflict ||
		!strings.Contains(body, "revision_conflict") || !strings.Contains(body, "exists already") {
		t.Fatalf("a second form for an existing service answered %d:\n%s", resp.StatusCode, body)
	}

	issued, err := f.api(t, f.admin).CreateToken(ctx, client.NewMachineToken{Name: "reader", Scopes: []string{"services:read"}, ExpiresIn: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reader := f.browser(t)
	login(t, reader, f.srv.URL, url.Values{"token": {issued.Token}})
	_, page := get(t, reader, f.srv.URL, "/ui/deploy")
	ro := url.Values{"csrf": {csrfRE.FindStringSubmatch(page)[1]}, "project": {"default"}, "name": {"sneaky"}, "bundle": {"app"}, "command": {"./app"}}
	if resp, body := post(t, reader, f.srv.URL, "/ui/deploy", ro); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "forbidden") {
		t.Fatalf("a read-only token's deploy answered %d:\n%s", resp.StatusCode, body)
	}
	if _, err := f.api(t, f.admin).GetService(ctx, "default", "sneaky"); !client.IsCode(err, "service_not_found") {
		t.Fatalf("a refused deploy wrote a service (%v)", err)
	}
}
