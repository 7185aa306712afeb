package reconciler

import (
	"slices"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
)

// TestBuildSpecContainer: a service's runtime picks the workload's driver,
// and its container fields reach the node (memory in bytes).
func TestBuildSpecContainer(t *testing.T) {
	svc := &services.Service{ID: "svc_1", ProjectID: "prj_1", Project: "shop", Name: "web", Runtime: "containerd",
		Image: "sha256:" + "ab", BundleDigest: "sha256:bundle", User: "1000", MemoryMB: 64, CPUMillis: 250}
	proc := &services.Service{ID: "svc_2", ProjectID: "prj_1", Project: "shop", Name: "api", BundleDigest: "sha256:b2"}
	spec := BuildSpec(&nodes.Node{ID: "nod_1"}, []services.Workload{{ID: "wl_1", ServiceID: "svc_1"}, {ID: "wl_2", ServiceID: "svc_2"}},
		map[string]*services.Service{"svc_1": svc, "svc_2": proc}, nil)
	if len(spec.Workloads) != 2 {
		t.Fatalf("workloads = %+v", spec.Workloads)
	}
	c, p := spec.Workloads[0], spec.Workloads[1]
	if c.Driver != "containerd" || c.Image != svc.Image || c.User != "1000" || c.MemoryBytes != 64<<20 || c.CPUMillis != 250 || c.BundleDigest != "sha256:bundle" {
		t.Errorf("container workload = %+v", c)
	}
	if p.Driver != "process" || p.Image != "" || p.MemoryBytes != 0 {
		t.Errorf("process workload = %+v", p)
	}
}

// TestCandidatesNeedTheDriver: only nodes advertising a container runtime's driver take its
// services' replicas; the default runtime is placed on any connected node.
func TestCandidatesNeedTheDriver(t *testing.T) {
	ns := []nodes.Node{{ID: "a", Status: nodes.StatusConnected, Drivers: []string{"process"}},
		{ID: "b", Status: nodes.StatusConnected, Drivers: []string{"containerd"}},
		{ID: "c", Status: nodes.StatusConnected}, {ID: "d", Status: nodes.StatusDisconnected, Drivers: []string{"containerd"}}}
	avail := func(runtime string) (out []string) {
		for _, n := range placement.Candidates(ns, nil, runtime) {
			if n.Unavailable == "" {
				out = append(out, n.ID)
			}
		}
		return out
	}
	if got := avail("containerd"); !slices.Equal(got, []string{"b"}) {
		t.Errorf("containerd on %v; want [b] (d is not connected)", got)
	}
	if got := avail(""); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("process on %v; want [a b c]", got)
	}
}

// TestBuildSpecNamesTheNodesDriver: a workload of the default runtime names
// the driver its node advertised, never a driver the node does not run.
func TestBuildSpecNamesTheNodesDriver(t *testing.T) {
	proc := &services.Service{ID: "svc_2", ProjectID: "prj_1", Project: "shop", Name: "api", BundleDigest: "sha256:b2"}
	for _, tc := range []struct {
		drivers []string
		want    string
	}{
		{nil, "process"},
		{[]string{"process"}, "process"},
		{[]string{"fake"}, "fake"},
		{[]string{"acme", "process"}, "process"},
		{[]string{"acme"}, "acme"},
	} {
		spec := BuildSpec(&nodes.Node{ID: "nod_1", Drivers: tc.drivers}, []services.Workload{{ID: "wl_2", ServiceID: "svc_2"}},
			map[string]*services.Service{"svc_2": proc}, nil)
		if len(spec.Workloads) != 1 || spec.Workloads[0].Driver != tc.want {
			t.Errorf("node advertising %v: workloads %+v; want driver %q", tc.drivers, spec.Workloads, tc.want)
		}
	}
}

// TestSpecNamesTheCoreRegistryOnlyForItsImages: a desired state whose container image is in the
// core's registry names the registry's host (node.Spec.RegistryHost, for a relayed node to pull
// through its relay); one with only process workloads or other registries' images does not.
func TestSpecNamesTheCoreRegistryOnlyForItsImages(t *testing.T) {
	pinned := "@sha256:" + strings.Repeat("c", 64)
	for _, tc := range []struct {
		images []string
		host   string
		want   string
	}{
		{[]string{"", "berth.example:8443/shop/web" + pinned}, "berth.example:8443", "berth.example:8443"},
		{[]string{"", "ghcr.io/acme/app" + pinned}, "berth.example:8443", ""},
		{[]string{""}, "berth.example:8443", ""},
		{[]string{"berth.example:84431/shop/web" + pinned}, "berth.example:8443", ""},
		{[]string{"berth.example:8443/shop/web" + pinned}, "", ""},
	} {
		var sp node.Spec
		for _, img := range tc.images {
			sp.Workloads = append(sp.Workloads, node.WorkloadSpec{Image: img})
		}
		nameRegistry(&sp, tc.host)
		if sp.RegistryHost != tc.want {
			t.Errorf("images %v, core registry %q: RegistryHost %q, want %q", tc.images, tc.host, sp.RegistryHost, tc.want)
		}
	}
}
