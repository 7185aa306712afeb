// Package accounts is a second example provider plugin: it manages
// "accounts.user" resources, each a login whose password comes from a secret
// and whose access token is an output, kept as a file in its state directory.
//
// Beside examples/provider-hello it shows what a vendor's type with
// credentials looks like: a spec field that takes a secret reference
// ("password": "secret:NAME", opened by berthd and sent only to the plugin),
// and Apply outputs (the token) that berthd publishes as a secret of the
// project (docs/resources.md sections 7 and 8). The conformance suite passes on
// it (see accounts_test.go).
package accounts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// ResourceType is the one type this provider manages.
const ResourceType = "accounts.user"

// Version is the plugin's own version.
const Version = "1.0.0"

// User is the attributes of an accounts.user resource. Password is the
// login's password: a real system keeps a hash, this example keeps it as
// given so that a host that stored or showed it would be caught.
type User struct {
	Login    string   `json:"login"`
	Password string   `json:"password"`
	Groups   []string `json:"groups,omitempty"`
}

// Schema is the JSON Schema of a user's attributes, declared in Describe.
// password is any string of 1 to 200 bytes: berthd checks the spec as
// declared, where it is usually "secret:NAME".
const Schema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "login": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,31}$"},
    "password": {"type": "string", "minLength": 1, "maxLength": 200},
    "groups": {"type": "array", "items": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,31}$"}, "maxItems": 16}
  },
  "required": ["login", "password"],
  "additionalProperties": false
}`

// Provider keeps users as files under its state directory. Safe for
// concurrent use; every mutation runs under sdk/guard.Mutate.
type Provider struct {
	dir    string
	guards *guard.Guards
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider keeping its users and its fencing and idempotency
// records under stateDir (created 0700).
func New(stateDir string) (*Provider, error) {
	if stateDir == "" {
		return nil, errors.New("accounts: a state directory is required")
	}
	dir := filepath.Join(stateDir, "users")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	g, err := guard.Open(stateDir)
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	return &Provider{dir: dir, guards: g}, nil
}

// Describe implements provider.Provider.
func (p *Provider) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name: "accounts", Version: Version, APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			ResourceTypes: []provider.ResourceType{{
				Name:      ResourceType,
				Schema:    json.RawMessage(Schema),
				ExampleID: "alice",
				ExampleAttributes: []json.RawMessage{
					json.RawMessage(`{"login":"alice","password":"first"}`),
					json.RawMessage(`{"groups":["ops"],"login":"alice","password":"second"}`),
				},
			}},
			DurableState: true,
		},
	}, nil
}

// ValidateConfig implements provider.Provider: the configuration must be
// an empty JSON object (or absent).
func (p *Provider) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	if c := bytes.TrimSpace(req.Config); len(c) > 0 && !bytes.Equal(c, []byte("{}")) && !bytes.Equal(c, []byte("null")) {
		return &provider.ValidateConfigResponse{Problems: []string{"accounts takes no configuration"}}, nil
	}
	return &provider.ValidateConfigResponse{}, nil
}

var (
	validID    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	validLogin = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
)

// canonical checks r and returns it as Apply stores it. Error messages name
// fields, never the password.
func canonical(r provider.Resource) (provider.Resource, error) {
	if r.Type != ResourceType {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, "accounts manages only "+ResourceType)
	}
	if !validID.MatchString(r.ID) {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("id %q: want a DNS label", r.ID))
	}
	var u User
	dec := json.NewDecoder(bytes.NewReader(r.Attributes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, "attributes do not decode as a user")
	}
	if !validLogin.MatchString(u.Login) {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, "login: want a lower-case identifier")
	}
	if u.Password == "" || len(u.Password) > 200 {
		return provider.Resource{}, abierrors.New(abierrors.ValidationFailed, "password: want 1 to 200 bytes")
	}
	raw, _ := json.Marshal(u) // plain struct: cannot fail
	return provider.Resource{Type: r.Type, ID: r.ID, Attributes: raw}, nil
}

// Token is the access token of a user: derived from its login and password,
// so the same user always has the same token and a new password a new one.
func Token(u User) string {
	sum := sha256.Sum256([]byte("accounts.token.v1\x00" + u.Login + "\x00" + u.Password))
	return "acct_" + hex.EncodeToString(sum[:16])
}

// Plan implements provider.Provider.
func (p *Provider) Plan(_ context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	planned, err := canonical(req.Desired)
	if err != nil {
		return nil, err
	}
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// Apply implements provider.Provider: fenced, idempotent, storing exactly
// the plan, and returning the user's token as the output TOKEN.
func (p *Provider) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Planned.Type+"/"+req.Planned.ID, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		state, err := canonical(req.Planned)
		if err != nil {
			return nil, err
		}
		var u User
		_ = json.Unmarshal(state.Attributes, &u) // canonical decoded it
		path := filepath.Join(p.dir, state.ID+".json")
		if err := os.WriteFile(path+".tmp", state.Attributes, 0o600); err != nil {
			return nil, fmt.Errorf("store %s: %w", state.ID, err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return nil, fmt.Errorf("store %s: %w", state.ID, err)
		}
		outs, _ := json.Marshal(map[string]string{"TOKEN": Token(u)}) // plain map: cannot fail
		return &provider.ApplyResponse{State: state, Credentials: outs}, nil
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

// Delete implements provider.Provider; an absent user is success.
func (p *Provider) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	return guard.Mutate(ctx, p.guards, req.Type+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		if req.Type == ResourceType && validID.MatchString(req.ID) {
			if err := os.Remove(filepath.Join(p.dir, req.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("remove %s: %w", req.ID, err)
			}
		}
		return &provider.DeleteResponse{}, nil
	})
}
