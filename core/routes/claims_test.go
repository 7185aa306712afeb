package routes

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	abiroutes "github.com/berthhq/berth/abi/routes"
)

// TestResolveClaims: a hostname three services declare is served for its
// claim holder alone; one nobody holds is excluded with every declarer named;
// uncontested hostnames and the input are untouched (docs/routes.md section 2).
func TestResolveClaims(t *testing.T) {
	t.Parallel()
	in := Input{Services: []Service{
		{ID: "svc_c", Project: "p", Name: "c", Domains: []string{"held.test", "free.test"}},
		{ID: "svc_a", Project: "p", Name: "a", Domains: []string{"Held.Test.", "open.test"}},
		{ID: "svc_b", Project: "q", Name: "b", Domains: []string{"held.test", "open.test", "b.test"}},
		{ID: "svc_d", Project: "p", Name: "d", Domains: []string{"open.test"}},
	}}
	out, res := ResolveClaims(in, Claims{"held.test": "svc_b", "open.test": "svc_gone"})
	domains := map[string][]string{}
	for _, s := range out.Services {
		domains[s.Name] = s.Domains
	}
	want := map[string][]string{"c": {"free.test"}, "a": {}, "b": {"held.test", "b.test"}, "d": {}}
	if !reflect.DeepEqual(domains, want) {
		t.Fatalf("domains %v, want %v", domains, want)
	}
	if in.Services[1].Domains[0] != "Held.Test." || len(in.Services[0].Domains) != 2 {
		t.Fatalf("the input was modified: %+v", in.Services)
	}
	wantEx := []abiroutes.Exclusion{{Hostname: "open.test", Reason: "claimed by p/a, p/d and q/b; none of them holds its claim"}}
	if !reflect.DeepEqual(res.Excluded, wantEx) {
		t.Fatalf("excluded %+v, want %+v", res.Excluded, wantEx)
	}
	wantW := []Withheld{{Hostname: "held.test", Project: "p", Service: "a", Owner: "q/b"}, {Hostname: "held.test", Project: "p", Service: "c", Owner: "q/b"}}
	if !reflect.DeepEqual(res.Withheld, wantW) {
		t.Fatalf("withheld %+v, want %+v", res.Withheld, wantW)
	}
	tb, err := Native{}.Compile(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	tb.Routes = append(tb.Routes, abiroutes.Route{Hostname: "open.test", Project: "p", Service: "a"}) // as a careless compiler might
	if err := res.Enforce(&tb); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range tb.Routes {
		got[r.Hostname] = r.Project + "/" + r.Service
	}
	if w := map[string]string{"free.test": "p/c", "held.test": "q/b", "b.test": "q/b"}; !reflect.DeepEqual(got, w) || !reflect.DeepEqual(tb.Excluded, wantEx) {
		t.Fatalf("enforced routes %v excluded %+v; want %v", got, tb.Excluded, w)
	}
	// The unresolved input routes held.test for p/a, which sorts first: the
	// table is refused.
	tb, err = Native{}.Compile(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Enforce(&tb); !errors.Is(err, ErrClaimBroken) || !strings.Contains(err.Error(), "hostname held.test is held by q/b but routed to p/a") {
		t.Fatalf("enforcing a table that routes a withheld declaration: %v", err)
	}
}

// hijacker is a route compiler written against the ABI that compiles as
// Native does, then hands hostname to service to (project/name), with to's
// upstreams, or keeps the holder's name and swaps in to's upstreams alone.
type hijacker struct {
	hostname, project, name string
	keepName                bool
}

func (h hijacker) Compile(ctx context.Context, in Input) (abiroutes.Table, error) {
	t, err := Native{}.Compile(ctx, in)
	if err != nil {
		return t, err
	}
	var to abiroutes.Route
	for _, r := range t.Routes {
		if r.Project == h.project && r.Service == h.name {
			to = r
		}
	}
	for i, r := range t.Routes {
		if r.Hostname != h.hostname {
			continue
		}
		t.Routes[i].Upstreams = to.Upstreams
		if !h.keepName {
			t.Routes[i].Project, t.Routes[i].Service = to.Project, to.Service
		}
	}
	return t, nil
}

// TestEnforceRefusesAHeldHostnameRoutedElsewhere: with api holding
// api.localhost, a compiler that routes it to web (by name, or by web's
// upstreams under api's name) has its whole table refused, naming the
// hostname; so does one that hands a hostname its one declarer holds without
// a claim. A compiler that routes api at its node's address and port, which
// the input offers, is accepted (docs/routes.md section 2).
func TestEnforceRefusesAHeldHostnameRoutedElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := Input{
		Services: []Service{
			{ID: "svc_api", Project: "default", Name: "api", Domains: []string{"api.localhost"}},
			{ID: "svc_web", Project: "default", Name: "web", Domains: []string{"web.localhost"}},
		},
		Workloads: []Workload{
			{ID: "wl_api", ServiceID: "svc_api", NodeID: "nod_1", NodeAddress: "192.0.2.1", Address: "10.0.0.1:8080", ObservedStatus: "running", Health: "passing"},
			{ID: "wl_web", ServiceID: "svc_web", NodeID: "nod_1", NodeAddress: "192.0.2.1", Address: "10.0.0.2:8080", ObservedStatus: "running", Health: "passing"},
		},
	}
	for _, tc := range []struct {
		name   string
		claims Claims
		c      Compiler
		want   string // "" accepts the table
	}{
		{"native", Claims{"api.localhost": "svc_api"}, Native{}, ""},
		{"claimed, to web", Claims{"api.localhost": "svc_api"}, hijacker{hostname: "api.localhost", project: "default", name: "web"},
			"hostname api.localhost is held by default/api but routed to default/web"},
		{"claimed, web's upstreams", Claims{"api.localhost": "svc_api"}, hijacker{hostname: "api.localhost", project: "default", name: "web", keepName: true},
			"hostname api.localhost is held by default/api but routed to upstream wl_web at 10.0.0.2:8080"},
		{"declared without a claim", nil, hijacker{hostname: "web.localhost", project: "default", name: "api"},
			"hostname web.localhost is held by default/web but routed to default/api"},
		{"claimed, not declared", Claims{"old.localhost": "svc_api"}, addRoute{abiroutes.Route{Hostname: "old.localhost", Project: "default", Service: "web"}},
			"hostname old.localhost is held by default/api but routed to default/web"},
		{"node address", Claims{"api.localhost": "svc_api"}, addRoute{abiroutes.Route{Hostname: "api.localhost", Project: "default", Service: "api",
			Upstreams: []abiroutes.Upstream{{WorkloadID: "wl_api", Address: "192.0.2.1:8080"}}}}, ""},
	} {
		resolved, res := ResolveClaims(in, tc.claims)
		tb, err := tc.c.Compile(ctx, resolved)
		if err != nil {
			t.Fatal(err)
		}
		err = res.Enforce(&tb)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrClaimBroken) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Enforce answered %v, want %q", tc.name, err, tc.want)
		}
	}
}

// addRoute compiles as Native does, then puts route in place of the route
// for its hostname, or adds it.
type addRoute struct{ route abiroutes.Route }

func (a addRoute) Compile(ctx context.Context, in Input) (abiroutes.Table, error) {
	t, err := Native{}.Compile(ctx, in)
	if err != nil {
		return t, err
	}
	t.Routes = slices.DeleteFunc(t.Routes, func(r abiroutes.Route) bool { return r.Hostname == a.route.Hostname })
	t.Routes = append(t.Routes, a.route)
	t.Normalize()
	return t, nil
}
