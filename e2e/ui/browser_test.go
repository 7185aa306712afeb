// Package ui tests the dashboard in a real browser: Debian's chromium, driven over the
// DevTools protocol by chromedp, against a real berthd with one agent running real workloads.
package ui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// chromiumPath is where Debian's chromium package installs the browser; make test installs
// it (scripts/install-chromium.sh) when it is missing.
const chromiumPath = "/usr/bin/chromium"

// env holds what TestMain built.
var env struct {
	bin      string // berthd, berth-agent and the plugins they start
	helloDir string // the hello example app as a bundle directory
}

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "berth-ui-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	env.bin = os.Getenv("BERTH_BIN_DIR")
	if env.bin == "" {
		env.bin = filepath.Join(tmp, "bin")
		if err := goBuild(env.bin+"/", "./cmd/berthd", "./cmd/berth-agent", "./cmd/berth-plugin-process"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	env.helloDir = filepath.Join(tmp, "hello")
	if err := goBuild(filepath.Join(env.helloDir, "hello"), "./examples/apps/hello"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func goBuild(out string, pkgs ...string) error {
	root, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	cmd := exec.Command("go", append([]string{"build", "-o", out}, pkgs...)...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(root)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, b)
	}
	return nil
}

// converge bounds every wait on the cluster (a crash loop needs a few failed starts).
const converge = 120 * time.Second

// cluster is one berthd and one agent.
type cluster struct {
	dir, url string
	c        *client.Client
	agent    *proctest.Proc
	// fp is berthd's certificate fingerprint, which every API client of the test pins.
	fp string
}

// client is an API client of the cluster with token.
func (cl *cluster) client(t *testing.T, token string) *client.Client {
	t.Helper()
	c, err := client.New(cl.url, client.WithToken(token), client.WithFingerprint(cl.fp))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	dir := t.TempDir()
	// Registered first, so it runs last: the workloads, their log writers and the runtime
	// driver outlive the agent by design, and a test leaves no process behind.
	t.Cleanup(func() { proctest.KillUnder(t, dir) })
	api := proctest.FreeAddr(t)
	data := filepath.Join(dir, "berthd")
	berthd := proctest.Start(t, filepath.Join(dir, "berthd.log"), filepath.Join(env.bin, "berthd"),
		"--data-dir", data, "--listen", api, "--gateway-listen", "off", "--sweep-floor", "1s")
	cl := &cluster{dir: dir, url: "https://" + api}
	t.Cleanup(func() { proctest.LogTailsOnFailure(t, dir, "berthd.log", "agent.log") })
	d := proctest.WaitBerthdReady(t, berthd, data, cl.url, 60*time.Second)
	cl.fp = d.Fingerprint
	cl.c = cl.client(t, d.Token)
	var err error
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(dir, "agent")
	enroll := proctest.Start(t, filepath.Join(dir, "agent.log"), filepath.Join(env.bin, "berth-agent"), "enroll",
		"--server", cl.url, "--join-token", jt.Token, "--fingerprint", d.Fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	if code := enroll.Cmd().ProcessState.ExitCode(); code != 0 {
		t.Fatalf("berth-agent enroll exited %d", code)
	}
	cl.agent = proctest.Start(t, filepath.Join(dir, "agent.log"), filepath.Join(env.bin, "berth-agent"), "run", "--data-dir", agentDir)
	proctest.WaitFor(t, converge, "node connected", func() (bool, string) {
		ns, err := cl.c.ListNodes(ctx)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprint(ns, err)
		}
		return ns[0].Status == "connected", ns[0].Status
	})
	return cl
}

// deploy pushes dir as bundle name and applies service name running command.
func (cl *cluster) deploy(t *testing.T, dir, name string, command []string, health string) {
	t.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, dir, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", name, &buf); err != nil {
		t.Fatal(err)
	}
	one := 1
	spec := client.ServiceSpec{Bundle: name, Command: command, Replicas: &one}
	if health != "" {
		spec.HealthCheck = client.HealthCheck{Path: health, IntervalS: 1}
	}
	if _, err := cl.c.ApplyService(ctx, "default", name, spec); err != nil {
		t.Fatal(err)
	}
}

// failingBundle is a bundle directory whose program exits 3 at once.
func failingBundle(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fail"), []byte("#!/bin/sh\necho 'cannot open config' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tickerBundle is a bundle directory whose program writes "tick N" every second, N counting
// from 1, beside the hello app (which answers its health check): a healthy workload whose
// output grows while its page is open.
func tickerBundle(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	hello, err := os.ReadFile(filepath.Join(env.helloDir, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello"), hello, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n./hello &\ni=0\nwhile :; do i=$((i+1)); echo \"tick $i\"; sleep 1; done\n"
	if err := os.WriteFile(filepath.Join(dir, "tick"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitVerdict waits until service name's verdict state is state with a reason containing reason.
func (cl *cluster) waitVerdict(t *testing.T, name, state, reason string) {
	t.Helper()
	proctest.WaitFor(t, converge, name+" "+state+"("+reason+")", func() (bool, string) {
		s, err := cl.c.GetService(context.Background(), "default", name)
		if err != nil || s.Verdict == nil {
			return false, fmt.Sprint(err)
		}
		return s.Verdict.State == state && strings.Contains(s.Verdict.Reason, reason), s.Verdict.String()
	})
}

// spki is the base64 SHA-256 of the public key berthd's certificate carries, the form of
// chromium's --ignore-certificate-errors-spki-list: the browser trusts exactly this key.
func spki(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the key is read to be pinned below
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sum := sha256.Sum256(conn.ConnectionState().PeerCertificates[0].RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// submit clicks the form button sel and waits for the page the form's answer leads to, which
// must be want and answer 200.
func submit[S chromedp.Selectable](ctx context.Context, sel S, want string) error {
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(sel))
	if err != nil {
		return err
	}
	if resp.Status != 200 || resp.URL != want {
		return fmt.Errorf("the form led to %s (%d), want %s (200)", resp.URL, resp.Status, want)
	}
	return nil
}

// browserLog records every request the page made and every document's answer headers.
type browserLog struct {
	mu        sync.Mutex
	requests  []string
	documents map[string]network.Headers
	// problems are the browser's errors: console and log entries of level error (a refused
	// script, a CSP violation) and uncaught exceptions.
	problems []string
}

func (l *browserLog) listen(ev any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		l.requests = append(l.requests, e.Request.URL)
	case *network.EventResponseReceived:
		if e.Type == network.ResourceTypeDocument {
			l.documents[e.Response.URL] = e.Response.Headers
		}
	case *cdplog.EventEntryAdded:
		if e.Entry.Level == cdplog.EntryLevelError {
			l.problems = append(l.problems, string(e.Entry.Source)+": "+e.Entry.Text+" "+e.Entry.URL)
		}
	case *runtime.EventExceptionThrown:
		msg := e.ExceptionDetails.Text
		if ex := e.ExceptionDetails.Exception; ex != nil {
			msg += " " + ex.Description
		}
		l.problems = append(l.problems, "exception: "+msg)
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			msg := "console.error:"
			for _, a := range e.Args {
				msg += " " + a.Description + " " + string(a.Value)
			}
			l.problems = append(l.problems, msg)
		}
	}
}

// TestDashboardInBrowser logs in with a password in chromium, sees a crash-looping service at
// the top of the overview with its reason, sees a second one appear there live (over the
// page's event stream, without a reload), visits every page with a screenshot of each, and
// checks every request stayed on berthd's origin, every document carried the CSP, and the
// session cookie is not readable from script.
func TestDashboardInBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("Debian's chromium is not installed at %s (make test installs it: scripts/install-chromium.sh): %v", chromiumPath, err)
	}
	cl := newCluster(t)
	ctx := context.Background()
	cl.deploy(t, env.helloDir, "hello", []string{"./hello"}, "/healthz")
	cl.deploy(t, failingBundle(t), "broken", []string{"./fail"}, "")
	cl.deploy(t, tickerBundle(t), "ticker", []string{"./tick"}, "/healthz")
	const password = "a dashboard test password, long enough"
	if _, err := cl.c.CreateUser(ctx, client.NewUser{Name: "ops", Roles: []string{"admin"}, Password: password}); err != nil {
		t.Fatal(err)
	}
	cl.waitVerdict(t, "broken", "waiting", "crash-loop")

	u, _ := url.Parse(cl.url)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("ignore-certificate-errors-spki-list", spki(t, u.Host)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	log := &browserLog{documents: map[string]network.Headers{}}
	// The first call starts the browser, which lives as long as bctx: no timeout on it.
	if err := chromedp.Listen(bctx, log.listen); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	tctx, cancelTimeout := context.WithTimeout(bctx, 4*time.Minute)
	defer cancelTimeout()

	// Each page is photographed and audited by axe-core: its serious and critical
	// accessibility violations are collected and reported at the end, page by page.
	shots := t.ArtifactDir()
	axeSource := readAxe(t)
	var violations []string
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
				return err
			}
			found, err := audit(ctx, tg, axeSource)
			if err != nil {
				return fmt.Errorf("axe-core on the %s page: %w", name, err)
			}
			for _, v := range found {
				violations = append(violations, name+": "+v)
			}
			return nil
		})
	}
	defer func() {
		if len(violations) > 0 {
			t.Errorf("axe-core found %d serious or critical accessibility violations:\n%s", len(violations), strings.Join(violations, "\n"))
		}
	}()

	// Log in with the password.
	if err := chromedp.Do(tctx,
		chromedp.Navigate(cl.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#password")),
		shot("login"),
		chromedp.SendKeys(chromedp.CSS("#name"), "ops"),
		chromedp.SendKeys(chromedp.CSS("#password"), password),
		chromedp.Click(chromedp.CSS("button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS("#failing-services")),
	); err != nil {
		t.Fatalf("log in and open the overview: %v", err)
	}

	// The first section is the failing one, and its first row is the broken service with
	// its reason; the session cookie is not readable from script.
	// Read in one script each: the live region may be swapped by its stream between a query
	// and a read of the node it found.
	firstSection, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector("main section").innerText`))
	if err != nil {
		t.Fatal(err)
	}
	firstRow, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector("#failing-services tbody tr").innerText`))
	if err != nil {
		t.Fatal(err)
	}
	cookies, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.TrimSpace(firstSection), "Failing") {
		t.Errorf("the overview's first section is not the failing one:\n%s", firstSection)
	}
	if !strings.Contains(firstRow, "default/broken") || !strings.Contains(firstRow, "crash-loop") || !strings.Contains(firstRow, "exit 3") {
		t.Errorf("the failing list's first row is not broken with its reason: %q", firstRow)
	}
	if strings.Contains(cookies, "berth_session") {
		t.Errorf("the session cookie is readable from script: %q", cookies)
	}

	// htmx does not evaluate code from attributes: an hx-on handler added to the page is
	// refused by the dashboard's own extension (its message) and never runs.
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[string](`(() => {
		const b = document.createElement("button");
		b.setAttribute("hx-on:click", "window.berthEvaluated = 'yes'");
		b.textContent = "hx-on probe";
		document.body.appendChild(b);
		htmx.process(b);
		b.click();
		b.remove();
		return "clicked";
	})()`)); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "the refusal of an hx-on handler", func() (bool, string) {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, p := range log.problems {
			if strings.Contains(p, "evaluating code from attributes is disabled") {
				return true, ""
			}
		}
		return false, strings.Join(log.problems, "; ")
	})
	if v, err := chromedp.Run(tctx, chromedp.Evaluate[string](`String(window.berthEvaluated)`)); err != nil || v != "undefined" {
		t.Fatalf("an hx-on handler ran (window.berthEvaluated = %q, %v)", v, err)
	}

	// A second service starts failing while the page is open: the page shows it without a
	// reload, from its event stream.
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.berthNoReload = "same page"`)); err != nil {
		t.Fatal(err)
	}
	cl.deploy(t, failingBundle(t), "broken-too", []string{"./fail"}, "")
	lctx, cancelLive := context.WithTimeout(tctx, converge)
	err = chromedp.Do(lctx, chromedp.WaitVisible(chromedp.Search(`//table[@id="failing-services"]//a[text()="default/broken-too"]`)))
	cancelLive()
	if err != nil {
		t.Fatalf("the overview did not show broken-too live: %v", err)
	}
	marker, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.berthNoReload`))
	if err != nil || marker != "same page" {
		t.Fatalf("the page reloaded to show broken-too (marker %q, %v)", marker, err)
	}
	if err := chromedp.Do(tctx, shot("overview")); err != nil {
		t.Fatal(err)
	}

	// Deploy a service from the dashboard: the services page links the form; a name the API
	// refuses comes back with the API's own code beside the form as typed; the corrected form
	// lands on the new service's page, whose rollout converges there without a reload.
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/services"), chromedp.WaitVisible(chromedp.CSS("#deploy-link")),
		chromedp.Click(chromedp.CSS("#deploy-link")), chromedp.WaitVisible(chromedp.CSS("#deploy-form"))); err != nil {
		t.Fatalf("open the deploy form: %v", err)
	}
	if err := chromedp.Do(tctx,
		chromedp.SendKeys(chromedp.CSS("#name"), "Not_A_Label"),
		chromedp.SendKeys(chromedp.CSS("#bundle"), "hello"),
		chromedp.SendKeys(chromedp.CSS("#command"), "./hello"),
		chromedp.SendKeys(chromedp.CSS("#health_path"), "/healthz"),
		shot("deploy"),
		chromedp.Click(chromedp.CSS("#deploy-submit")),
		chromedp.WaitVisible(chromedp.CSS("#deploy-error")),
		shot("deploy-refused"),
	); err != nil {
		t.Fatalf("submit a refused deploy: %v", err)
	}
	refusal, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#deploy-error")))
	if err != nil || !strings.Contains(refusal, "invalid_name") {
		t.Fatalf("the refused deploy does not show the API's code invalid_name (%v): %q", err, refusal)
	}
	if typed, err := chromedp.Run(tctx, chromedp.Value(chromedp.CSS("#bundle"))); err != nil || typed != "hello" {
		t.Fatalf("the refused form lost what was typed: bundle %q (%v)", typed, err)
	}
	if err := chromedp.Do(tctx, chromedp.SetValue(chromedp.CSS("#name"), "deployed")); err != nil {
		t.Fatal(err)
	}
	if err := submit(tctx, chromedp.CSS("#deploy-submit"), cl.url+"/ui/services/default/deployed"); err != nil {
		t.Fatalf("deploy: %v", err)
	}
	first, err := chromedp.Run(tctx, chromedp.Evaluate[string](`(document.getElementById("verdict") || {textContent: "none"}).textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if first == "converged" {
		t.Fatalf("the new service's page opened converged: nothing was left to see live")
	}
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.berthNoReload = "deploy page"`)); err != nil {
		t.Fatal(err)
	}
	dctx, cancelDeploy := context.WithTimeout(tctx, converge)
	err = chromedp.Do(dctx, chromedp.WaitVisible(chromedp.Search(`//span[@id="verdict"][text()="converged"]`)))
	cancelDeploy()
	if err != nil {
		t.Fatalf("the deployed service's page did not show its rollout converge (it opened %q): %v", first, err)
	}
	if marker, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.berthNoReload`)); err != nil || marker != "deploy page" {
		t.Fatalf("the page reloaded to show the rollout converge (marker %q, %v)", marker, err)
	}
	if err := chromedp.Do(tctx, shot("service-deployed")); err != nil {
		t.Fatal(err)
	}
	if svc, err := cl.c.GetService(ctx, "default", "deployed"); err != nil || svc.Revision != 1 || svc.Command[0] != "./hello" {
		t.Fatalf("the service deployed from the dashboard: %+v, %v", svc, err)
	}

	// Every other page renders, with a screenshot.
	for _, p := range []struct{ path, wait, name string }{
		{"/ui/services", "#services", "services"},
		{"/ui/services/default/broken", "#slots", "service"},
		{"/ui/services/default/hello", "#verdict", "service-hello"},
		{"/ui/nodes", "#nodes", "nodes"},
		{"/ui/workloads", "#workloads", "workloads"},
		{"/ui/domains", "#domains", "domains"},
		{"/ui/registry", "#registry", "registry"},
		{"/ui/secrets", "#secrets", "secrets"},
		{"/ui/access", "#access", "access"},
		{"/ui/plugins", "#plugins", "plugins"},
		{"/ui/jobs", "#jobs", "jobs"},
		{"/ui/operations", "#operations", "operations"},
		{"/ui/changelog", "#changelog", "changelog"},
		{"/ui/changelog?kind=service&op=create", "#changelog-table", "changelog-filtered"},
		{"/ui/backups", "#backups", "backups"},
		{"/ui/access/tokens/new", "#token-form", "token-form"},
		{"/ui/access/users/new", "#user-form", "user-form"},
		{"/ui/no-such-page", "main h1", "not-found"},
	} {
		if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+p.path), chromedp.WaitVisible(chromedp.CSS(p.wait)), shot(p.name)); err != nil {
			t.Fatalf("%s: %v", p.path, err)
		}
	}

	// Issue a token from the form: its secret is on the answer page, which the API's list
	// behind the access page never shows again.
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/access/tokens/new"), chromedp.WaitVisible(chromedp.CSS("#token-form")),
		chromedp.SendKeys(chromedp.CSS("#token-name"), "e2e-reader"),
		chromedp.Click(chromedp.CSS("#token-submit")), chromedp.WaitVisible(chromedp.CSS("#token-secret")), shot("token-issued")); err != nil {
		t.Fatalf("issue a token from the form: %v", err)
	}
	secret, err := chromedp.Run(tctx, chromedp.Value(chromedp.CSS("#token-secret")))
	if err != nil || !strings.HasPrefix(secret, "brt_") {
		t.Fatalf("the issued token's page shows %q (%v), want its brt_ secret", secret, err)
	}
	if _, err := cl.client(t, secret).ListServices(ctx, "default"); err != nil {
		t.Fatalf("the token issued from the dashboard does not work at the API: %v", err)
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/access"), chromedp.WaitVisible(chromedp.CSS("#tokens"))); err != nil {
		t.Fatal(err)
	}
	if html, err := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("html"))); err != nil || strings.Contains(html, secret) || !strings.Contains(html, "e2e-reader") {
		t.Fatalf("the access page after issuing a token lists it by name, never its secret (%v)", err)
	}
	// Revoke it: the access page links the question, whose button revokes it at the API.
	if err := chromedp.Do(tctx, chromedp.Click(chromedp.CSS(`a[href="/ui/access/tokens/e2e-reader/revoke"]`)), chromedp.WaitVisible(chromedp.CSS("button.primary")), shot("token-revoke")); err != nil {
		t.Fatalf("open the revocation of the issued token: %v", err)
	}
	if err := submit(tctx, chromedp.CSS("button.primary"), cl.url+"/ui/access"); err != nil {
		t.Fatalf("revoke the issued token: %v", err)
	}
	if _, err := cl.client(t, secret).ListServices(ctx, "default"); !client.IsCode(err, "unauthenticated") {
		t.Fatalf("the token revoked from the dashboard is still accepted, or refused otherwise: %v", err)
	}

	// Promote a release: the registry page links a tag's promotion, whose preview shows the
	// service's image and the tag's digest; a tag reserved and never pushed is the API's
	// refusal, shown beside the button.
	if _, err := cl.c.ReserveRelease(ctx, "default", "hello", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/services/default/hello/promote/v1"), chromedp.WaitVisible(chromedp.CSS("#promote-form")), shot("promote"),
		chromedp.Click(chromedp.CSS("#promote-submit")), chromedp.WaitVisible(chromedp.CSS("#promote-error")), shot("promote-refused")); err != nil {
		t.Fatalf("promote a release from the dashboard: %v", err)
	}
	if refusal, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#promote-error"))); err != nil || !strings.Contains(refusal, "release_not_pushed") && !strings.Contains(refusal, "service_not_container") {
		t.Fatalf("the refused promotion does not show the API's code (%v): %q", err, refusal)
	}

	// A workload's page shows its output, read from its node: hello's own start-up line.
	wls, err := cl.c.ListWorkloads(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	var helloWL, nodeID string
	for _, w := range wls {
		if w.Service == "hello" && w.ObservedStatus == "running" {
			helloWL, nodeID = w.ID, w.NodeID
		}
	}
	if helloWL == "" {
		t.Fatalf("no running hello workload in %+v", wls)
	}
	wctx, cancelWL := context.WithTimeout(tctx, converge)
	err = chromedp.Do(wctx, chromedp.Navigate(cl.url+"/ui/workloads/"+helloWL),
		chromedp.WaitVisible(chromedp.Search(`//pre[@id="logs"][contains(., "hello: listening")]`)), shot("workload"))
	cancelWL()
	if err != nil {
		t.Fatalf("the workload page did not show hello's output: %v", err)
	}

	// The ticker's page shows its output live: a line written after the page opened
	// appears in it without a reload (the page's log stream follows the node).
	var tickerWL string
	for _, w := range wls {
		if w.Service == "ticker" && w.ObservedStatus == "running" {
			tickerWL = w.ID
		}
	}
	if tickerWL == "" {
		t.Fatalf("no running ticker workload in %+v", wls)
	}
	const lastTick = `Math.max(0, ...Array.from(document.getElementById("logs").textContent.matchAll(/tick (\d+)/g), m => +m[1]))`
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/workloads/"+tickerWL), chromedp.WaitVisible(chromedp.CSS("#workload-status"))); err != nil {
		t.Fatal(err)
	}
	opened, err := chromedp.Run(tctx, chromedp.Evaluate[int](`(window.berthNoReload = "log page", `+lastTick+`)`))
	if err != nil {
		t.Fatal(err)
	}
	// The page read the newest line, tick N, before it was sent; tick N+2 was written at
	// least a second after that read.
	want := fmt.Sprintf("tick %d", opened+2)
	lctx2, cancelLog := context.WithTimeout(tctx, converge)
	err = chromedp.Do(lctx2, chromedp.WaitVisible(chromedp.Search(`//pre[@id="logs"][contains(., "`+want+`")]`)))
	cancelLog()
	if err != nil {
		t.Fatalf("the workload page (opened at tick %d) did not show %q live: %v", opened, want, err)
	}
	if marker, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.berthNoReload`)); err != nil || marker != "log page" {
		t.Fatalf("the page reloaded to show a new log line (marker %q, %v)", marker, err)
	}
	if err := chromedp.Do(tctx, shot("workload-live-log")); err != nil {
		t.Fatal(err)
	}

	// A node's page shows its capacity and draws its CPU and memory charts from its metrics
	// ring (uPlot draws into a canvas in each chart's box).
	nctx0, cancelN0 := context.WithTimeout(tctx, converge)
	err = chromedp.Do(nctx0, chromedp.Navigate(cl.url+"/ui/nodes/"+nodeID),
		chromedp.WaitVisible(chromedp.CSS("#node-status")),
		chromedp.WaitVisible(chromedp.CSS("#chart-cpu canvas")),
		chromedp.WaitVisible(chromedp.CSS("#chart-memory canvas")), shot("node"))
	cancelN0()
	if err != nil {
		t.Fatalf("the node page did not draw its charts: %v", err)
	}

	// A form posted without its CSRF token is refused, from the page's own origin too: the
	// logout and the deploy form (which then deploys nothing).
	status, err := chromedp.Run(tctx, chromedp.Evaluate[int](`fetch("/ui/logout", {method: "POST"}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != 403 {
		t.Errorf("a logout posted without its CSRF token answered %d (%v), want 403", status, err)
	}
	status, err = chromedp.Run(tctx, chromedp.Evaluate[int](`fetch("/ui/deploy", {method: "POST", body: new URLSearchParams({project: "default", name: "forged", bundle: "hello", command: "./hello"})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != 403 {
		t.Errorf("a deploy posted without its CSRF token answered %d (%v), want 403", status, err)
	}
	if _, err := cl.c.GetService(ctx, "default", "forged"); !client.IsCode(err, "service_not_found") {
		t.Errorf("a deploy refused for its CSRF token wrote a service (%v)", err)
	}

	// Undo: hello changes (revision 2), the undo page shows the change first, and the
	// undo through it returns hello to what revision 1 ran.
	one := 1
	if _, err := cl.c.ApplyService(ctx, "default", "hello", client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"}, Replicas: &one,
		HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}, Env: map[string]string{"GREETING": "second"}}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/services/default/hello/undo"), chromedp.WaitVisible(chromedp.CSS("#undo-changes")), shot("undo")); err != nil {
		t.Fatalf("the undo preview: %v", err)
	}
	diff, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS("#undo-changes")))
	if err != nil || !strings.Contains(diff, "env") || !strings.Contains(diff, "GREETING") || strings.Contains(diff, "second") {
		t.Fatalf("the undo preview does not name the env change by key alone (%v):\n%s", err, diff)
	}
	if err := submit(tctx, chromedp.CSS("button.primary"), cl.url+"/ui/services/default/hello"); err != nil {
		t.Fatalf("undo: %v", err)
	}
	hello, err := cl.c.GetService(ctx, "default", "hello")
	if err != nil || hello.Revision != 3 || hello.Env["GREETING"] != "" {
		t.Fatalf("after the undo hello is at revision %d with env %v (%v), want revision 3 without GREETING", hello.Revision, hello.Env, err)
	}

	// Restart the rollout from the service page: the API counts one restart.
	if err := submit(tctx, chromedp.Search(`//button[text()="Restart the rollout"]`), cl.url+"/ui/services/default/hello"); err != nil {
		t.Fatalf("restart: %v", err)
	}
	proctest.WaitFor(t, 10*time.Second, "restart generation 1", func() (bool, string) {
		s, err := cl.c.GetService(ctx, "default", "hello")
		if err != nil {
			return false, err.Error()
		}
		return s.RestartGeneration == 1, fmt.Sprint(s.RestartGeneration)
	})

	// The agent stops while the overview is open: its node shows up as needing attention,
	// live.
	if err := chromedp.Do(tctx, chromedp.Navigate(cl.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#failing-services"))); err != nil {
		t.Fatal(err)
	}
	cl.agent.Stop()
	nctx, cancelNode := context.WithTimeout(tctx, converge)
	err = chromedp.Do(nctx, chromedp.WaitVisible(chromedp.Search(`//table[@id="bad-nodes"]//span[text()="disconnected"]`)))
	cancelNode()
	if err != nil {
		t.Fatalf("the overview did not show the node disconnected: %v", err)
	}
	if err := chromedp.Do(tctx, shot("overview-node-down")); err != nil {
		t.Fatal(err)
	}

	// Every request went to berthd's own origin; every document carried the policy.
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, r := range log.requests {
		ru, err := url.Parse(r)
		if err != nil || ru.Scheme+"://"+ru.Host != cl.url {
			t.Errorf("a request left the origin %s: %s", cl.url, r)
		}
	}
	if len(log.documents) < 5 {
		t.Errorf("saw %d documents, want at least 5", len(log.documents))
	}
	for u, h := range log.documents {
		csp, _ := h["Content-Security-Policy"].(string)
		if csp == "" {
			csp, _ = h["content-security-policy"].(string)
		}
		if !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("document %s came without the Content-Security-Policy (headers %v)", u, h)
		}
	}
	for _, p := range log.problems {
		// The expected errors: the page's own CSRF-less post above, answered 403.
		if strings.Contains(p, "/ui/logout") && strings.Contains(p, "403") {
			continue
		}
		// The deploy refused for its name above (the API's 422, shown beside the form), and
		// the one posted without its token (403).
		if strings.Contains(p, "/ui/deploy") && (strings.Contains(p, "422") || strings.Contains(p, "403")) {
			continue
		}
		// The promotion of a tag never pushed, refused above (the API's 409).
		if strings.Contains(p, "/promote/v1") && strings.Contains(p, "409") {
			continue
		}
		// The page that does not exist, answered 404.
		if strings.Contains(p, "/ui/no-such-page") && strings.Contains(p, "404") {
			continue
		}
		// The other: the hx-on handler planted above, refused.
		if strings.Contains(p, "evaluating code from attributes is disabled") {
			continue
		}
		t.Errorf("the browser reported: %s", p)
	}
	t.Logf("screenshots in %s; %d requests, all same-origin", shots, len(log.requests))
}

// axePath is axe-core's script, fetched by make test (the Makefile's AXE target).
const axePath = "testdata/axe/axe.min.js"

// readAxe returns axe-core's source; the test fails when make test has not fetched it.
func readAxe(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(axePath)
	if err != nil {
		t.Fatalf("axe-core is not fetched (make test fetches it: make %s in the repository's root): %v", "e2e/ui/"+axePath, err)
	}
	return string(b)
}

// audit runs axe-core on the current page, injecting it first when the page does not have it
// yet, and returns its serious and critical violations, one line each: the rule, its impact,
// its help text and up to three of the elements it names.
func audit(ctx context.Context, tg *chromedp.Target, source string) ([]string, error) {
	if _, err := chromedp.Evaluate[bool](`typeof axe === "undefined" && (() => { `+source+` ; return true })()`)(ctx, tg); err != nil {
		return nil, fmt.Errorf("inject: %w", err)
	}
	found, err := chromedp.Evaluate[[]string](`axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations
		.filter(v => v.impact === "serious" || v.impact === "critical")
		.map(v => v.id + " (" + v.impact + "): " + v.help + " at " + v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(", ")))`,
		chromedp.EvalAwaitPromise)(ctx, tg)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	return found, nil
}
