package wasm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/internal/fillall"
)

// wantRoutesOutput is what HandleRoutes answered before routesjson.go:
// json.Marshal of the table with the digest the host recomputes.
func wantRoutesOutput(t *testing.T, rs []Route) []byte {
	t.Helper()
	tb := routes.Table{Routes: rs}
	tb.Normalize()
	if tb.Routes == nil {
		tb.Routes = []Route{}
	}
	b, err := json.Marshal(abiwasm.RoutesOutput{Routes: tb.Routes, SHA256: tb.Digest()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEncodeRoutesOutputCoversEveryField: with every field of Route set
// (and with empty upstreams, allow lists and timeouts), HandleRoutes' output
// is json.Marshal's with the digest the host recomputes. A field added to
// Route without the encoder fails here.
func TestEncodeRoutesOutputCoversEveryField(t *testing.T) {
	seed := 0
	rs := make([]Route, 3)
	for i := range rs {
		fillall.Fill(t, reflect.ValueOf(&rs[i]).Elem(), &seed)
	}
	rs[1].Upstreams, rs[1].AllowSources, rs[1].Timeouts = nil, nil, routes.Timeouts{IdleMS: 5}
	rs[2].Upstreams, rs[2].Timeouts = []Upstream{}, routes.Timeouts{}
	for _, set := range [][]Route{rs, rs[:1], {}, nil} {
		want := wantRoutesOutput(t, append([]Route(nil), set...))
		c := append([]Route(nil), set...)
		normalizeRoutes(c)
		if enc := encodeRoutesOutput(c); !bytes.Equal(enc, want) {
			t.Fatalf("encode %d routes\n got %s\nwant %s", len(set), enc, want)
		}
	}
}

// TestHandleRoutesRefusesBadInput: inputs encoding/json refuses are
// refused, with the stable error the bad input convention reports.
func TestHandleRoutesRefusesBadInput(t *testing.T) {
	for _, bad := range []string{
		``, `[]`, `"x"`, `{"services":`, `{"services":{}}`, `{"workloads":[{"port":"80"}]}`,
		`{"workloads":[{"port":1.5}]}`, `{"workloads":[{"port":1e3}]}`, `{"workloads":[{"port":99999999999999999999}]}`,
		`{"services":[{"id":7}]}`, `{"services":[{"domains":"a"}]}`, `{"services":[1]}`, `{} {}`,
		"{\"services\":[{\"id\":\"a\x01\"}]}", `{"services":[{"id":"\x"}]}`, `{"services":[{"id":"\u12"}]}`,
		`{"x":01}`, `{"x":[1,]}`, `{'x':1}`, "\xff",
	} {
		if json.Unmarshal([]byte(bad), new(abiwasm.RoutesInput)) == nil {
			t.Fatalf("encoding/json accepts %q: not a refusal case", bad)
		}
		out := HandleRoutes([]byte(bad), func(abiwasm.RoutesInput) ([]Route, error) { return nil, nil })
		var o abiwasm.RoutesOutput
		if err := json.Unmarshal(out, &o); err != nil || o.Error == nil || o.Error.Code != abiwasm.ErrCodeBadInput {
			t.Errorf("input %q: answer %s, want the %s error", bad, out, abiwasm.ErrCodeBadInput)
		}
	}
}

// TestHandleRoutesMatchesEncodingJSON: on seeded random inputs (bounded
// count) HandleRoutes answers byte for byte what the encoding/json path
// answered. (Hostnames and workload ids are unique, as in a valid table:
// the old path's unstable sort ordered duplicates arbitrarily.)
func TestHandleRoutesMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 1))
	fn := func(in abiwasm.RoutesInput) ([]Route, error) {
		var rs []Route
		seen := map[string]bool{}
		for _, s := range in.Services {
			for _, d := range s.Domains {
				if seen[d] {
					continue
				}
				seen[d] = true
				r := Route{Hostname: d, Project: s.Project, Service: s.Name, TLSMode: s.TLSMode, AllowSources: s.AllowSources}
				for _, w := range in.Workloads {
					if w.ServiceID == s.ID {
						r.Upstreams = append(r.Upstreams, Upstream{WorkloadID: w.ID, Address: w.Address, Healthy: w.Health == "passing"})
					}
				}
				rs = append(rs, r)
			}
		}
		return rs, nil
	}
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for round := range 200 {
		var in abiwasm.RoutesInput
		for i := range rng.IntN(20) {
			s := abiwasm.RouteService{ID: fmt.Sprintf("svc_%d", rng.IntN(30)), Project: pick("p", "q", "ü&<"), Name: fmt.Sprintf("s%d", i),
				TLSMode: pick("", "acme", "none")}
			for range rng.IntN(3) {
				s.Domains = append(s.Domains, fmt.Sprintf("h%d.example.com", rng.IntN(1000)))
			}
			if rng.IntN(4) == 0 {
				s.AllowSources = []string{"10.0.0.0/8"}
			}
			in.Services = append(in.Services, s)
		}
		for i := range rng.IntN(40) {
			in.Workloads = append(in.Workloads, abiwasm.RouteWorkload{ID: fmt.Sprintf("wl_%d_%d", rng.IntN(100), i), ServiceID: fmt.Sprintf("svc_%d", rng.IntN(30)),
				NodeAddress: "10.0.0.1", Port: rng.IntN(65536), Address: fmt.Sprintf("10.0.0.1:%d", rng.IntN(65536)), Health: pick("passing", "failing", "")})
		}
		raw, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var viaJSON abiwasm.RoutesInput
		if err := json.Unmarshal(raw, &viaJSON); err != nil {
			t.Fatal(err)
		}
		rs, _ := fn(viaJSON)
		want := wantRoutesOutput(t, rs)
		if got := HandleRoutes(raw, fn); !bytes.Equal(got, want) {
			t.Fatalf("round %d: input %s\n got %s\nwant %s", round, raw, got, want)
		}
	}
}

// TestNormalizeRoutesAsTable: normalizeRoutes orders routes and upstreams
// exactly as routes.Table.Normalize does, also among equal keys (seeded
// random tables with few distinct hostnames, match conditions and workload
// ids).
func TestNormalizeRoutesAsTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 2))
	for round := range 200 {
		rs := make([]Route, rng.IntN(60))
		for i := range rs {
			rs[i] = Route{Hostname: fmt.Sprintf("h%d", rng.IntN(8)), Service: fmt.Sprintf("s%d", i)}
			if rng.IntN(3) == 0 {
				rs[i].PathPrefix = []string{"/a", "/b", "/a/b"}[rng.IntN(3)]
			}
			for range rng.IntN(3) {
				rs[i].Headers = append(rs[i].Headers, HeaderMatch{Name: []string{"X-A", "x-a", "X-B"}[rng.IntN(3)], Value: fmt.Sprint(rng.IntN(2))})
			}
			for j := range rng.IntN(30) {
				rs[i].Upstreams = append(rs[i].Upstreams, Upstream{WorkloadID: fmt.Sprintf("w%d", rng.IntN(5)), Address: fmt.Sprintf("a:%d", j)})
			}
		}
		want := routes.Table{Routes: clone(rs)}
		want.Normalize()
		got := clone(rs)
		normalizeRoutes(got)
		if !reflect.DeepEqual(got, want.Routes) {
			t.Fatalf("round %d: normalizeRoutes and Table.Normalize order differently", round)
		}
	}
}

func clone(rs []Route) []Route {
	out := make([]Route, len(rs))
	for i, r := range rs {
		out[i] = r
		out[i].Upstreams = append([]Upstream(nil), r.Upstreams...)
		out[i].Headers = append([]HeaderMatch(nil), r.Headers...)
	}
	return out
}

// TestRouteTypesNeedOneImport: a route compiler builds every field of a
// [Route] from this package's names, its timeouts included, without
// importing abi/routes.
func TestRouteTypesNeedOneImport(t *testing.T) {
	var tm Timeouts = routes.Timeouts{IdleMS: 5}
	r := Route{Hostname: "a.example.com", Upstreams: []Upstream{{WorkloadID: "w", Address: "127.0.0.1:1"}}, Timeouts: tm,
		PathPrefix: "/api", StripPrefix: true, Headers: []HeaderMatch{{Name: "X-Env", Value: "canary"}}}
	if err := (routes.Table{Routes: []Route{r}}).Validate(); err != nil {
		t.Fatalf("a route built from sdk/wasm's names: %v", err)
	}
}
