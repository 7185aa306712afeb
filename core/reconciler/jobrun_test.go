package reconciler

import (
	"slices"
	"testing"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// TestBuildSpecJobRunServesNoRoute: a one-off command of a service with a domain (a job run of
// the service, docs/jobs.md section 9) reaches its node as a job run, and the service's route
// names only the replica's workload.
func TestBuildSpecJobRunServesNoRoute(t *testing.T) {
	svc := &services.Service{ID: "svc_1", ProjectID: "prj_1", Project: "shop", Name: "web", BundleDigest: "sha256:b1",
		Command: []string{"./serve"}, Port: 8080, Domains: []string{"web.example"}}
	wls := []services.Workload{
		{ID: "wl_1", ServiceID: "svc_1", Replica: "0", DesiredStatus: services.DesiredRunning},
		{ID: "wl_2", ServiceID: "svc_1", DesiredStatus: services.DesiredRunning, JobRun: "shop/web@2026-12-02T10:00:00Z-run-0a1b2c3d",
			Run: &services.Invocation{BundleDigest: "sha256:b1", Command: []string{"sh", "-c", "true"}}},
	}
	spec := BuildSpec(&nodes.Node{ID: "nod_1"}, wls, map[string]*services.Service{"svc_1": svc}, nil)
	if len(spec.Workloads) != 2 || spec.Workloads[1].Job == nil || spec.Workloads[1].Job.RunID != wls[1].JobRun ||
		!slices.Equal(spec.Workloads[1].Command, []string{"sh", "-c", "true"}) {
		t.Fatalf("workloads = %+v; want the replica and the run with its command", spec.Workloads)
	}
	if len(spec.Routes) != 1 || !slices.Equal(spec.Routes[0].WorkloadIDs, []string{"wl_1"}) {
		t.Fatalf("routes = %+v; want web.example served by wl_1 alone", spec.Routes)
	}
}
