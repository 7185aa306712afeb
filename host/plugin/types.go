package plugin

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/berthhq/berth/abi/provider"
)

// ErrTypeDeclaredTwice is returned (wrapped) by [Types.Add] when a plugin
// declares a resource type another registered plugin already declares; the
// message names both plugins and the type (docs/plugins.md section 4.6).
var ErrTypeDeclaredTwice = errors.New("berth: resource type declared by two plugins")

// TypeEntry is one resource type and the provider plugin that serves it.
type TypeEntry struct {
	// Type is the type as the plugin's Describe declared it.
	Type provider.ResourceType
	// Plugin is the catalog name of the plugin that declared it.
	Plugin string
	// Role, when set, names the part of berthd that owns every resource of
	// the type ("gateway", "dns", "corestore"): such types are reached
	// through the registry like any other, but are written only by their
	// role, never declared by operators.
	Role string
	// Provider serves the type.
	Provider provider.Provider

	schema *jsonschema.Schema // compiled Type.Schema; nil when it declares none
}

// HasSchema reports whether the type declares a JSON Schema.
func (e TypeEntry) HasSchema() bool { return e.schema != nil }

// Validate checks attrs (a JSON document) against the type's schema and
// returns nil when it fits or the type declares no schema. Otherwise the
// error is a *SchemaError naming the first offending field.
func (e TypeEntry) Validate(attrs []byte) error {
	if e.schema == nil {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(attrs))
	if err != nil {
		return &SchemaError{Field: "spec", Reason: "not JSON: " + err.Error()}
	}
	err = e.schema.Validate(doc)
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		return schemaError(ve)
	}
	return err
}

// SchemaError is a spec that does not fit its type's schema: Field is the
// JSON pointer of the offending value under the spec ("spec/size", "spec"
// for the spec itself) and Reason what is wrong with it.
type SchemaError struct {
	Field  string
	Reason string
}

func (e *SchemaError) Error() string { return e.Field + ": " + e.Reason }

// schemaError reduces a validation error to its deepest first cause, the
// one that names a field rather than "does not validate".
func schemaError(ve *jsonschema.ValidationError) *SchemaError {
	leaf := ve
	for len(leaf.Causes) > 0 {
		leaf = leaf.Causes[0]
	}
	field := "spec"
	if len(leaf.InstanceLocation) > 0 {
		field += "/" + strings.Join(leaf.InstanceLocation, "/")
	}
	return &SchemaError{Field: field, Reason: leaf.ErrorKind.LocalizedString(message.NewPrinter(language.English))}
}

// Types maps each resource type to the one provider plugin that declares it:
// the registry through which berthd reaches every provider, built-in roles
// and vendors' plugins alike (docs/plugins.md section 4.6). Safe for
// concurrent use.
type Types struct {
	mu     sync.Mutex
	byType map[string]TypeEntry // mu must be held
}

// NewTypes returns an empty registry.
func NewTypes() *Types { return &Types{byType: map[string]TypeEntry{}} }

// Add registers every resource type p declared in its latest Describe under
// the plugin name; role is "" for a plugin no part of berthd owns. It
// registers nothing and returns an error wrapping [ErrTypeDeclaredTwice]
// when a type is already declared by another plugin (the message names both),
// and an error naming the plugin as buggy when a declared schema does not
// compile.
func (t *Types) Add(name, role string, p provider.Provider, declared []provider.ResourceType) error {
	entries := make([]TypeEntry, 0, len(declared))
	for _, rt := range declared {
		e := TypeEntry{Type: rt, Plugin: name, Role: role, Provider: p}
		if len(rt.Schema) > 0 {
			s, err := compileSchema(rt)
			if err != nil {
				return fmt.Errorf("plugin %s declares resource type %s with a schema that does not compile (this is a bug in plugin %s): %w", name, rt.Name, name, err)
			}
			e.schema = s
		}
		entries = append(entries, e)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range entries {
		if prev, ok := t.byType[e.Type.Name]; ok && prev.Plugin != name {
			return fmt.Errorf("%w: resource type %q is declared by both plugin %s and plugin %s; remove one of them from the catalog",
				ErrTypeDeclaredTwice, e.Type.Name, prev.Plugin, name)
		}
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if seen[e.Type.Name] {
			return fmt.Errorf("plugin %s declares resource type %q twice (this is a bug in plugin %s)", name, e.Type.Name, name)
		}
		seen[e.Type.Name] = true
	}
	for _, e := range entries {
		t.byType[e.Type.Name] = e
	}
	return nil
}

// AddProvider is [Types.Add] with the types p's latest Describe declared.
func (t *Types) AddProvider(role string, p *Provider) error {
	return t.Add(p.s.cfg.Name, role, p, p.Declared())
}

// Lookup returns the entry of type typ and whether one is registered.
func (t *Types) Lookup(typ string) (TypeEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byType[typ]
	return e, ok
}

// List returns every registered type, sorted by name.
func (t *Types) List() []TypeEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TypeEntry, 0, len(t.byType))
	for _, e := range t.byType {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b TypeEntry) int { return strings.Compare(a.Type.Name, b.Type.Name) })
	return out
}

// compileSchema compiles rt's schema under a URL of its own.
func compileSchema(rt provider.ResourceType) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(rt.Schema))
	if err != nil {
		return nil, err
	}
	url := "berth:///types/" + rt.Name + ".json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
}
