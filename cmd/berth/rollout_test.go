package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// reconAPI stands for berthd's handlers of the reconciliation endpoints (docs/reconciliation.md:
// runtime specs, slots, rollout status and undo, node retirement) and answers with the exact JSON
// shapes of sdk/client/rollout.go. Rollout reads of a service walk through a scripted sequence
// and then repeat its last entry.
type reconAPI struct {
	t *testing.T

	mu       sync.Mutex
	services []client.Service
	rollouts map[string][]client.RolloutStatus
	reads    map[string]int
	specs    map[string]client.RuntimeSpecDoc
	slots    map[string][]client.SlotView
	// bodies are the raw bodies of PUT .../spec and POST .../retire, in order.
	bodies []string
}

func newReconAPI(t *testing.T) (*reconAPI, *cli) {
	t.Helper()
	f := &reconAPI{t: t, rollouts: map[string][]client.RolloutStatus{}, reads: map[string]int{},
		specs: map[string]client.RuntimeSpecDoc{}, slots: map[string][]client.SlotView{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"] = srv.URL
	c.env["BERTH_TOKEN"] = "brt_good"
	return f, c
}

func (f *reconAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer brt_good" {
		problem(w, 401, "unauthenticated", "authentication failed")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		problem(w, 400, "bad_request", err.Error())
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/"), "/")
	route := r.Method + " " + strings.Join(parts, "/")
	svcRoute := func(suffix string) (string, bool) {
		if len(parts) < 4 || parts[0] != "projects" || parts[1] != "default" || parts[2] != "services" {
			return "", false
		}
		return parts[3], strings.Join(parts[4:], "/") == suffix
	}
	if name, ok := svcRoute("rollout"); ok && r.Method == "GET" {
		seq, found := f.rollouts[name]
		if !found {
			problem(w, 404, "service_not_found", "no service "+name)
			return
		}
		i := min(f.reads[name], len(seq)-1)
		f.reads[name]++
		answer(w, 200, seq[i])
		return
	}
	if name, ok := svcRoute("rollout/undo"); ok && r.Method == "POST" {
		if name != "hello" {
			problem(w, 409, "no_previous_release", "service "+name+" never ran another release")
			return
		}
		var req client.UndoRequest
		if err := json.Unmarshal(body, &req); err != nil {
			problem(w, 400, "bad_request", err.Error())
			return
		}
		changes := []client.UndoChange{{Field: "release", From: "sha256:2222", To: "sha256:1111"}, {Field: "env", From: "-DEBUG ~TOKEN", To: "+MODE ~TOKEN"}}
		if req.DryRun {
			answer(w, 200, client.UndoResult{Service: client.Service{ID: "svc_hello", Project: "default", Name: "hello", Revision: 7,
				BundleDigest: "sha256:2222"}, Changes: changes, DryRun: true})
			return
		}
		if req.ExpectedRevision == nil || *req.ExpectedRevision != 7 {
			problem(w, 409, "revision_conflict", "the undo must name the revision its changes were read from")
			return
		}
		f.bodies = append(f.bodies, string(body))
		answer(w, 200, client.UndoResult{Service: client.Service{ID: "svc_hello", Project: "default", Name: "hello", Revision: 8,
			BundleDigest: "sha256:1111111111111111aaaa"}, Changes: changes})
		return
	}
	for _, action := range []string{"pause", "resume", "restart"} {
		name, ok := svcRoute("rollout/" + action)
		if !ok || r.Method != "POST" {
			continue
		}
		if name != "hello" {
			problem(w, 404, "service_not_found", "no service "+name)
			return
		}
		f.bodies = append(f.bodies, route)
		svc := client.Service{ID: "svc_hello", Project: "default", Name: "hello", Revision: 9, RolloutPaused: action == "pause", RestartGeneration: 3}
		answer(w, 200, client.RolloutControl{Service: svc, Changed: action != "resume"})
		return
	}
	if name, ok := svcRoute("spec"); ok {
		switch r.Method {
		case "GET":
			doc, found := f.specs[name]
			if !found {
				problem(w, 404, "service_not_found", "no service "+name)
				return
			}
			answer(w, 200, doc)
		case "PUT":
			f.bodies = append(f.bodies, string(body))
			var sw client.SpecWrite
			dec := json.NewDecoder(strings.NewReader(string(body)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&sw); err != nil {
				problem(w, 400, "bad_request", err.Error())
				return
			}
			cur := f.specs[name]
			if sw.ExpectedRevision == nil && cur.Source == "operator" ||
				sw.ExpectedRevision != nil && (cur.Source != "operator" || *sw.ExpectedRevision != cur.Spec.Revision) {
				problem(w, 409, "conflict", "the spec changed meanwhile")
				return
			}
			sw.Spec.Revision = cur.Spec.Revision + 1
			doc := client.RuntimeSpecDoc{Service: name, Source: "operator", Spec: sw.Spec}
			f.specs[name] = doc
			answer(w, 200, doc)
		}
		return
	}
	if name, ok := svcRoute("workloads"); ok && r.Method == "GET" {
		answer(w, 200, client.List[client.SlotView]{Items: f.slots[name]})
		return
	}
	switch {
	case route == "GET projects/default/services":
		answer(w, 200, client.List[client.Service]{Items: f.services})
	case len(parts) == 3 && parts[0] == "nodes" && parts[2] == "retire" && r.Method == "POST":
		f.bodies = append(f.bodies, string(body))
		var req struct {
			Disposition string `json:"disposition"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			problem(w, 400, "bad_request", err.Error())
			return
		}
		if req.Disposition == "lost" {
			problem(w, 409, "node_still_reporting", "node "+parts[1]+" reported 3s ago")
			return
		}
		answer(w, 200, client.Retirement{NodeID: parts[1], Disposition: req.Disposition, State: "retiring",
			Wait: "slot-settlement-pending", Slots: 3, CreatedAt: testNow()})
	default:
		problem(w, 404, "not_found", "no route "+route)
	}
}

func TestGetServicesVerdictColumn(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	created := testNow().Add(-2 * time.Hour)
	api.set(func() {
		api.services = []client.Service{
			{Name: "a", Revision: 3, Replicas: 2, Ready: 2, BundleDigest: "sha256:0123456789abcdef", CreatedAt: created,
				Verdict: &client.Verdict{SpecRevision: 1, State: "converged"}},
			{Name: "b", Revision: 1, Replicas: 1, CreatedAt: created,
				Verdict: &client.Verdict{SpecRevision: 2, State: "waiting", Reason: "failure-backoff"}},
			{Name: "c", Revision: 1, Replicas: 1, CreatedAt: created,
				Verdict: &client.Verdict{State: "converging"}, Deleting: true},
			{Name: "d", Revision: 1, Replicas: 0, CreatedAt: created, Deleting: true},
			{Name: "e", Revision: 1, Replicas: 1, CreatedAt: created},
		}
	})
	out := c.ok("", "get", "services")
	want := "NAME   REVISION   REPLICAS   READY   VERDICT                    DOMAINS   BUNDLE/IMAGE          AGE\n" +
		"a      3          2          2/2     converged                  -         sha256:0123456789ab   2h\n" +
		"b      1          1          0/1     waiting(failure-backoff)   -         -                     2h\n" +
		"c      1          1          0/1     converging,deleting        -         -                     2h\n" +
		"d      1          0          0/0     deleting                   -         -                     2h\n" +
		"e      1          1          0/1     -                          -         -                     2h\n"
	if out != want {
		t.Errorf("get services:\n%s\nwant:\n%s", out, want)
	}
	out = c.ok("", "get", "services", "-o", "json")
	var got []client.Service
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || got[1].Verdict == nil || got[1].Verdict.Reason != "failure-backoff" || !got[3].Deleting || got[4].Verdict != nil {
		t.Errorf("get services -o json: %s", out)
	}
}

func TestRolloutStatus(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	st := func(rev, spec int64, updated, outdated int, v client.Verdict) client.RolloutStatus {
		return client.RolloutStatus{Service: "hello", Revision: rev, SpecRevision: spec, Release: "sha256:bb",
			PreviousRelease: "sha256:aa", Verdict: v, Desired: 3, Updated: updated, Outdated: outdated}
	}
	api.set(func() {
		api.rollouts["hello"] = []client.RolloutStatus{
			st(7, 3, 0, 3, client.Verdict{SpecRevision: 2, State: "converged"}),
			st(7, 3, 1, 2, client.Verdict{SpecRevision: 3, State: "converging"}),
			st(7, 3, 1, 2, client.Verdict{SpecRevision: 3, State: "converging"}),
			st(7, 3, 2, 1, client.Verdict{SpecRevision: 3, State: "converging"}),
			st(7, 3, 3, 0, client.Verdict{SpecRevision: 3, State: "converged"}),
		}
		api.rollouts["jsonly"] = []client.RolloutStatus{
			st(2, 1, 2, 1, client.Verdict{SpecRevision: 1, State: "converging"}),
			st(2, 1, 3, 0, client.Verdict{SpecRevision: 1, State: "converged"}),
		}
		// A release change leaves the verdict converged until the next sweep; the counts tell.
		api.rollouts["undone"] = []client.RolloutStatus{
			st(8, 3, 0, 3, client.Verdict{SpecRevision: 3, State: "converged"}),
			st(8, 3, 3, 0, client.Verdict{SpecRevision: 3, State: "converged"}),
		}
		// A refusal about an older spec revision is followed, not ended on.
		api.rollouts["respec"] = []client.RolloutStatus{
			st(5, 4, 0, 3, client.Verdict{SpecRevision: 3, State: "refused", Reason: "no-eligible-node"}),
			st(5, 4, 3, 0, client.Verdict{SpecRevision: 4, State: "converged"}),
		}
		api.rollouts["stuck"] = []client.RolloutStatus{
			st(4, 2, 0, 3, client.Verdict{SpecRevision: 2, State: "converging"}),
			st(4, 2, 0, 3, client.Verdict{SpecRevision: 2, State: "refused", Reason: "no-eligible-node"}),
		}
		api.rollouts["backoff"] = []client.RolloutStatus{
			st(5, 2, 2, 1, client.Verdict{SpecRevision: 2, State: "waiting", Reason: "failure-backoff"}),
		}
	})

	// converging, then converged for the current spec revision: exit 0, one line per change.
	out := c.ok("", "rollout", "status", "hello", "--interval", "1ms")
	want := "rev 7 spec 3: 0/3 updated, 3 outdated, verdict converged (of spec 2)\n" +
		"rev 7 spec 3: 1/3 updated, 2 outdated, verdict converging\n" +
		"rev 7 spec 3: 2/3 updated, 1 outdated, verdict converging\n" +
		"rev 7 spec 3: 3/3 updated, 0 outdated, verdict converged\n" +
		"rollout of hello converged\n"
	if out != want {
		t.Errorf("rollout status:\n%s\nwant:\n%s", out, want)
	}

	out = c.ok("", "rollout", "status", "undone", "--interval", "1ms")
	want = "rev 8 spec 3: 0/3 updated, 3 outdated, verdict converged\n" +
		"rev 8 spec 3: 3/3 updated, 0 outdated, verdict converged\n" +
		"rollout of undone converged\n"
	if out != want {
		t.Errorf("rollout status after a release change:\n%s\nwant:\n%s", out, want)
	}
	out = c.ok("", "rollout", "status", "respec", "--interval", "1ms")
	want = "rev 5 spec 4: 0/3 updated, 3 outdated, verdict refused(no-eligible-node) (of spec 3)\n" +
		"rev 5 spec 4: 3/3 updated, 0 outdated, verdict converged\n" +
		"rollout of respec converged\n"
	if out != want {
		t.Errorf("rollout status past a stale refusal:\n%s\nwant:\n%s", out, want)
	}

	// -o json: stdout holds only the final status; the progress goes to stderr.
	out, errOut, code := c.run("", "rollout", "status", "jsonly", "--interval", "1ms", "-o", "json")
	var final client.RolloutStatus
	if err := json.Unmarshal([]byte(out), &final); code != 0 || err != nil || final.Updated != 3 || final.Verdict.State != "converged" {
		t.Errorf("rollout status -o json: exit %d, %v, stdout %q", code, err, out)
	}
	if !strings.Contains(errOut, "2/3 updated") {
		t.Errorf("rollout status -o json progress on stderr: %q", errOut)
	}

	// refused ends non-zero with the reason.
	out, errOut, code = c.run("", "rollout", "status", "stuck", "--interval", "1ms")
	if code == 0 || errOut != "error: rollout of stuck refused: no-eligible-node\n" {
		t.Errorf("refused rollout: exit %d, stderr %q", code, errOut)
	}
	if !strings.HasSuffix(out, "verdict refused(no-eligible-node)\n") {
		t.Errorf("refused rollout stdout %q", out)
	}

	// A timeout names what the service waits on.
	_, errOut, code = c.run("", "rollout", "status", "backoff", "--interval", "50ms", "--timeout", "1s")
	if code == 0 || !strings.Contains(errOut, "did not converge within 1s: waiting on failure-backoff") {
		t.Errorf("timed-out rollout: exit %d, stderr %q", code, errOut)
	}

	// --watch=false prints once and exits 0 whatever the verdict.
	before := api.readsOf("stuck")
	out = c.ok("", "rollout", "status", "stuck", "--watch=false")
	if out != "rev 4 spec 2: 0/3 updated, 3 outdated, verdict refused(no-eligible-node)\n" || api.readsOf("stuck") != before+1 {
		t.Errorf("--watch=false: %q", out)
	}

	// An unknown service surfaces the API's code.
	_, errOut, code = c.run("", "rollout", "status", "nosuch", "--interval", "1ms")
	if code == 0 || !strings.Contains(errOut, "service_not_found") {
		t.Errorf("unknown service: exit %d, stderr %q", code, errOut)
	}
}

// set changes the fake's state under its lock.
func (f *reconAPI) set(change func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change()
}

func (f *reconAPI) bodyCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

func (f *reconAPI) readsOf(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads[name]
}

func (f *reconAPI) lastBody() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		return ""
	}
	return f.bodies[len(f.bodies)-1]
}

func TestRolloutUndo(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	changes := "undo of hello (revision 7) %s:\n" +
		"  release:   sha256:2222   ->   sha256:1111\n" +
		"  env:       DEBUG removed, MODE added, TOKEN changed\n"
	if out := c.ok("", "rollout", "undo", "hello", "--dry-run"); out != fmt.Sprintf(changes, "would change") {
		t.Errorf("undo --dry-run output %q", out)
	}
	if n := api.bodyCount(); n != 0 {
		t.Fatalf("a dry run undid: %d undo bodies", n)
	}
	if out := c.ok("", "rollout", "undo", "hello"); out != fmt.Sprintf(changes, "will change")+"hello: back to sha256:1111111111111111aaaa (revision 8)\n" {
		t.Errorf("undo output %q", out)
	}
	_, errOut, code := c.run("", "rollout", "undo", "fresh")
	if code == 0 || !strings.Contains(errOut, "undo rollout of default/fresh: no_previous_release") {
		t.Errorf("undo without a previous release: exit %d, stderr %q", code, errOut)
	}
}

// TestRolloutPauseResumeRestart: each command posts its action for [PROJECT/]SERVICE and says
// what it did, a no-op included; a missing service is an error naming its code.
func TestRolloutPauseResumeRestart(t *testing.T) {
	t.Parallel()
	f, c := newReconAPI(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rollout", "pause", "hello"}, "rollout of default/hello paused (revision 9)"},
		{[]string{"rollout", "resume", "default/hello"}, "rollout of default/hello was not paused"},
		{[]string{"rollout", "restart", "hello"}, "rollout of default/hello restarting (restart generation 3, revision 9)"},
	} {
		out, errOut, code := c.run("", tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Fatalf("berth %v: exit %d\n%s%s\nwant %q", tc.args, code, out, errOut, tc.want)
		}
	}
	want := []string{"POST projects/default/services/hello/rollout/pause", "POST projects/default/services/hello/rollout/resume",
		"POST projects/default/services/hello/rollout/restart"}
	f.mu.Lock()
	got := strings.Join(f.bodies, "\n")
	f.mu.Unlock()
	if got != strings.Join(want, "\n") {
		t.Fatalf("requests %q, want %v", got, want)
	}
	if _, errOut, code := c.run("", "rollout", "restart", "nosuch"); code == 0 || !strings.Contains(errOut, "service_not_found") {
		t.Fatalf("restart of a missing service: exit %d: %s", code, errOut)
	}
}

func TestSpecSetAndGet(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	api.set(func() {
		api.specs["hello"] = client.RuntimeSpecDoc{Service: "hello", Source: "service",
			Spec: client.RuntimeSpec{Placement: client.RuntimePlacement{Mode: "scheduled"}, Replicas: client.RuntimeReplicas{Total: 1}}}
		api.specs["other"] = api.specs["hello"]
	})
	dir := t.TempDir()
	yamlFile := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(yamlFile, []byte("placement: {mode: scheduled}\nreplicas: {total: 3}\nreadiness: {kind: http, port: 8080, path: /healthz}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// --create sends expected_revision null.
	if out := c.ok("", "spec", "set", "hello", "-f", yamlFile, "--create"); out != "spec of hello at revision 1\n" {
		t.Errorf("spec set --create: %q", out)
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal([]byte(api.lastBody()), &sent); err != nil || string(sent["expected_revision"]) != "null" {
		t.Errorf("--create sent %s", api.lastBody())
	}
	var spec client.RuntimeSpec
	if err := json.Unmarshal(sent["spec"], &spec); err != nil || spec.Replicas.Total != 3 || spec.Readiness.Port != 8080 || spec.Readiness.Path != "/healthz" {
		t.Errorf("spec sent %s (%v)", sent["spec"], err)
	}

	// spec get prints the document, which spec set takes back as is.
	out := c.ok("", "spec", "get", "hello")
	var doc client.RuntimeSpecDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Source != "operator" || doc.Spec.Revision != 1 {
		t.Fatalf("spec get: %q (%v)", out, err)
	}
	docFile := filepath.Join(dir, "doc.json")
	if err := os.WriteFile(docFile, []byte(strings.Replace(out, `"total": 3`, `"total": 5`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	// Without a flag: read-modify-write, expecting the revision read from an operator spec.
	if out := c.ok("", "spec", "set", "hello", "-f", docFile); out != "spec of hello at revision 2\n" {
		t.Errorf("read-modify-write: %q", out)
	}
	if err := json.Unmarshal([]byte(api.lastBody()), &sent); err != nil || string(sent["expected_revision"]) != "1" {
		t.Errorf("read-modify-write sent %s", api.lastBody())
	}
	// ... and null when the spec read is derived from the service.
	if out := c.ok(`{"replicas": {"total": 2}}`, "spec", "set", "other", "-f", "-"); out != "spec of other at revision 1\n" {
		t.Errorf("read-modify-write of a derived spec: %q", out)
	}
	if err := json.Unmarshal([]byte(api.lastBody()), &sent); err != nil || string(sent["expected_revision"]) != "null" {
		t.Errorf("read-modify-write of a derived spec sent %s", api.lastBody())
	}

	// A stale --expected-revision surfaces "conflict".
	_, errOut, code := c.run("", "spec", "set", "hello", "-f", yamlFile, "--expected-revision", "1")
	if code == 0 || !strings.Contains(errOut, "set spec of default/hello: conflict") {
		t.Errorf("stale revision: exit %d, stderr %q", code, errOut)
	}
	if err := json.Unmarshal([]byte(api.lastBody()), &sent); err != nil || string(sent["expected_revision"]) != "1" {
		t.Errorf("--expected-revision sent %s", api.lastBody())
	}

	// Bad files and flags fail before any write.
	before := api.bodyCount()
	for _, tc := range []struct {
		stdin   string
		args    []string
		wantErr string
	}{
		{"replicas: {totl: 2}\n", []string{"-f", "-"}, `unknown field "totl"`},
		{`{"replicas": {"total": 2}} {"hold": true}`, []string{"-f", "-"}, "want one spec"},
		{"hold: true\n---\nhold: false\n", []string{"-f", "-"}, "found 2 documents"},
		{"", []string{"-f", "-"}, "no spec"},
		{"hold: true\n", []string{"-f", "-", "--create", "--expected-revision", "2"}, "exclude each other"},
		{"hold: true\n", nil, "-f FILE is required"},
	} {
		_, errOut, code := c.run(tc.stdin, append([]string{"spec", "set", "hello"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.wantErr) {
			t.Errorf("spec set %v with %q: exit %d, stderr %q, want %q", tc.args, tc.stdin, code, errOut, tc.wantErr)
		}
	}
	if n := api.bodyCount(); n != before {
		t.Errorf("%d refused files were written", n-before)
	}
}

func TestGetSlots(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	seen := testNow().Add(-90 * time.Second)
	exit2 := 2
	api.set(func() {
		api.slots["hello"] = []client.SlotView{
			{ServiceID: "svc_1", Replica: "0", NodeID: "nod_1", WorkloadID: "wl_1", AttemptID: "att_1", Current: true,
				Disposition: "run", Observation: client.SlotObservation{Phase: "running", Ready: true, ObservedAt: &seen}, Delivery: "delivered"},
			{ServiceID: "svc_1", Replica: "1", NodeID: "nod_2", WorkloadID: "wl_2", AttemptID: "att_2", Disposition: "stop",
				TerminalReceipts: 1, Observation: client.SlotObservation{Phase: "stopped", ObservedAt: &seen}, Delivery: "delivered",
				LastFailure: &client.Failure{Kind: "exit", ExitCode: &exit2, At: seen, Count: 3}},
			{ServiceID: "svc_1", Replica: "2", AttemptID: "att_3", Current: true, Disposition: "run", Delivery: "undelivered"},
		}
	})
	out := c.ok("", "get", "slots", "hello")
	want := "REPLICA   NODE    WORKLOAD   DISPOSITION   RECEIPTS   PHASE     READY   CURRENT   DELIVERY      AGE   LAST FAILURE\n" +
		"0         nod_1   wl_1       run           0/2        running   yes     yes       delivered     1m    -\n" +
		"1         nod_2   wl_2       stop          1/2        stopped   no      no        delivered     1m    exit 2 (x3, 1m ago)\n" +
		"2         -       -          run           0/2        -         no      yes       undelivered   -     -\n"
	if out != want {
		t.Errorf("get slots:\n%s\nwant:\n%s", out, want)
	}
	out = c.ok("", "get", "slots", "hello", "-o", "json")
	var got []client.SlotView
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 3 || got[1].AttemptID != "att_2" {
		t.Errorf("get slots -o json: %q (%v)", out, err)
	}
	if out := c.ok("", "get", "slots", "empty", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("no slots prints %q, want []", out)
	}
}

func TestNodeRetire(t *testing.T) {
	t.Parallel()
	api, c := newReconAPI(t)
	out := c.ok("", "node", "retire", "nod_1")
	if out != "node nod_1 retiring (withdrawn), waiting on slot-settlement-pending, 3 slot(s)\n" {
		t.Errorf("retire output %q", out)
	}
	if b := api.lastBody(); b != `{"disposition":"withdrawn"}` {
		t.Errorf("retire sent %s", b)
	}
	_, errOut, code := c.run("", "node", "retire", "nod_1", "--disposition", "lost")
	if code == 0 || !strings.Contains(errOut, "retire node nod_1 (lost): node_still_reporting") {
		t.Errorf("retire lost of a reporting node: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = c.run("", "node", "retire", "nod_1", "--disposition", "gone")
	if code == 0 || !strings.Contains(errOut, "want withdrawn or lost") {
		t.Errorf("bad disposition: exit %d, stderr %q", code, errOut)
	}
}

func TestProgressBar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desired, updated int
		want             string
	}{
		{3, 0, "[----------]"},
		{3, 2, "[######----]"},
		{3, 3, "[##########]"},
		{3, 5, "[##########]"},
		{0, 0, "[##########]"},
	} {
		if got := progressBar(&client.RolloutStatus{Desired: tc.desired, Updated: tc.updated}, 10); got != tc.want {
			t.Errorf("progressBar(%d/%d) = %q, want %q", tc.updated, tc.desired, got, tc.want)
		}
	}
}

// TestContainerServiceShowsItsImage: describe service shows a container service's runtime and
// the image it runs (the followed tag and the pinned digest) and no $PORT note, which is about
// process workloads; get services shows the image in BUNDLE/IMAGE.
func TestContainerServiceShowsItsImage(t *testing.T) {
	var out bytes.Buffer
	a := &app{stdout: &out, now: testNow}
	digest := "sha256:" + strings.Repeat("ab", 32)
	svc := &client.Service{Name: "web", Port: 8080, Container: client.Container{Runtime: "containerd", Image: "127.0.0.1:7070/default/web@" + digest, ImageTag: "default/web:main", DeployOnPush: true}}
	a.describeService(svc)
	if !strings.Contains(out.String(), "Image:") || !strings.Contains(out.String(), "default/web:main@sha256:abababababab") {
		t.Errorf("describe of a container service lacks its image:\n%s", out.String())
	}
	if strings.Contains(out.String(), "$PORT") {
		t.Errorf("describe of a container service speaks of $PORT:\n%s", out.String())
	}
	if got := imageCell(client.Container{Image: digest}); got != "sha256:abababababab" {
		t.Errorf("imageCell of a layout image = %q", got)
	}
}
