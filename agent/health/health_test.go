package health

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

func TestTracker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		threshold int
		probes    string // p = pass, f = fail
		want      string
		changes   int
	}{
		{"no probes", 3, "", node.HealthUnknown, 0},
		{"failures below threshold stay unknown", 3, "ff", node.HealthUnknown, 0},
		{"threshold failures fail", 3, "fff", node.HealthFailing, 1},
		{"one pass passes", 3, "p", node.HealthPassing, 1},
		{"pass then two failures still passing", 3, "pff", node.HealthPassing, 1},
		{"pass then threshold failures fail", 3, "pfff", node.HealthFailing, 2},
		{"recovery with one pass", 3, "fffp", node.HealthPassing, 2},
		{"failures reset by a pass", 3, "ffpff", node.HealthPassing, 1},
		{"zero threshold means 3", 0, "ff", node.HealthUnknown, 0},
		{"threshold 1", 1, "pf", node.HealthFailing, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := Tracker{Threshold: tc.threshold}
			changes := 0
			for _, c := range tc.probes {
				if tr.Observe(c == 'p') {
					changes++
				}
			}
			if tr.Health() != tc.want || changes != tc.changes {
				t.Fatalf("health %s with %d changes, want %s with %d", tr.Health(), changes, tc.want, tc.changes)
			}
		})
	}
}

func TestTargetFor(t *testing.T) {
	t.Parallel()
	got := TargetFor("127.0.0.1:4000", node.HealthCheck{})
	want := Target{URL: "http://127.0.0.1:4000/", Interval: 10 * time.Second, FastInterval: time.Second, Timeout: 2 * time.Second, Failures: 3}
	if got != want {
		t.Fatalf("defaults = %+v", got)
	}
	got = TargetFor("10.0.0.1:80", node.HealthCheck{Path: "healthz", IntervalS: 5, TimeoutS: 1, Failures: 2})
	want = Target{URL: "http://10.0.0.1:80/healthz", Interval: 5 * time.Second, FastInterval: time.Second, Timeout: time.Second, Failures: 2}
	if got != want {
		t.Fatalf("custom = %+v", got)
	}
}

func TestProberPassesThenFails(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() || r.URL.Path != "/healthz" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	changes := make(chan string, 16)
	p := New(Config{OnChange: func(id, h string) {
		if id == "wl_a" {
			changes <- h
		}
	}})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	await := func(want string) {
		t.Helper()
		select {
		case h := <-changes:
			if h != want {
				t.Fatalf("health changed to %s, want %s", h, want)
			}
		case <-ctx.Done():
			t.Fatalf("health never became %s", want)
		}
	}
	target := Target{URL: strings.TrimSuffix(srv.URL, "/") + "/healthz", Interval: 5 * time.Millisecond, FastInterval: 5 * time.Millisecond, Timeout: time.Second, Failures: 2}
	p.Set("wl_a", target)
	await(node.HealthPassing)
	if h := p.Health("wl_a"); h != node.HealthPassing {
		t.Fatalf("Health = %s", h)
	}
	p.Set("wl_a", target) // same target: the probe and its verdict are kept
	if h := p.Health("wl_a"); h != node.HealthPassing {
		t.Fatalf("Health after same Set = %s", h)
	}
	if f := p.Failure("wl_a"); f != nil {
		t.Fatalf("Failure while passing = %+v", f)
	}
	healthy.Store(false)
	await(node.HealthFailing)
	f := p.Failure("wl_a")
	if f == nil || f.Kind != node.FailureProbe || f.ProbeURL != target.URL || f.ProbeStatus != http.StatusServiceUnavailable || f.Count != 1 || f.At.IsZero() {
		t.Fatalf("Failure while failing = %+v", f)
	}
	healthy.Store(true)
	await(node.HealthPassing)
	if f := p.Failure("wl_a"); f != nil {
		t.Fatalf("Failure after passing again = %+v", f)
	}
	healthy.Store(false)
	await(node.HealthFailing)
	if f := p.Failure("wl_a"); f == nil || f.Count != 2 {
		t.Fatalf("second Failure = %+v, want count 2", f)
	}
	p.Remove("wl_a")
	if h := p.Health("wl_a"); h != node.HealthUnknown {
		t.Fatalf("Health after Remove = %s", h)
	}
}
