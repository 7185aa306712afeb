package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// readOnlyPage is one read-only page of the dashboard: what it must show after the fixture's
// seed and the page's own setup.
type readOnlyPage struct {
	path string
	// want are strings the page must contain.
	want []string
	// nav is the navigation link the page marks as current.
	nav string
}

// checkReadOnlyPage opens p without a session (sent to the login page), then with the admin's
// session: 200, every wanted string, the navigation link marked current, and no secret value.
func checkReadOnlyPage(t *testing.T, f *fixture, p readOnlyPage) {
	t.Helper()
	anon := f.browser(t)
	if resp, body := get(t, anon, f.srv.URL, p.path); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
		t.Fatalf("%s without a session answered %d (Location %q), want 303 to /ui/login:\n%s", p.path, resp.StatusCode, resp.Header.Get("Location"), body)
	}
	hc := f.browser(t)
	if resp, body := login(t, hc, f.srv.URL, url.Values{"token": {f.admin}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login answered %d:\n%s", resp.StatusCode, body)
	}
	resp, body := get(t, hc, f.srv.URL, p.path)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s answered %d:\n%s", p.path, resp.StatusCode, body)
	}
	for _, w := range p.want {
		if !strings.Contains(body, w) {
			t.Errorf("%s does not show %q:\n%s", p.path, w, body)
		}
	}
	if !strings.Contains(body, `href="`+p.nav+`" aria-current="page"`) {
		t.Errorf("%s does not mark its navigation link %s as current", p.path, p.nav)
	}
	for _, secret := range []string{envSecret, secretValue, userPassword, f.admin} {
		if strings.Contains(body, secret) {
			t.Errorf("%s renders a secret value (%.8s...)", p.path, secret)
		}
	}
}

// TestOperationsPage enqueues two operations through the API, fails one, and sees the queue
// with kind, state, attempts and last error; the state filter keeps only the failed one, and a
// filter that names no state is refused.
func TestOperationsPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	c := f.api(t, f.admin)
	queued, _, err := c.EnqueueOperation(ctx, "default", "ui-test-queued", client.OperationRequest{Kind: "ui-probe-queued", Payload: json.RawMessage(`{"password":"` + secretValue + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/operations", nav: "/ui/operations",
		want: []string{queued.ID, "ui-probe-queued", ">queued<", "0 of " + strconv.Itoa(queued.MaxAttempts), `href="/ui/operations?state=queued"`, "queued (1)"}})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	resp, body := get(t, hc, f.srv.URL, "/ui/operations?state=failed")
	if resp.StatusCode != http.StatusOK || strings.Contains(body, queued.ID) || !strings.Contains(body, "No operation in state failed") {
		t.Fatalf("the failed filter (%d) lists the queued operation or misses its empty note:\n%s", resp.StatusCode, body)
	}
	if resp, body := get(t, hc, f.srv.URL, "/ui/operations?state=queued"); resp.StatusCode != http.StatusOK || !strings.Contains(body, queued.ID) {
		t.Fatalf("the queued filter (%d) does not list %s:\n%s", resp.StatusCode, queued.ID, body)
	}
	if resp, _ := get(t, hc, f.srv.URL, "/ui/operations?state=bogus"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a filter naming no state answered %d, want 400", resp.StatusCode)
	}
}

// TestChangelogPage sees the change log's newest entries, newest first: the secret and the
// user the fixture wrote through the API, with their actor, and never a payload.
func TestChangelogPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	entries, head, err := f.api(t, f.admin).Changelog(ctx, 1, 500)
	if err != nil {
		t.Fatal(err)
	}
	if head < 1 || len(entries) == 0 {
		t.Fatalf("the fixture's writes left no change-log entry (head %d)", head)
	}
	last := entries[len(entries)-1]
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/changelog", nav: "/ui/changelog",
		want: []string{"<td>" + strconv.FormatInt(last.Seq, 10) + "</td>", last.EntityType + " " + last.Op, last.ActorType + " " + last.ActorID}})

	// The filter: the entries of one kind alone (the API filters), one operation, an actor;
	// a kind nothing has says so.
	kinds := map[string]int{}
	for _, e := range entries {
		kinds[e.EntityType]++
	}
	if len(kinds) < 2 {
		t.Fatalf("the fixture's change log holds one kind of entry (%v): a filter would not be seen working", kinds)
	}
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	rowRE := regexp.MustCompile(`<tr><td>\d+</td><td>([a-z_]+) ([a-z]+)</td><td class="reason wrap">[^<]*</td><td>[a-z]+ ([^<]*)</td>`)
	for kind, n := range kinds {
		resp, body := get(t, hc, f.srv.URL, "/ui/changelog?kind="+url.QueryEscape(kind))
		rows := rowRE.FindAllStringSubmatch(body, -1)
		if resp.StatusCode != http.StatusOK || len(rows) != n {
			t.Fatalf("kind %s: %d with %d rows, want 200 with %d:\n%s", kind, resp.StatusCode, len(rows), n, body)
		}
		for _, r := range rows {
			if r[1] != kind {
				t.Errorf("kind %s: a %s row passed", kind, r[1])
			}
		}
		if !strings.Contains(body, `id="kind" name="kind" list="kinds" value="`+kind+`"`) {
			t.Errorf("kind %s: the filter form does not keep the kind", kind)
		}
	}
	_, body := get(t, hc, f.srv.URL, "/ui/changelog?op=create&actor="+url.QueryEscape(last.ActorID))
	for _, r := range rowRE.FindAllStringSubmatch(body, -1) {
		if r[2] != "create" || r[3] != last.ActorID {
			t.Errorf("op create by %s: a %s by %s row passed", last.ActorID, r[2], r[3])
		}
	}
	if _, body := get(t, hc, f.srv.URL, "/ui/changelog?kind=no_such_kind"); !strings.Contains(body, `id="changelog-empty"`) || rowRE.MatchString(body) {
		t.Errorf("a kind nothing has does not say so:\n%s", body)
	}
}

// TestDomainsPage lists the domains of two services: one whose certificate Berth gets from
// ACME (pending until issued, read from the service's GET) and one without TLS. Under each
// domain are its DNS records, read through GET /api/v1/dns-records: the shop's A record, set
// through core/dnsrecords and waiting for its write, and its ACME challenge's TXT record, whose
// write the server refused (state and last error shown); the plain domain has none.
func TestDomainsPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	for name, tls := range map[string]string{"shop": "acme", "plain": ""} {
		svc := &services.Service{Name: name, Bundle: "web", BundleDigest: "sha256:" + strings.Repeat("cd", 32), Command: []string{"./web"},
			Replicas: 1, Port: 8080, Domains: []string{name + ".example.test"}, TLS: services.TLS{Mode: tls}}
		if _, _, err := f.cat.PutService(ctx, p, svc, nil); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := dnsrecords.New(dnsrecords.Config{Store: f.st, Queue: operations.NewQueue(f.st, operations.Config{}), Writer: unreachedDNS{}, Zones: []string{"example.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recs.Set(ctx, "shop.example.test", "A", dnsrecords.ServiceHolder("svc_shop"), []string{"192.0.2.7", "192.0.2.8"}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	if err := f.st.Insert(ctx, dnsrecords.Collection, dnsrecords.Record{ID: "example.test/_acme-challenge.shop/TXT", FQDN: "_acme-challenge.shop.example.test.",
		Type: "TXT", TTL: 60, Generation: 1, Failed: 1, LastError: "the server refused the update: NOTAUTH", LastCode: "dns_auth_refused", UpdatedAt: at,
		Holdings: []dnsrecords.Holding{{Holder: dnsrecords.HolderACME + "ab12", Values: []string{"challenge-value-1"}, Since: at}}}); err != nil {
		t.Fatal(err)
	}
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/domains", nav: "/ui/domains",
		want: []string{"<td>shop.example.test</td>", `href="/ui/services/default/shop"`, "<td>acme</td>", `class="state warn">pending<`,
			"<td>plain.example.test</td>", "<td>none</td>",
			`aria-label="DNS records of shop.example.test"`,
			"<tr><td>shop.example.test.</td><td>A</td><td class=\"wrap\">192.0.2.7, 192.0.2.8</td>\n<td><span class=\"state warn\">pending</span></td>",
			"<tr><td>_acme-challenge.shop.example.test.</td><td>TXT</td><td class=\"wrap\">challenge-value-1</td>\n<td><span class=\"state bad\">failed</span></td>",
			"the server refused the update: NOTAUTH (<code>dns_auth_refused</code>)"}})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/domains"); strings.Contains(body, `aria-label="DNS records of plain.example.test"`) {
		t.Errorf("plain.example.test has no DNS record, yet the page lists records under it:\n%s", body)
	}
}

// unreachedDNS stands for the DNS plugin (tested against a real knot in core/dnsrecords): the
// domains page test runs no write worker, so nothing ever calls it.
type unreachedDNS struct{}

var _ dnsrecords.Writer = unreachedDNS{}

var errUnreachedDNS = errors.New("the domains page test runs no DNS write")

func (unreachedDNS) Plan(context.Context, *abiprovider.PlanRequest) (*abiprovider.PlanResponse, error) {
	return nil, errUnreachedDNS
}

func (unreachedDNS) Apply(context.Context, *abiprovider.ApplyRequest) (*abiprovider.ApplyResponse, error) {
	return nil, errUnreachedDNS
}

func (unreachedDNS) Delete(context.Context, *abiprovider.DeleteRequest) (*abiprovider.DeleteResponse, error) {
	return nil, errUnreachedDNS
}

// TestRegistryPage records two pushes of one tag and one of another to the web service's
// repository and sees the repository with both tags, the digest each names and the digest
// the first named before.
func TestRegistryPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	d1, d2, d3 := "sha256:"+strings.Repeat("1a", 32), "sha256:"+strings.Repeat("2b", 32), "sha256:"+strings.Repeat("3c", 32)
	for _, p := range []registry.Push{
		{Repository: "default/web", Reference: "v1", Digest: d1, Actor: "tok_ci", ActorKind: "machine"},
		{Repository: "default/web", Reference: "v1", Digest: d2, Actor: "tok_ci", ActorKind: "machine"},
		{Repository: "default/web", Reference: "v2", Digest: d3, Actor: "tok_ci", ActorKind: "machine"},
	} {
		if err := f.rels.Record(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	short := func(d string) string { return d[:7+12] }
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/registry", nav: "/ui/registry",
		want: []string{"default/web", "<td>v1</td>", "<td>v2</td>", `title="` + d2 + `">` + short(d2), `title="` + d3 + `">` + short(d3), short(d1) + "</span> ("}})
}

// TestSecretsPage sees the fixture's secret by name, version and keyed digest, with the
// service that uses it, and never its value.
func TestSecretsPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	svc := &services.Service{Name: "api", Bundle: "web", BundleDigest: "sha256:" + strings.Repeat("ef", 32), Command: []string{"./web"},
		Replicas: 1, Port: 8080, Secrets: map[string]secrets.Ref{"DB_PASSWORD": {Secret: "db-password"}}}
	if _, _, err := f.cat.PutService(ctx, p, svc, nil); err != nil {
		t.Fatal(err)
	}
	sec, err := f.api(t, f.admin).GetSecret(ctx, "default", "db-password")
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.UsedBy) == 0 {
		t.Fatalf("the API does not say the api service uses db-password: %+v", sec)
	}
	digest := sec.Versions[len(sec.Versions)-1].Digest
	i := strings.Index(digest, "sha256:")
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/secrets", nav: "/ui/secrets",
		want: []string{"<td>default/db-password</td>", "<td>1 <span", digest[:i+7+12], `href="/ui/services/default/api">api</a>`, "as DB_PASSWORD"}})
}

// TestAccessPage sees, as an admin, a token by name, scopes and expiry (never its bearer)
// and the users with their roles.
func TestAccessPage(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	issued, err := f.api(t, f.admin).CreateToken(ctx, client.NewMachineToken{Name: "ci-deployer", Scopes: []string{"services:read"}, ExpiresIn: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/access", nav: "/ui/access",
		want: []string{"ci-deployer", "<td>services:read</td>", "<td>ops <span", "<td>admin</td>", `class="state ok">active<`}})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/access"); strings.Contains(body, issued.Token) {
		t.Fatal("the access page renders a token's bearer")
	}
	// The navigation shows the access page to admins only: the admin token and the admin
	// user see it; a read-only token does not (and reading the page directly shows the
	// API's refusal of the users list).
	ops := f.browser(t)
	login(t, ops, f.srv.URL, url.Values{"name": {"ops"}, "password": {userPassword}})
	reader := f.browser(t)
	login(t, reader, f.srv.URL, url.Values{"token": {issued.Token}})
	for _, c := range []struct {
		who   string
		hc    *http.Client
		shown bool
	}{{"the admin token", hc, true}, {"the admin user", ops, true}, {"a read-only token", reader, false}} {
		resp, body := get(t, c.hc, f.srv.URL, "/ui/services")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: the services page answered %d", c.who, resp.StatusCode)
		}
		if got := strings.Contains(body, `<a href="/ui/access"`); got != c.shown {
			t.Errorf("%s: the navigation links the access page: %v, want %v", c.who, got, c.shown)
		}
	}
	if resp, body := get(t, reader, f.srv.URL, "/ui/access"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "forbidden") {
		t.Errorf("a read-only token's access page answered %d without the API's refusal:\n%s", resp.StatusCode, body)
	}
}

// TestPluginsPage sees a quarantined provider plugin as the API lists it (the plugin lister
// berthd gives the API, here a fixed one), a WebAssembly policy module pushed through the
// API, and its binding (never its config); no decision is recorded yet, and the page says so.
func TestPluginsPage(t *testing.T) {
	const configValue = "binding-config-that-must-not-render-5d1e"
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
		cfg.Plugins = func() []plugin.Status {
			return []plugin.Status{{Name: "dns-provider", Kind: "provider", Version: "1.4.2", APIVersion: 1, State: plugin.StateQuarantined,
				Launches: 3, Crashes: 3, LastError: "exit status 2"}}
		}
	})
	ctx := context.Background()
	c := f.api(t, f.admin)
	mod, err := c.PushModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "ui-probe-policy"})))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Bind(ctx, client.BindingRequest{Hook: "service.apply", Module: mod.Digest, Config: json.RawMessage(`{"token":"` + configValue + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/plugins", nav: "/ui/plugins",
		want: []string{"<td>dns-provider</td>", `class="state bad">quarantined<`, "3 <span class=\"muted\">of 3 launches", "exit status 2",
			"ui-probe-policy", mod.Digest[:7+12], "<td>" + b.ID + "</td>", "<td>service.apply</td>", "No decision recorded."}})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	if _, body := get(t, hc, f.srv.URL, "/ui/plugins"); strings.Contains(body, configValue) {
		t.Fatal("the plugins page renders a binding's config")
	}
}

// TestJobsPage sees a job with its schedule and policy and a platform task with its last pass,
// as berth job ls and berth job ls --platform show them.
func TestJobsPage(t *testing.T) {
	f := newFixtureAPI(t, false, nil, func(st *store.Store, _ *bundles.Store, c *api.Config) {
		jc, err := jobs.NewController(jobs.ControllerConfig{Store: st, Catalog: c.Catalog, Nodes: c.Nodes})
		if err != nil {
			t.Fatal(err)
		}
		c.Jobs = jc
		c.Platform = jobs.NewPlatform(st, nil)
		if err := c.Platform.Record(context.Background(), "registry.gc", time.Hour, time.Now().Add(-time.Minute), errors.New("blob store unreachable")); err != nil {
			t.Fatal(err)
		}
	})
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	job := &services.Service{Name: "report", Kind: services.KindJob, Bundle: "report", BundleDigest: "sha256:" + strings.Repeat("ab", 32),
		Command: []string{"./report"}, Job: &services.JobSettings{Schedule: "*/5 * * * *", TimeZone: "Europe/Berlin", Concurrency: services.ConcurrencyForbid, StartingDeadlineS: 300, KeepHistory: 20}}
	if _, _, err := f.cat.PutService(ctx, p, job, nil); err != nil {
		t.Fatal(err)
	}
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/jobs", nav: "/ui/jobs",
		want: []string{`href="/ui/services/default/report">default/report</a>`, "*/5 * * * *", "Europe/Berlin", "<td>forbid</td>", "no run yet",
			"<td>registry.gc</td>", `class="state bad">failed<`, "1 / 1", "blob store unreachable"}})
	// A job is not a service: the services page and the overview list the service only.
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	for _, path := range []string{"/ui/services", "/ui/"} {
		_, body := get(t, hc, f.srv.URL, path)
		if !strings.Contains(body, "default/web") || strings.Contains(body, "default/report") {
			t.Errorf("%s does not list the service web alone (the job report must not be among services):\n%s", path, body)
		}
	}
}

// TestOverviewListsRecentJobRuns records three runs of a job (one failed with exit 3 an hour
// ago, one succeeded, one three days old) and sees the overview list the two recent ones under
// the jobs of the last 24 h, newest first, with the failed one among the failing things too.
func TestOverviewListsRecentJobRuns(t *testing.T) {
	var st *store.Store
	f := newFixtureAPI(t, false, nil, func(s *store.Store, _ *bundles.Store, c *api.Config) {
		jc, err := jobs.NewController(jobs.ControllerConfig{Store: s, Catalog: c.Catalog, Nodes: c.Nodes})
		if err != nil {
			t.Fatal(err)
		}
		c.Jobs = jc
		st = s
	})
	hc := f.browser(t)
	login(t, hc, f.srv.URL, url.Values{"token": {f.admin}})
	// Without a job the overview has no jobs section.
	if _, body := get(t, hc, f.srv.URL, "/ui/"); strings.Contains(body, "Jobs of the last 24 h") {
		t.Fatalf("the overview shows a jobs section without any job:\n%s", body)
	}
	ctx := context.Background()
	p, err := f.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	job := &services.Service{Name: "report", Kind: services.KindJob, Bundle: "report", BundleDigest: "sha256:" + strings.Repeat("ab", 32),
		Command: []string{"./report"}, Job: &services.JobSettings{Schedule: "0 3 * * *", Concurrency: services.ConcurrencyForbid, KeepHistory: 20}}
	if _, _, err := f.cat.PutService(ctx, p, job, nil); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	three, zero := 3, 0
	key := jobs.JobKey("default", "report")
	for _, r := range []jobs.Run{
		{Job: key, FireTime: now.Add(-72 * time.Hour), State: jobs.RunSucceeded, ExitCode: &zero, EndedAt: now.Add(-72 * time.Hour).Add(time.Minute)},
		{Job: key, FireTime: now.Add(-2 * time.Hour), State: jobs.RunFailed, ExitCode: &three, EndedAt: now.Add(-time.Hour), Message: "exited with status 3"},
		{Job: key, FireTime: now.Add(-30 * time.Minute), State: jobs.RunSucceeded, ExitCode: &zero, EndedAt: now.Add(-29 * time.Minute)},
	} {
		r.ID = jobs.RunID(key, r.FireTime)
		if err := st.Insert(ctx, jobs.RunsCollection, r); err != nil {
			t.Fatal(err)
		}
	}
	old, failedRun, okRun := "report@"+now.Add(-72*time.Hour).Format(time.RFC3339), "report@"+now.Add(-2*time.Hour).Format(time.RFC3339), "report@"+now.Add(-30*time.Minute).Format(time.RFC3339)
	checkReadOnlyPage(t, f, readOnlyPage{path: "/ui/", nav: "/ui/",
		want: []string{"Jobs of the last 24 h", "Failed job runs", "<td>" + failedRun + "</td>", "<td>" + okRun + "</td>", "exited with status 3", `class="state bad">failed<`}})
	_, body := get(t, hc, f.srv.URL, "/ui/")
	if strings.Contains(body, old) {
		t.Errorf("the overview lists a run of three days ago")
	}
	failing, rest, ok := strings.Cut(body, `id="h-rollouts"`)
	if !ok || !strings.Contains(failing, `id="failed-runs"`) || !strings.Contains(failing, failedRun) {
		t.Errorf("the failed run is not among the failing things")
	}
	if i, j := strings.Index(rest, okRun), strings.Index(rest, failedRun); i < 0 || j < 0 || i > j {
		t.Errorf("the jobs section does not list the newer run first (%d, %d)", i, j)
	}
}
