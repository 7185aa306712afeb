package routes

import (
	"context"
	"reflect"
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
	tb, err := Native{}.Compile(context.Background(), in) // the unresolved input, as a careless compiler might route it
	if err != nil {
		t.Fatal(err)
	}
	res.Enforce(&tb)
	got := map[string]string{}
	for _, r := range tb.Routes {
		got[r.Hostname] = r.Project + "/" + r.Service
	}
	if w := map[string]string{"free.test": "p/c", "b.test": "q/b"}; !reflect.DeepEqual(got, w) || !reflect.DeepEqual(tb.Excluded, wantEx) {
		t.Fatalf("enforced routes %v excluded %+v; want %v", got, tb.Excluded, w)
	}
}
