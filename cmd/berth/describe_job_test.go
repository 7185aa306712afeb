package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// TestDescribeJobShowsItsSettings: describing a job prints its schedule, next fire time and run
// policy, and none of a kept-running service's port, replicas, verdict or health check; a
// suspended job says how to resume it instead of a next fire time.
func TestDescribeJobShowsItsSettings(t *testing.T) {
	next := time.Now().Add(90 * time.Second)
	svc := &client.Service{Name: "report", Project: "default", Revision: 1, Command: []string{"./report"}, Kind: "job", NextFire: &next,
		Job: &client.JobSpec{Schedule: "*/5 * * * *", TimeZone: "Europe/Berlin", Concurrency: "replace", TimeoutS: 120, Retries: 2, StartingDeadlineS: 300, KeepHistory: 20}}
	var out bytes.Buffer
	a := &app{stdout: &out}
	a.describeService(svc)
	for _, want := range []string{"Kind:", "job", "*/5 * * * * (Europe/Berlin)", "Next fire:", "(in 1m", "Concurrency:", "replace", "2m0s per attempt", "Retries:", "Starting deadline:", "5m0s", "20 runs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe of a job lacks %q:\n%s", want, out.String())
		}
	}
	for _, not := range []string{"Port:", "Replicas:", "Verdict:", "Health check:", "Domains:"} {
		if strings.Contains(out.String(), not) {
			t.Errorf("describe of a job shows %q:\n%s", not, out.String())
		}
	}
	out.Reset()
	svc.Suspended, svc.NextFire = true, nil
	a.describeService(svc)
	if !strings.Contains(out.String(), "suspended: berth job resume report") {
		t.Errorf("describe of a suspended job does not say how to resume it:\n%s", out.String())
	}
}
