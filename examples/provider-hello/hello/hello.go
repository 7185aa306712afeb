// Package hello is a minimal provider plugin for vendors to copy: it manages
// "hello.greeting" resources, each a file in its state directory.
//
// It shows the whole contract in little code: Describe with capabilities,
// configuration validation, a Plan that computes exactly what Apply will
// store, fencing and idempotency through sdk/guard, and NotFound after
// Delete. The conformance suite passes on it (see hello_test.go).
package hello

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// ResourceType is the one type this provider manages.
const ResourceType = "hello.greeting"

// Version is the plugin's own version.
const Version = "1.0.0"

// Greeting is the attributes of a hello.greeting resource.
type Greeting struct {
	Message string `json:"message"`        // required, at most Config.MaxMessageBytes
	Loud    bool   `json:"loud,omitempty"` // reports whether Message is stored in upper case
}

// Config is the plugin's configuration (its catalog entry's "config").
// MaxMessageBytes bounds a greeting's message, 1 to 200; zero means 200.
// ApplyDelayMS, 0 to 10000, makes every Apply wait that many milliseconds
// before it stores anything: a slow system to drive, for demonstrations and
// for tests that stop the plugin in the middle of an Apply.
type Config struct {
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	ApplyDelayMS    int `json:"apply_delay_ms,omitempty"`
}

// Schema is the JSON Schema of a greeting's attributes, declared in
// Describe so that berthd refuses a greeting that does not fit before it
// stores it (docs/plugins.md section 4.6).
const Schema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "message": {"type": "string", "minLength": 1, "maxLength": 200},
    "loud": {"type": "boolean"}
  },
  "required": ["message"],
  "additionalProperties": false
}`

// maxMessage is the largest message a greeting may hold.
const maxMessage = 200

// Provider keeps greetings as files under its state directory. Safe for
// concurrent use; every mutation runs under sdk/guard.Mutate.
type Provider struct {
	dir      string
	guards   *guard.Guards
	maxBytes atomic.Int64 // set by Configure; 0 means maxMessage
	delay    atomic.Int64 // set by Configure: Apply's wait, in milliseconds
	// trimOnApply is the deliberate fault of [WithTrimOnApply].
	trimOnApply bool
}

// Option changes a Provider made by [New].
type Option func(*Provider)

// WithTrimOnApply makes the provider break the Plan-equals-Apply rule
// (docs/plugins.md section 6) the way real providers do when the system they
// drive normalises a value: Apply (and so Read) stores a greeting's message
// with surrounding white space trimmed, while the Plan of a new greeting keeps
// it as given. Later Plans compare against the trimmed state and report no
// changes, so only the first Apply of a greeting shows the fault. It exists for
// examples/provider-lying, the twin that proves the conformance suite and the
// host catch such a plugin; a real provider never uses it.
func WithTrimOnApply() Option { return func(p *Provider) { p.trimOnApply = true } }

var (
	_ provider.Provider   = (*Provider)(nil)
	_ provider.Configurer = (*Provider)(nil)
)

// New returns a provider keeping its greetings and its fencing and
// idempotency records under stateDir (created 0700).
func New(stateDir string, opts ...Option) (*Provider, error) {
	if stateDir == "" {
		return nil, errors.New("hello: a state directory is required")
	}
	dir := filepath.Join(stateDir, "greetings")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	g, err := guard.Open(stateDir)
	if err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	p := &Provider{dir: dir, guards: g}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Describe implements provider.Provider. State is in files: DurableState.
func (p *Provider) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name: "hello", Version: Version, APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			ResourceTypes: []provider.ResourceType{{
				Name:   ResourceType,
				Schema: json.RawMessage(Schema),
				// Two valid states of one greeting: what `berth conformance
				// plugin` checks when it is given no --samples.
				ExampleID: "world",
				ExampleAttributes: []json.RawMessage{
					json.RawMessage(`{"message":"hello, world"}`),
					json.RawMessage(`{"message":"goodbye","loud":true}`),
				},
			}},
			DurableState: true,
		},
	}, nil
}

// ValidateConfig implements provider.Provider: the configuration must be a
// JSON object of [Config], with no other field.
func (p *Provider) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	if _, err := parseConfig(req.Config); err != nil {
		return &provider.ValidateConfigResponse{Problems: []string{err.Error()}}, nil
	}
	return &provider.ValidateConfigResponse{}, nil
}

// Configure implements provider.Configurer: it takes the configuration
// ValidateConfig accepted.
func (p *Provider) Configure(_ context.Context, req *provider.ConfigRequest) error {
	c, err := parseConfig(req.Config)
	if err != nil {
		return abierrors.Wrap(abierrors.ValidationFailed, "configure", err)
	}
	p.maxBytes.Store(int64(c.MaxMessageBytes))
	p.delay.Store(int64(c.ApplyDelayMS))
	return nil
}

func parseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	if len(bytes.TrimSpace(raw)) == 0 || bytes.TrimSpace(raw)[0] != '{' {
		return c, errors.New("config must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if c.MaxMessageBytes < 0 || c.MaxMessageBytes > maxMessage {
		return c, fmt.Errorf("config: max_message_bytes must be 1 to %d (0 for %d)", maxMessage, maxMessage)
	}
	if c.ApplyDelayMS < 0 || c.ApplyDelayMS > 10000 {
		return c, errors.New("config: apply_delay_ms must be 0 to 10000")
	}
	return c, nil
}

func (p *Provider) limit() int {
	if n := p.maxBytes.Load(); n > 0 {
		return int(n)
	}
	return maxMessage
}

var validID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// canonical checks r and returns it as Apply will store it.
func (p *Provider) canonical(r provider.Resource) (provider.Resource, error) {
	if r.Type != ResourceType {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, "hello manages only "+ResourceType)
	}
	if !validID.MatchString(r.ID) {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("id %q: want a DNS label", r.ID))
	}
	var g Greeting
	dec := json.NewDecoder(bytes.NewReader(r.Attributes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return provider.Resource{}, abierrors.Wrap(abierrors.ValidationFailed, "attributes do not decode", err)
	}
	if g.Message == "" || len(g.Message) > p.limit() {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("message: want 1 to %d bytes", p.limit()))
	}
	if g.Loud {
		g.Message = strings.ToUpper(g.Message)
	}
	raw, _ := json.Marshal(g) // plain struct: cannot fail
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}, nil
}

// Plan implements provider.Provider.
func (p *Provider) Plan(_ context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	planned, err := p.canonical(req.Desired)
	if err != nil {
		return nil, err
	}
	if p.trimOnApply && req.Current != nil {
		// The faulty twin hides its own normalisation once a state exists.
		if trimmed := p.normalise(planned); req.Current.Equal(trimmed) {
			return &provider.PlanResponse{Planned: trimmed}, nil
		}
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Apply implements provider.Provider: fenced, idempotent, and storing
// exactly the plan.
func (p *Provider) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Planned.Type+"/"+req.Planned.ID, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		if d := time.Duration(p.delay.Load()) * time.Millisecond; d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		state, err := p.Put(req.Planned)
		if err != nil {
			return nil, err
		}
		return &provider.ApplyResponse{State: state}, nil
	})
}

// Read implements provider.Provider.
func (p *Provider) Read(_ context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	if req.Type != ResourceType || !validID.MatchString(req.ID) {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	raw, err := os.ReadFile(filepath.Join(p.dir, req.ID+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, provider.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s/%s: %w", req.Type, req.ID, err)
	}
	return &provider.ReadResponse{State: provider.Resource{Type: req.Type, ID: req.ID, Attributes: raw}}, nil
}

// Delete implements provider.Provider; an absent greeting is success.
func (p *Provider) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Type+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if err := p.Remove(req.Type, req.ID); err != nil {
			return nil, err
		}
		return &provider.DeleteResponse{}, nil
	})
}

// Put stores a planned greeting (the effect of Apply, without the guards)
// and returns the stored state.
func (p *Provider) Put(planned provider.Resource) (provider.Resource, error) {
	state, err := p.canonical(planned)
	if err != nil {
		return provider.Resource{}, err
	}
	state = p.normalise(state)
	path := filepath.Join(p.dir, state.ID+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, state.Attributes, 0o600); err != nil {
		return provider.Resource{}, fmt.Errorf("store %s: %w", state.ID, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return provider.Resource{}, fmt.Errorf("store %s: %w", state.ID, err)
	}
	return state, nil
}

// Remove deletes a stored greeting (the effect of Delete, without the
// guards); an absent one is success.
func (p *Provider) Remove(typ, id string) error {
	if typ != ResourceType || !validID.MatchString(id) {
		return nil
	}
	if err := os.Remove(filepath.Join(p.dir, id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	return nil
}

// normalise returns a canonical greeting as Apply stores it: unchanged, except
// under [WithTrimOnApply].
func (p *Provider) normalise(r provider.Resource) provider.Resource {
	if !p.trimOnApply {
		return r
	}
	var g Greeting
	if json.Unmarshal(r.Attributes, &g) != nil {
		return r
	}
	g.Message = strings.TrimSpace(g.Message)
	raw, _ := json.Marshal(g) // plain struct: cannot fail
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}
}
