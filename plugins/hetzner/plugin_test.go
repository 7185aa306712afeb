package hetzner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/plugins/hetzner"
	"github.com/berthhq/berth/plugins/hetzner/hcloudsim"
	"github.com/berthhq/berth/sdk/provider"
)

// simulator starts a simulator stopped with the test.
func simulator(t *testing.T) *hcloudsim.Sim {
	t.Helper()
	s := hcloudsim.Start()
	t.Cleanup(s.Close)
	return s
}

// config is a plugin configuration for sim: fast polls and a pace that
// never holds a test back; change edits it.
func config(sim *hcloudsim.Sim, change func(*hetzner.Config)) json.RawMessage {
	c := hetzner.Config{Token: hcloudsim.Token, Endpoint: sim.URL, PollIntervalMS: 20, RequestsPerHour: 360000, Burst: 1000}
	if change != nil {
		change(&c)
	}
	raw, _ := json.Marshal(c)
	return raw
}

// open returns a configured plugin on a fresh state directory.
func open(t *testing.T, cfg json.RawMessage) *hetzner.Plugin {
	t.Helper()
	p, err := hetzner.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if err := p.Configure(t.Context(), &provider.ConfigRequest{Config: cfg, APIVersion: provider.APIVersion}); err != nil {
		t.Fatal(err)
	}
	return p
}

func server(id string, labels map[string]string, change func(*hetzner.Attributes)) provider.Resource {
	a := hetzner.Attributes{ServerType: "cx22", Image: "ubuntu-24.04", Location: "fsn1", Labels: labels,
		SSHKeys: []string{"ops"}, Firewall: "berth-nodes", Placement: "berth-spread", UserData: "#cloud-config\nruncmd: [true]\n"}
	if change != nil {
		change(&a)
	}
	raw, _ := json.Marshal(a)
	return provider.Resource{Type: hetzner.ResourceType, ID: id, Attributes: raw}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var keys struct {
	mu sync.Mutex
	n  int
}

// apply plans and applies r under a fresh idempotency key.
func apply(ctx context.Context, p *hetzner.Plugin, r provider.Resource, token uint64) (provider.Resource, error) {
	plan, err := p.Plan(ctx, &provider.PlanRequest{Desired: r})
	if err != nil {
		return provider.Resource{}, err
	}
	keys.mu.Lock()
	keys.n++
	key := fmt.Sprintf("k-%d", keys.n)
	keys.mu.Unlock()
	out, err := p.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: provider.Mutation{IdempotencyKey: key, FencingToken: token}})
	if err != nil {
		return provider.Resource{}, err
	}
	return out.State, nil
}

func wantCode(t *testing.T, what string, err error, code abierrors.Code) {
	t.Helper()
	if !errors.Is(err, abierrors.New(code, "")) {
		t.Errorf("%s: got %v, want code %s", what, err, code)
	}
}

// count counts the logged requests with method whose path starts with prefix.
func count(log []hcloudsim.Request, method, prefix string) int {
	n := 0
	for _, r := range log {
		if r.Method == method && strings.HasPrefix(r.Path, prefix) {
			n++
		}
	}
	return n
}

// TestConformance runs the provider suite on the plugin in process and as
// the built binary, against the simulator, fresh for each case.
func TestConformance(t *testing.T) {
	sim := simulator(t)
	cfg := config(sim, nil)
	last := ""
	fresh := func(dir string) {
		if dir != last {
			last = dir
			sim.Reset()
		}
	}
	samples := func(id string) [2]provider.Resource {
		return [2]provider.Resource{server(id, map[string]string{"role": "web"}, nil), server(id, map[string]string{"role": "db", "pool": "a"}, nil)}
	}
	t.Run("in-process", func(t *testing.T) {
		conformance.RunProvider(t, conformance.ProviderConfig{
			Factory:      func(dir string) (provider.Provider, error) { fresh(dir); return hetzner.Open(dir, nil) },
			PluginConfig: cfg,
			Samples:      samples("conf-a"),
		})
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-hetzner")
		if os.Getenv("BERTH_BIN_DIR") == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-hetzner")
		}
		conformance.RunProvider(t, conformance.ProviderConfig{
			Binary:       bin,
			Args:         func(dir string) []string { fresh(dir); return []string{"--state-dir", dir} },
			PluginConfig: cfg,
			// No samples: the suite takes the examples Describe declares.
		})
	})
}

// TestCreateIsLabelledAndReadable: a created server is named after the
// machine, carries the two labels, gets the resolved SSH key, firewall and
// placement group, and reads back as applied.
func TestCreateIsLabelledAndReadable(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	want := server("m-1", map[string]string{"role": "web"}, nil)
	st, err := apply(ctx(t), p, want, 1)
	if err != nil {
		t.Fatal(err)
	}
	servers := sim.Servers()
	if len(servers) != 1 {
		t.Fatalf("servers after one create: %d", len(servers))
	}
	sv := servers[0]
	if sv.Name != "m-1" || sv.Labels[hetzner.LabelMachine] != "m-1" || sv.Labels[hetzner.LabelManaged] != "true" || sv.Labels["role"] != "web" {
		t.Errorf("server name %q labels %v", sv.Name, sv.Labels)
	}
	if sv.Status != "running" {
		t.Errorf("server status after Apply: %s, want running", sv.Status)
	}
	if len(sv.PublicNet.Firewalls) != 1 || sv.PublicNet.Firewalls[0].ID != 2 || sv.PlacementGroup == nil || sv.PlacementGroup.ID != 3 {
		t.Errorf("firewalls %v placement group %v", sv.PublicNet.Firewalls, sv.PlacementGroup)
	}
	if ud, _ := sim.UserData("m-1"); !strings.HasPrefix(ud, "#cloud-config") {
		t.Errorf("user data %q", ud)
	}
	got, err := p.Read(ctx(t), &provider.ReadRequest{Type: hetzner.ResourceType, ID: "m-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.State.Equal(st) {
		t.Errorf("Read %s, want %s", got.State.Attributes, st.Attributes)
	}
	// With the catalog and names cached, a create costs the lookup, the
	// POST and the polls of its two actions (they finish on the second).
	before := len(sim.Log())
	if _, err := apply(ctx(t), p, server("m-2", nil, nil), 1); err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, r := range sim.Log()[before:] {
		calls = append(calls, r.Method+" "+r.Path)
	}
	if len(calls) > 5 {
		t.Errorf("a create with a warm catalog made %d API calls, want at most 5: %v", len(calls), calls)
	}
}

// TestRetriedCreateAfterTimeoutAdopts: the create's answer is lost to the
// caller's deadline while the server exists; the retry finds it by its
// label and adopts it: one server, one POST.
func TestRetriedCreateAfterTimeoutAdopts(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	r := server("m-retry", nil, nil)
	release := sim.HoldNextCreate()
	short, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err := apply(short, p, r, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the first create: %v, want a deadline error", err)
	}
	release()
	if n := sim.Created(); n != 1 {
		t.Fatalf("servers created by the timed-out call: %d, want 1", n)
	}
	if _, err := apply(ctx(t), p, r, 1); err != nil {
		t.Fatalf("the retried create: %v", err)
	}
	if n, posts := sim.Created(), count(sim.Log(), http.MethodPost, "/servers"); n != 1 || posts != 1 {
		t.Errorf("after the retry: %d created, %d POST /servers; want 1 and 1", n, posts)
	}
	if n := len(sim.Servers()); n != 1 {
		t.Errorf("live servers: %d, want 1", n)
	}
}

// TestNameClashAdopts: when the label lookup misses a server that exists
// (a stale read), the create's name clash adopts it rather than retrying;
// a clash with a server Berth did not create is refused, final.
func TestNameClashAdopts(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	sim.AddServer("m-clash", map[string]string{hetzner.LabelMachine: "m-clash", hetzner.LabelManaged: "true"})
	sim.StaleNextLists(1)
	if _, err := apply(ctx(t), p, server("m-clash", nil, nil), 1); err != nil {
		t.Fatalf("create over a clash: %v", err)
	}
	log := sim.Log()
	if posts := count(log, http.MethodPost, "/servers"); posts != 1 {
		t.Errorf("POST /servers: %d, want exactly 1 (no retry after the clash)", posts)
	}
	if n := len(sim.Servers()); n != 1 || sim.Created() != 0 {
		t.Errorf("live servers %d, created %d; want the one adopted", n, sim.Created())
	}

	sim.AddServer("m-foreign", map[string]string{"owner": "someone-else"})
	_, err := apply(ctx(t), p, server("m-foreign", nil, nil), 1)
	wantCode(t, "create over a server Berth did not create", err, abierrors.ProviderNameTaken)
	if abierrors.ProviderRetryable(abierrors.CodeOf(err)) {
		t.Errorf("%s is retryable", abierrors.CodeOf(err))
	}
	for _, sv := range sim.Servers() {
		if sv.Name == "m-foreign" && sv.Labels[hetzner.LabelMachine] != "" {
			t.Errorf("the foreign server was labelled: %v", sv.Labels)
		}
	}
}

// TestFailedStartDeletesServer: a failed start_server (a NextAction)
// deletes the server and fails with a final code.
func TestFailedStartDeletesServer(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	sim.FailStart("m-bad")
	_, err := apply(ctx(t), p, server("m-bad", nil, nil), 1)
	wantCode(t, "a create whose start fails", err, abierrors.ProviderActionFailed)
	if err != nil && !strings.Contains(err.Error(), "start_server") {
		t.Errorf("the error does not name the failed action: %v", err)
	}
	if abierrors.ProviderRetryable(abierrors.CodeOf(err)) {
		t.Errorf("%s is retryable", abierrors.CodeOf(err))
	}
	if n := len(sim.Servers()); n != 0 || sim.Created() != 1 {
		t.Errorf("after the failed start: %d live servers (want 0), %d created (want 1)", n, sim.Created())
	}
	if d := count(sim.Log(), http.MethodDelete, "/servers/"); d != 1 {
		t.Errorf("DELETE /servers: %d, want 1", d)
	}
}

// TestStuckInitializingIsDeleted: a server whose create never finishes is
// deleted after the create timeout, with a retryable code.
func TestStuckInitializingIsDeleted(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, func(c *hetzner.Config) { c.CreateTimeoutS = 1 }))
	sim.StuckInitializing("m-stuck")
	_, err := apply(ctx(t), p, server("m-stuck", nil, nil), 1)
	wantCode(t, "a create stuck initializing", err, abierrors.ProviderResourceUnavailable)
	if !abierrors.ProviderRetryable(abierrors.CodeOf(err)) {
		t.Errorf("%s is not retryable", abierrors.CodeOf(err))
	}
	if n := len(sim.Servers()); n != 0 {
		t.Errorf("live servers after the timeout: %d, want 0", n)
	}
}

// TestRateLimitPausesEveryCaller: another tool empties the project's
// budget; the plugin's first request meets a 429 and every concurrent
// caller waits for the reset, so the log holds that one 429 and no other,
// and the health report names the wait.
func TestRateLimitPausesEveryCaller(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	health, err := p.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r := <-health; r.State != pluginapi.Healthy {
		t.Fatalf("first health report %+v", r)
	}
	const budget = 4
	sim.SetRateLimit(budget, 2*time.Second)
	for range budget { // the other tool
		req, _ := http.NewRequest(http.MethodGet, sim.URL+"/locations", nil)
		req.Header.Set("Authorization", "Bearer "+hcloudsim.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Read(ctx(t), &provider.ReadRequest{Type: hetzner.ResourceType, ID: fmt.Sprintf("m-absent-%d", i)})
			if !errors.Is(err, provider.ErrNotFound) {
				errs <- err
			}
		}()
	}
	paused := false
	deadline := time.After(20 * time.Second)
	for !paused {
		select {
		case r := <-health:
			paused = strings.Contains(r.Description, "rate limit")
		case <-deadline:
			t.Fatal("no health report named the rate-limit wait within 20 s")
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a caller failed instead of waiting: %v", err)
	}
	var got429, ok int
	for _, r := range sim.Log() {
		switch {
		case r.Status == http.StatusTooManyRequests:
			got429++
		case r.Path == "/servers" && r.Status == http.StatusOK:
			ok++
		}
	}
	if got429 != 1 || ok != callers {
		for _, r := range sim.Log() {
			t.Logf("%s %s %s %d", r.At.Format("15:04:05.000"), r.Method, r.Path, r.Status)
		}
		t.Errorf("the log holds %d answers 429 and %d lookups answered; want 1 and %d (every caller waited for the reset)", got429, ok, callers)
	}
}

// TestDeleteOfAbsentServerSucceeds: deleting a machine without a server is
// success and deletes nothing.
func TestDeleteOfAbsentServerSucceeds(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	if _, err := p.Delete(ctx(t), &provider.DeleteRequest{Type: hetzner.ResourceType, ID: "m-none", Mutation: provider.Mutation{IdempotencyKey: "d1", FencingToken: 1}}); err != nil {
		t.Fatalf("delete of an absent server: %v", err)
	}
	if d := count(sim.Log(), http.MethodDelete, "/"); d != 0 {
		t.Errorf("DELETE requests: %d, want 0", d)
	}
}

// TestManagedListsBerthServers: Managed returns the servers labelled
// berth-managed=true and nothing else, with their machine ids.
func TestManagedListsBerthServers(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	for _, id := range []string{"m-a", "m-b"} {
		if _, err := apply(ctx(t), p, server(id, nil, nil), 1); err != nil {
			t.Fatal(err)
		}
	}
	sim.AddServer("not-ours", map[string]string{"team": "x"})
	sim.AddServer("m-leaked", map[string]string{hetzner.LabelMachine: "m-leaked", hetzner.LabelManaged: "true"})
	ms, err := p.Managed(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.MachineID)
		if m.ServerID == 0 || m.Created.IsZero() || m.ServerType != "cx22" || m.Location != "fsn1" {
			t.Errorf("machine %+v lacks facts", m)
		}
	}
	if strings.Join(ids, ",") != "m-a,m-b,m-leaked" {
		t.Errorf("managed machines %v, want m-a, m-b, m-leaked", ids)
	}
}

// TestPlanRefusesUnknownTypeAndLocation: an unknown server type or
// location is refused in Plan with the API's catalog as reason, before
// anything is created.
func TestPlanRefusesUnknownTypeAndLocation(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	_, err := p.Plan(ctx(t), &provider.PlanRequest{Desired: server("m-x", nil, func(a *hetzner.Attributes) { a.ServerType = "cx99"; a.Location = "mars1" })})
	wantCode(t, "plan with an unknown type", err, abierrors.ProviderInvalidInput)
	if err != nil && (!strings.Contains(err.Error(), `"cx99"`) || !strings.Contains(err.Error(), "cx22") || !strings.Contains(err.Error(), `"mars1"`)) {
		t.Errorf("the refusal does not name the type, location and the offered ones: %v", err)
	}
	if sim.Created() != 0 || count(sim.Log(), http.MethodPost, "/") != 0 {
		t.Errorf("a refused plan wrote to the API")
	}
	// A change of anything but labels over an existing server is refused.
	cur := server("m-x", nil, nil)
	_, err = p.Plan(ctx(t), &provider.PlanRequest{Desired: server("m-x", nil, func(a *hetzner.Attributes) { a.ServerType = "cx32" }), Current: &cur})
	wantCode(t, "plan changing the type", err, abierrors.ValidationFailed)
}

// TestAPIErrorsMapToStableCodes: the API's refusals of a create become
// Berth codes, final or retryable, and a read-only token is tried once.
func TestAPIErrorsMapToStableCodes(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	for i, c := range []struct {
		status    int
		api       string
		want      abierrors.Code
		retryable bool
	}{
		{http.StatusUnprocessableEntity, "invalid_input", abierrors.ProviderInvalidInput, false},
		{http.StatusForbidden, "forbidden", abierrors.ProviderForbidden, false},
		{http.StatusForbidden, "resource_limit_exceeded", abierrors.ProviderResourceLimitExceeded, false},
		{http.StatusServiceUnavailable, "resource_unavailable", abierrors.ProviderResourceUnavailable, true},
		{http.StatusPreconditionFailed, "placement_error", abierrors.ProviderPlacementError, true},
		{http.StatusLocked, "locked", abierrors.ProviderLocked, true},
		{http.StatusInternalServerError, "server_error", abierrors.Unavailable, true},
	} {
		sim.FailNext(http.MethodPost, "/servers", 1, c.status, c.api)
		_, err := apply(ctx(t), p, server(fmt.Sprintf("m-err-%d", i), nil, nil), 1)
		wantCode(t, c.api, err, c.want)
		if got := abierrors.ProviderRetryable(abierrors.CodeOf(err)); got != c.retryable {
			t.Errorf("%s: retryable %v, want %v", c.api, got, c.retryable)
		}
	}
	if n := len(sim.Servers()); n != 0 {
		t.Errorf("servers after refused creates: %d", n)
	}

	ro := open(t, config(sim, func(c *hetzner.Config) { c.Token = hcloudsim.ReadOnlyToken }))
	before := count(sim.Log(), http.MethodPost, "/servers")
	_, err := apply(ctx(t), ro, server("m-ro", nil, nil), 1)
	wantCode(t, "create with a read-only token", err, abierrors.ProviderForbidden)
	if n := count(sim.Log(), http.MethodPost, "/servers") - before; n != 1 {
		t.Errorf("POST /servers with a read-only token: %d, want 1 (no retries)", n)
	}
}

// TestCreateAnswered429IsSentAgain: a POST answered 429 was not carried
// out; the limiter sends it again, body and all, after the reset, and the
// create succeeds with one server.
func TestCreateAnswered429IsSentAgain(t *testing.T) {
	sim := simulator(t)
	p := open(t, config(sim, nil))
	sim.FailNext(http.MethodPost, "/servers", 1, http.StatusTooManyRequests, "rate_limit_exceeded")
	if _, err := apply(ctx(t), p, server("m-429", map[string]string{"role": "web"}, nil), 1); err != nil {
		t.Fatalf("a create answered 429 once: %v", err)
	}
	var statuses []int
	for _, r := range sim.Log() {
		if r.Method == http.MethodPost && r.Path == "/servers" {
			statuses = append(statuses, r.Status)
		}
	}
	if fmt.Sprint(statuses) != "[429 201]" {
		t.Errorf("POST /servers answers %v, want [429 201]", statuses)
	}
	if sv := sim.Servers(); len(sv) != 1 || sv[0].Labels["role"] != "web" || sim.Created() != 1 {
		t.Errorf("servers after the resent create: %+v (created %d)", sv, sim.Created())
	}
}
