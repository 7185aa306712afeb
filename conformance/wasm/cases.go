package wasm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// CasesFile is the name of the declarative test file in a policy directory.
const CasesFile = "policy_test.yaml"

// Suite is a policy_test.yaml file (docs/wasm-abi.md section 8): the module
// under test (a policy or a route compiler), a binding configuration shared
// by a policy's cases, and the cases.
type Suite struct {
	// Module is the .wasm file, relative to the YAML file's directory.
	Module string `yaml:"module"`
	Config any    `yaml:"config"`
	Cases  []Case `yaml:"cases"`
	// Exact, when set, makes every case's input hold every field berthd
	// sends (as recorded inputs do); otherwise fields may be left out. In
	// both modes a field berthd never sends fails the case, naming its path.
	Exact bool `yaml:"exact"`
}

// Case is one request and what is expected of it. For a policy, Input is a
// PolicyInput written in YAML; its schema_version defaults to
// abiwasm.InputSchemaVersion, its actor to {kind: token}, its config to the
// case's or the suite's Config. Before the module sees it, the input is
// validated against schema/policy_input.json ([InputSchema]). For a route
// compiler, Input is a RoutesInput (services and workloads) and Expect.Routes
// the table expected.
type Case struct {
	Name   string         `yaml:"name"`
	Input  map[string]any `yaml:"input"`
	Config any            `yaml:"config"`
	Expect Expect         `yaml:"expect"`
	// Exact holds this case's input to every field berthd sends, as
	// Suite.Exact does for all; recorded cases set it.
	Exact bool `yaml:"exact"`
	// Recorded is the input's SHA-256 when the case was recorded from a
	// berthd's decision (`berth policy test --record`); a decision already
	// recorded is not added again.
	Recorded string `yaml:"recorded"`
}

// Expect is what a case expects. For a policy, Decision is "allow" or
// "deny"; each of Reasons and Warnings must be a substring of some reason or
// warning given. For a route compiler, Routes is the whole table expected,
// routes as in abi/routes (their JSON field names), in any order. Error,
// instead of a decision or routes, expects the error convention with that
// code.
type Expect struct {
	Decision string   `yaml:"decision"`
	Reasons  []string `yaml:"reasons"`
	Warnings []string `yaml:"warnings"`
	Routes   []any    `yaml:"routes"`
	Error    string   `yaml:"error"`
}

// CaseResult is the outcome of one case; Err is nil when it passed.
type CaseResult struct {
	Name string
	Err  error
}

// LoadSuite reads dir/policy_test.yaml. The module path it returns is
// moduleOverride when not empty, else the file's module field resolved
// against dir, else dir/policy.wasm.
func LoadSuite(dir, moduleOverride string) (*Suite, string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, CasesFile))
	if err != nil {
		return nil, "", fmt.Errorf("read test cases: %w", err)
	}
	var s Suite
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, "", fmt.Errorf("parse %s: %w", filepath.Join(dir, CasesFile), err)
	}
	mod := moduleOverride
	switch {
	case mod != "":
	case s.Module != "":
		mod = filepath.Join(dir, s.Module)
	default:
		mod = filepath.Join(dir, "policy.wasm")
	}
	return &s, mod, nil
}

// Run evaluates every case against m, a policy or a route compiler (by
// its metadata's kind). A policy case whose input does not follow the
// schema fails without being evaluated (its error wraps ErrInputSchema); so
// does a route compiler's case whose input is not a routes input (see
// [routesInput]).
func (s *Suite) Run(ctx context.Context, m *hostwasm.Module) []CaseResult {
	if m.Metadata().Kind == abiwasm.KindRoutes {
		return s.runRoutes(ctx, m)
	}
	schema, err := NewInputSchema()
	var out []CaseResult
	for i, c := range s.Cases {
		name := c.Name
		if name == "" {
			name = fmt.Sprintf("case %d", i+1)
		}
		if err != nil {
			out = append(out, CaseResult{Name: name, Err: err})
			continue
		}
		out = append(out, CaseResult{Name: name, Err: s.runCase(ctx, m, schema, c)})
	}
	return out
}

func (s *Suite) runCase(ctx context.Context, m *hostwasm.Module, schema *InputSchema, c Case) error {
	in := map[string]any{"schema_version": abiwasm.InputSchemaVersion, "actor": map[string]any{"kind": "token"},
		"object": nil, "old_object": nil, "config": s.Config}
	if c.Config != nil {
		in["config"] = c.Config
	}
	for k, v := range c.Input {
		in[k] = v
	}
	raw, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode input: %w", err)
	}
	if c.Expect.Routes != nil {
		return fmt.Errorf("expects routes, but the module is a policy: expect a decision or an error")
	}
	exact := s.Exact || c.Exact
	if c.Expect.Error == "" || exact {
		// A case expecting the error convention may feed the module what
		// berthd never would (an unknown hook); every other input must be
		// one berthd could send.
		if err := schema.Validate(raw, !exact); err != nil {
			return fmt.Errorf("input: %w", err)
		}
	}
	out, err := m.EvaluateJSON(ctx, raw)
	if c.Expect.Error != "" {
		var ge *abiwasm.GuestError
		if err == nil || !asGuest(err, &ge) || ge.Code != c.Expect.Error {
			return fmt.Errorf("want error %q, got %+v, %v", c.Expect.Error, out, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if string(out.Decision) != c.Expect.Decision {
		return fmt.Errorf("decision %q, want %q (reasons: %s)", out.Decision, c.Expect.Decision, strings.Join(out.Reasons, "; "))
	}
	if err := contains("reason", out.Reasons, c.Expect.Reasons); err != nil {
		return err
	}
	return contains("warning", out.Warnings, c.Expect.Warnings)
}

func contains(what string, got, want []string) error {
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || strings.Contains(g, w)
		}
		if !found {
			return fmt.Errorf("no %s contains %q; got %q", what, w, got)
		}
	}
	return nil
}
