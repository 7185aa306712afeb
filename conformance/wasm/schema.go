package wasm

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// policyInputURL is where the compiler files schema/policy_input.json.
const policyInputURL = "https://berth.dev/schema/wasm/v1/policy_input.json"

// InputSchema checks policy inputs against schema/policy_input.json of
// abi/wasm (docs/wasm-abi.md section 5.2), in one of two modes: exact, where
// an input must be what berthd sends (every field present), and partial, for
// hand-written test cases, where fields may be left out but every field
// given must exist at its place and have its type. Objects are closed in
// both: a field the server never sends is an error naming its path. Safe
// for concurrent use.
type InputSchema struct {
	exact, partial *jsonschema.Schema
}

// NewInputSchema compiles the published schema in both modes. An error
// means the embedded schema is broken: a bug in this build.
func NewInputSchema() (*InputSchema, error) {
	raw, err := abiwasm.Schemas.ReadFile("schema/policy_input.json")
	if err != nil {
		return nil, fmt.Errorf("read policy input schema: %w", err)
	}
	compile := func(partial bool) (*jsonschema.Schema, error) {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("parse policy input schema: %w", err)
		}
		if partial {
			dropRequired(doc, false)
			doc.(map[string]any)["required"] = []any{"hook"}
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource(policyInputURL, doc); err != nil {
			return nil, fmt.Errorf("load policy input schema: %w", err)
		}
		s, err := c.Compile(policyInputURL)
		if err != nil {
			return nil, fmt.Errorf("compile policy input schema: %w", err)
		}
		return s, nil
	}
	var s InputSchema
	if s.exact, err = compile(false); err != nil {
		return nil, err
	}
	if s.partial, err = compile(true); err != nil {
		return nil, err
	}
	return &s, nil
}

// dropRequired removes every "required" keyword of doc except those inside
// an "if" (which choose the branch of a hook, not what must be present).
func dropRequired(doc any, inIf bool) {
	switch v := doc.(type) {
	case map[string]any:
		if !inIf {
			delete(v, "required")
		}
		for k, sub := range v {
			dropRequired(sub, inIf || k == "if")
		}
	case []any:
		for _, sub := range v {
			dropRequired(sub, inIf)
		}
	}
}

// InputError is an input that does not follow the schema: one problem per
// offending place, each "at /json/pointer: what is wrong", sorted.
type InputError struct {
	Problems []string
}

func (e *InputError) Error() string {
	return "the input does not follow schema/policy_input.json " + abiwasm.InputSchemaVersion + ": " + strings.Join(e.Problems, "; ")
}

// ErrInputSchema is matched (errors.Is) by every *InputError.
var ErrInputSchema = errors.New("berth: policy input does not follow its schema")

// Is makes errors.Is(err, ErrInputSchema) hold.
func (e *InputError) Is(target error) bool { return target == ErrInputSchema }

// Validate checks one input, raw JSON. partial allows fields to be left out
// (test cases); otherwise every field berthd sends must be present. The
// error is an *InputError for an input that breaks the schema, another error
// for raw that is not JSON.
func (s *InputSchema) Validate(raw []byte, partial bool) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("policy input is not JSON: %w", err)
	}
	sch := s.exact
	if partial {
		sch = s.partial
	}
	err = sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("validate policy input: %w", err)
	}
	p := message.NewPrinter(language.English)
	seen := map[string]bool{}
	var probs []string
	collect(ve, p, func(s string) {
		if !seen[s] {
			seen[s] = true
			probs = append(probs, s)
		}
	})
	sort.Strings(probs)
	return &InputError{Problems: probs}
}

// collect reports the leaves of e. Under anyOf and oneOf, a branch that
// fails only by its type (the null of "null or a service") is left out when
// another branch says more.
func collect(e *jsonschema.ValidationError, p *message.Printer, add func(string)) {
	if len(e.Causes) == 0 {
		at := "/" + strings.Join(e.InstanceLocation, "/")
		switch k := e.ErrorKind.(type) {
		case *kind.AdditionalProperties:
			for _, f := range k.Properties {
				add(fmt.Sprintf("at %s: unknown field %q (the server never sends it)", at, f))
			}
		default:
			add(fmt.Sprintf("at %s: %s", at, e.ErrorKind.LocalizedString(p)))
		}
		return
	}
	causes := e.Causes
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		var keep []*jsonschema.ValidationError
		for _, c := range causes {
			if _, typeOnly := c.ErrorKind.(*kind.Type); !(typeOnly && len(c.Causes) == 0) {
				keep = append(keep, c)
			}
		}
		if len(keep) > 0 {
			causes = keep
		}
	}
	for _, c := range causes {
		collect(c, p, add)
	}
}
