package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// runRoutes runs every case of s against the route compiler m.
func (s *Suite) runRoutes(ctx context.Context, m *hostwasm.Module) []CaseResult {
	var out []CaseResult
	for i, c := range s.Cases {
		name := c.Name
		if name == "" {
			name = fmt.Sprintf("case %d", i+1)
		}
		out = append(out, CaseResult{Name: name, Err: s.runRouteCase(ctx, m, c)})
	}
	return out
}

// runRouteCase compiles the case's input with [hostwasm.Module.CompileRoutes],
// as berthd does, so a table berthd would refuse fails the case, and
// compares the table with the routes expected.
func (s *Suite) runRouteCase(ctx context.Context, m *hostwasm.Module, c Case) error {
	switch {
	case s.Config != nil || c.Config != nil:
		return fmt.Errorf("a route compiler takes no config")
	case c.Expect.Decision != "" || c.Expect.Reasons != nil || c.Expect.Warnings != nil:
		return fmt.Errorf("expects a decision, but the module is a route compiler: expect routes or an error")
	case c.Expect.Routes == nil && c.Expect.Error == "":
		return fmt.Errorf("expects nothing: give expect.routes (the whole table, [] for none) or expect.error")
	}
	in, err := routesInput(c.Input)
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	want, err := expectedRoutes(c.Expect.Routes)
	if err != nil {
		return fmt.Errorf("expect.routes: %w", err)
	}
	got, err := m.CompileRoutes(ctx, in)
	if c.Expect.Error != "" {
		var ge *abiwasm.GuestError
		if err == nil || !asGuest(err, &ge) || ge.Code != c.Expect.Error {
			return fmt.Errorf("want error %q, got %d routes, %v", c.Expect.Error, len(got.Routes), err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	return compareRoutes(got.Routes, want)
}

// routesInput turns a case's input into what berthd sends a route compiler
// (docs/wasm-abi.md section 6.1): a field berthd never sends is an error
// naming it; services and workloads left out are empty lists, a service's
// domains left out an empty list, and both lists are sorted by id, as
// berthd sorts them.
func routesInput(raw map[string]any) (abiwasm.RoutesInput, error) {
	var in abiwasm.RoutesInput
	b, err := json.Marshal(raw)
	if err != nil {
		return in, fmt.Errorf("encode: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("not a route compiler's input (schema/routes_input.json): %w", err)
	}
	if in.Services == nil {
		in.Services = []abiwasm.RouteService{}
	}
	if in.Workloads == nil {
		in.Workloads = []abiwasm.RouteWorkload{}
	}
	for i := range in.Services {
		if in.Services[i].Domains == nil {
			in.Services[i].Domains = []string{}
		}
	}
	slices.SortStableFunc(in.Services, func(a, b abiwasm.RouteService) int { return strings.Compare(a.ID, b.ID) })
	slices.SortStableFunc(in.Workloads, func(a, b abiwasm.RouteWorkload) int { return strings.Compare(a.ID, b.ID) })
	return in, nil
}

// expectedRoutes decodes a case's expected routes, refusing fields a route
// does not have, normalized as the host normalizes a compiled table.
func expectedRoutes(raw []any) ([]abiroutes.Route, error) {
	if raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	var rs []abiroutes.Route
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rs); err != nil {
		return nil, fmt.Errorf("not a list of routes: %w", err)
	}
	t := abiroutes.Table{Routes: rs}
	t.Normalize()
	return t.Routes, nil
}

// compareRoutes reports the first route whose value differs between got
// and want (both normalized), one that is missing, or one not expected;
// routes are told apart by hostname and match conditions (path prefix,
// headers; docs/routes.md section 3). An empty list and a missing one are
// the same.
func compareRoutes(got, want []abiroutes.Route) error {
	enc := func(r abiroutes.Route) string {
		if r.Upstreams == nil {
			r.Upstreams = []abiroutes.Upstream{}
		}
		if len(r.AllowSources) == 0 {
			r.AllowSources = nil
		}
		if len(r.Headers) == 0 {
			r.Headers = nil
		}
		b, _ := json.Marshal(r) // plain struct: cannot fail
		return string(b)
	}
	byKey := make(map[string]abiroutes.Route, len(got))
	for _, r := range got {
		byKey[routeLabel(r)] = r
	}
	expected := make(map[string]bool, len(want))
	var problems []string
	for _, w := range want {
		k := routeLabel(w)
		expected[k] = true
		g, ok := byKey[k]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("route %s: missing, want %s", k, enc(w)))
		case enc(g) != enc(w):
			problems = append(problems, fmt.Sprintf("route %s: got %s, want %s", k, enc(g), enc(w)))
		}
	}
	for _, g := range got {
		if k := routeLabel(g); !expected[k] {
			problems = append(problems, fmt.Sprintf("route %s: not expected, got %s", k, enc(g)))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// routeLabel names a route by its hostname and match conditions:
// "shop.example.com", "shop.example.com/api", "shop.example.com/api
// [X-Env: canary]".
func routeLabel(r abiroutes.Route) string {
	l := r.Hostname + r.PathPrefix
	if len(r.Headers) > 0 {
		hs := slices.Clone(r.Headers)
		slices.SortFunc(hs, abiroutes.CompareHeaders)
		parts := make([]string, len(hs))
		for i, h := range hs {
			parts[i] = strings.ToLower(h.Name) + ": " + h.Value
		}
		l += " [" + strings.Join(parts, ", ") + "]"
	}
	return l
}
