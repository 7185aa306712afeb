package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Session is a human session opened by [Client.Login] (docs/api.md section 9.2); Token is
// shown once.
type Session struct {
	Token      string    `json:"token"`
	User       string    `json:"user"`
	Generation int64     `json:"generation"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Grant is a role within one project.
type Grant struct {
	Project string `json:"project"`
	Role    string `json:"role"`
}

// User is a user as the API shows it: never a password (docs/api.md section 9.1).
type User struct {
	Name            string    `json:"name"`
	ID              string    `json:"id"`
	Kind            string    `json:"kind"`
	Roles           []string  `json:"roles"`
	Grants          []Grant   `json:"grants,omitempty"`
	Generation      int64     `json:"generation"`
	PasswordEnabled bool      `json:"password_enabled"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// NewUser is the body of [Client.CreateUser]. Kind is "human" (default) or "machine".
type NewUser struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind,omitempty"`
	Roles    []string `json:"roles,omitempty"`
	Grants   []Grant  `json:"grants,omitempty"`
	Password string   `json:"password,omitempty"`
}

// MachineToken is a token as a list shows it: never the token (docs/api.md section 9.3).
type MachineToken struct {
	Name      string     `json:"name"`
	ID        string     `json:"id"`
	Kind      string     `json:"kind"`
	Owner     string     `json:"owner,omitempty"`
	Scopes    []string   `json:"scopes"`
	Project   string     `json:"project,omitempty"`
	Service   string     `json:"service,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  *time.Time `json:"last_used_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// NewMachineToken is the body of [Client.CreateToken]. ExpiresIn is rounded down to seconds;
// 0 means the server's default (90 days).
type NewMachineToken struct {
	Name      string
	Scopes    []string
	Project   string
	Service   string
	ExpiresIn time.Duration
	Owner     string
}

// IssuedToken is a token shown once, with its listing.
type IssuedToken struct {
	Token string       `json:"token"`
	Info  MachineToken `json:"info"`
	// AdminTokenFile is, after a rotation of the bootstrap token, the file on the berthd that
	// served it where the new secret was also written (its DATA/admin-token); empty when no
	// file was rewritten.
	AdminTokenFile string `json:"admin_token_file,omitempty"`
}

// Login opens a human session (POST /login); ttl 0 means the server's default of 12 h. It
// sends no bearer. Errors: an *APIError with code unauthenticated for any wrong credential.
func (c *Client) Login(ctx context.Context, name, password string, ttl time.Duration) (*Session, error) {
	var out Session
	in := map[string]any{"name": name, "password": password, "ttl_seconds": int64(ttl / time.Second)}
	if err := c.doJSON(ctx, http.MethodPost, "/login", in, false, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Logout ends the client's session (POST /logout).
func (c *Client) Logout(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/logout", nil, nil, "", true, nil)
}

// Whoami returns the caller's principal as the server sees it (GET /whoami).
func (c *Client) Whoami(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	if err := c.do(ctx, http.MethodGet, "/whoami", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateUser creates a user (POST /users; admin, recent login).
func (c *Client) CreateUser(ctx context.Context, u NewUser) (*User, error) {
	var out User
	if err := c.doJSON(ctx, http.MethodPost, "/users", u, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListUsers lists users (GET /users; admin).
func (c *Client) ListUsers(ctx context.Context) ([]User, error) {
	var out struct {
		Users []User `json:"users"`
	}
	if err := c.do(ctx, http.MethodGet, "/users", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Users, nil
}

// ChangeCredential applies op ("rotate_password", "revoke_password" or "revoke_sessions") to
// the user's credential (POST /users/{user}/credential); expectedGeneration 0 takes the
// current one. It returns the user with its new generation.
func (c *Client) ChangeCredential(ctx context.Context, user, op string, expectedGeneration int64, password string) (*User, error) {
	var out User
	in := map[string]any{"op": op, "expected_generation": expectedGeneration, "password": password}
	if err := c.doJSON(ctx, http.MethodPost, "/users/"+url.PathEscape(user)+"/credential", in, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateToken creates a named machine token (POST /tokens) and returns it once.
func (c *Client) CreateToken(ctx context.Context, t NewMachineToken) (*IssuedToken, error) {
	var out IssuedToken
	in := map[string]any{"name": t.Name, "scopes": t.Scopes, "project": t.Project, "service": t.Service,
		"expires_in_seconds": int64(t.ExpiresIn / time.Second), "owner": t.Owner}
	if err := c.doJSON(ctx, http.MethodPost, "/tokens", in, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTokens lists machine tokens (GET /tokens): every token for an admin, one's own otherwise.
func (c *Client) ListTokens(ctx context.Context) ([]MachineToken, error) {
	var out struct {
		Tokens []MachineToken `json:"tokens"`
	}
	if err := c.do(ctx, http.MethodGet, "/tokens", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// RevokeToken revokes the named token (DELETE /tokens/{name}); it fails from the next request.
func (c *Client) RevokeToken(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/tokens/"+url.PathEscape(name), nil, nil, "", true, nil)
}

// RotateToken gives the named token a new secret (POST /tokens/{name}/rotate) and returns it
// once; the old secret fails from then on.
func (c *Client) RotateToken(ctx context.Context, name string) (*IssuedToken, error) {
	var out IssuedToken
	if err := c.do(ctx, http.MethodPost, "/tokens/"+url.PathEscape(name)+"/rotate", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Changelog reads up to limit consecutive change-log entries from fromSeq (GET /changelog,
// docs/node-protocol.md section 7) and the head's seq.
func (c *Client) Changelog(ctx context.Context, fromSeq int64, limit int) ([]node.LogEntry, int64, error) {
	var out struct {
		Entries []node.LogEntry `json:"entries"`
		HeadSeq int64           `json:"head_seq"`
	}
	q := url.Values{"from_seq": {strconv.FormatInt(fromSeq, 10)}, "limit": {strconv.Itoa(limit)}}
	if err := c.do(ctx, http.MethodGet, "/changelog", q, nil, "", true, &out); err != nil {
		return nil, 0, err
	}
	return out.Entries, out.HeadSeq, nil
}

// ChangelogQuery selects change-log entries for [Client.FindChangelog]: the entries of one
// kind (EntityType), entity, operation or actor, in a range of sequence numbers (FromSeq and
// UntilSeq inclusive; 0 means the first and the head), newest first when Desc. Limit is 1 to
// 500 (0: 500). Empty filters keep every entry.
type ChangelogQuery struct {
	FromSeq, UntilSeq                 int64
	Limit                             int
	Desc                              bool
	EntityType, EntityID, Op, ActorID string
}

// ChangelogPage is an answer of [Client.FindChangelog]: the entries in scan order, the head's
// seq, and NextSeq, where the same query goes on (the next FromSeq ascending, the next
// UntilSeq descending; 0 when a descending scan reached the start of its range). A filtered
// scan reads at most 10,000 entries per call, so a page may hold fewer than Limit entries
// and still have a NextSeq to go on from.
type ChangelogPage struct {
	Entries []node.LogEntry `json:"entries"`
	HeadSeq int64           `json:"head_seq"`
	NextSeq int64           `json:"next_seq"`
}

// FindChangelog reads the change-log entries q selects (GET /changelog with from_seq,
// until_seq, limit, order, entity_type, entity_id, op and actor_id; scope nodes:read;
// docs/node-protocol.md section 7.3). A range upside down is validation_failed.
func (c *Client) FindChangelog(ctx context.Context, q ChangelogQuery) (*ChangelogPage, error) {
	v := url.Values{}
	if q.FromSeq > 0 {
		v.Set("from_seq", strconv.FormatInt(q.FromSeq, 10))
	}
	if q.UntilSeq > 0 {
		v.Set("until_seq", strconv.FormatInt(q.UntilSeq, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Desc {
		v.Set("order", "desc")
	}
	for k, val := range map[string]string{"entity_type": q.EntityType, "entity_id": q.EntityID, "op": q.Op, "actor_id": q.ActorID} {
		if val != "" {
			v.Set(k, val)
		}
	}
	var out ChangelogPage
	if err := c.do(ctx, http.MethodGet, "/changelog", v, nil, "", true, &out); err != nil {
		return nil, err
	}
	if out.Entries == nil {
		out.Entries = []node.LogEntry{}
	}
	return &out, nil
}

// SetRoles replaces a user's roles and grants (PUT /users/{user}/roles; admin, recent login).
func (c *Client) SetRoles(ctx context.Context, user string, roles []string, grants []Grant) (*User, error) {
	var out User
	if roles == nil {
		roles = []string{}
	}
	in := map[string]any{"roles": roles, "grants": grants}
	if err := c.doJSON(ctx, http.MethodPut, "/users/"+url.PathEscape(user)+"/roles", in, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
