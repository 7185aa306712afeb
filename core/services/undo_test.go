package services

import (
	"strings"
	"testing"
)

// TestUndoChangesShowHealthDefaultsAndNoValues: a health check left at zero reads as the probe
// a node runs (the defaults of abi/node), a health check equal to those defaults is no change,
// and env changes name keys, never values.
func TestUndoChangesShowHealthDefaultsAndNoValues(t *testing.T) {
	t.Parallel()
	cur := &Service{Project: "shop", Name: "web", BundleDigest: "sha256:2222",
		Env:         map[string]string{"TOKEN": "s3cret-now", "DEBUG": "1"},
		HealthCheck: HealthCheck{Path: "/healthz", IntervalS: 5},
		Previous:    &Invocation{BundleDigest: "sha256:1111", Env: map[string]string{"TOKEN": "s3cret-before", "MODE": "x"}}}
	changes, err := UndoChanges(cur)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]UndoChange{}
	for _, ch := range changes {
		got[ch.Field] = ch
		if strings.Contains(ch.From+ch.To, "s3cret") {
			t.Errorf("change %+v shows an env value", ch)
		}
	}
	want := UndoChange{Field: "health_check", From: "GET /healthz every 5s, timeout 2s, 3 failures", To: "GET / every 10s, timeout 2s, 3 failures"}
	if got["health_check"] != want {
		t.Errorf("health_check change = %+v; want %+v", got["health_check"], want)
	}
	if env := got["env"]; env.From != "-DEBUG ~TOKEN" || env.To != "+MODE ~TOKEN" {
		t.Errorf("env change = %+v", env)
	}

	cur.HealthCheck = HealthCheck{Path: "/", IntervalS: 10, TimeoutS: 2, Failures: 3}
	changes, err = UndoChanges(cur)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range changes {
		if ch.Field == "health_check" {
			t.Errorf("the defaults written out and left at zero are the same probe, yet undo changes %+v", ch)
		}
	}
}
