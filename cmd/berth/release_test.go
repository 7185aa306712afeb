package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// promoteAPI serves POST .../releases/{tag}/promote, GET .../rollout and GET .../services/{s}
// for `berth release promote`: tag v1 names digest dig1, v0 was reserved and never pushed; the
// rollout answers follow rollouts in order, and the service read after it runs final.
type promoteAPI struct {
	mu       sync.Mutex
	rollouts []client.RolloutStatus
	reads    int
	final    string
	keys     []string // Idempotency-Key of each promotion
}

const promoted = "berth.example:7070/shop/web@sha256:1111"

func (f *promoteAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch p := r.URL.Path; {
	case r.Method == "POST" && p == "/api/v1/projects/shop/services/web/releases/v1/promote":
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		answer(w, 200, client.Service{Project: "shop", Name: "web", Revision: 5, Container: client.Container{Runtime: "containerd", Image: promoted}})
	case r.Method == "POST" && p == "/api/v1/projects/shop/services/web/releases/v0/promote":
		problem(w, 409, "release_not_pushed", `tag "v0" of shop/web is reserved but nothing was pushed to it yet`)
	case r.Method == "GET" && p == "/api/v1/projects/shop/services/web/rollout":
		i := min(f.reads, len(f.rollouts)-1)
		f.reads++
		answer(w, 200, f.rollouts[i])
	case r.Method == "GET" && p == "/api/v1/projects/shop/services/web":
		answer(w, 200, client.Service{Project: "shop", Name: "web", Revision: 6, Container: client.Container{Runtime: "containerd", Image: f.final}})
	default:
		problem(w, 404, "not_found", p)
	}
}

// TestReleasePromote: promote answers the new revision; --wait follows the rollout to
// convergence and fails when the service ended on another release (rolled back) or the tag
// was never pushed.
func TestReleasePromote(t *testing.T) {
	t.Parallel()
	st := func(updated, outdated int, state string) client.RolloutStatus {
		return client.RolloutStatus{Service: "web", Revision: 5, SpecRevision: 1, Release: promoted, Desired: 2,
			Updated: updated, Outdated: outdated, Verdict: client.Verdict{SpecRevision: 1, State: state}}
	}
	f := &promoteAPI{final: promoted, rollouts: []client.RolloutStatus{st(0, 2, "converged"), st(1, 1, "converging"), st(2, 0, "converged")}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_good"

	if out := c.ok("", "release", "promote", "shop/web", "v1"); out != "shop/web at revision 5 runs "+promoted+"\n" {
		t.Errorf("promote: %q", out)
	}
	out := c.ok("", "release", "promote", "shop/web", "v1", "--wait", "--interval", "1ms", "--idempotency-key", "ci-42")
	if !strings.HasSuffix(out, "2/2 updated, 0 outdated, verdict converged\nrollout of web converged\n") {
		t.Errorf("promote --wait: %q", out)
	}

	f.mu.Lock()
	if len(f.keys) != 2 || f.keys[0] != "" || f.keys[1] != "ci-42" {
		t.Errorf("Idempotency-Key of the promotions: %q", f.keys)
	}
	f.mu.Unlock()

	// The rollout converged, but on the release it had before: the promotion did not hold.
	f.mu.Lock()
	f.reads, f.final = 0, "berth.example:7070/shop/web@sha256:0000"
	f.mu.Unlock()
	if _, errOut, code := c.run("", "release", "promote", "shop/web", "v1", "--wait", "--interval", "1ms"); code == 0 || !strings.Contains(errOut, "promotion of v1 did not hold") {
		t.Errorf("promote --wait after a rollback: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := c.run("", "release", "promote", "shop/web", "v0"); code == 0 || !strings.Contains(errOut, "release_not_pushed") {
		t.Errorf("promote of a tag never pushed: exit %d, stderr %q", code, errOut)
	}
}
