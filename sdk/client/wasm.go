package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berthhq/berth/abi/routes"
)

// Module is a WebAssembly module in the server's catalog (docs/api.md
// section 6). Digest ("sha256:<hex>") identifies it.
type Module struct {
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	ABI       string    `json:"abi"`
	CreatedAt time.Time `json:"created_at"`
}

// BindingRequest binds a policy module to a hook, or a route compiler to
// "routes.compile". Project empty means every
// project; FailurePolicy is "fail" (default: a failing module refuses the
// request) or "ignore". Config is handed to the module unchanged.
type BindingRequest struct {
	Hook          string          `json:"hook"`
	Module        string          `json:"module"`
	Project       string          `json:"project,omitempty"`
	FailurePolicy string          `json:"failure_policy,omitempty"`
	Config        json.RawMessage `json:"config,omitempty"`
}

// Binding is a stored binding; Module is the module's name, ModuleDigest its
// id. Replaced, only in Bind's answer, lists the routes.compile bindings a new
// routes.compile binding replaced (docs/wasm-abi.md section 6.4).
type Binding struct {
	ID            string    `json:"id"`
	Hook          string    `json:"hook"`
	ModuleDigest  string    `json:"module_digest"`
	Module        string    `json:"module"`
	Project       string    `json:"project,omitempty"`
	FailurePolicy string    `json:"failure_policy"`
	Config        string    `json:"config,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	Replaced      []string  `json:"replaced,omitempty"`
}

// PolicyDecision is one recorded policy evaluation: Result is "allow",
// "deny" or "error"; InputSHA256 is the hex SHA-256 of the exact input; Seq
// is the decision's entry in the change log (zero if it could not be
// appended).
type PolicyDecision struct {
	ID           string    `json:"id"`
	Hook         string    `json:"hook"`
	BindingID    string    `json:"binding_id"`
	ModuleDigest string    `json:"module_digest"`
	InputSHA256  string    `json:"input_sha256"`
	Project      string    `json:"project,omitempty"`
	Result       string    `json:"result"`
	Reasons      []string  `json:"reasons,omitempty"`
	Warnings     []string  `json:"warnings,omitempty"`
	Error        string    `json:"error,omitempty"`
	At           time.Time `json:"at"`
	Seq          int64     `json:"seq,omitempty"`
}

// RouteStatus is GET /routes: the route table in force, its SHA-256, the
// compiler that produced it and, when the newest compilation failed, the
// failure and the compiler that failed.
type RouteStatus struct {
	Table           routes.Table `json:"table"`
	SHA256          string       `json:"sha256"`
	Compiler        string       `json:"compiler"`
	CompiledAt      time.Time    `json:"compiled_at"`
	LastError       string       `json:"last_error,omitempty"`
	LastErrorAt     *time.Time   `json:"last_error_at,omitempty"`
	FailingCompiler string       `json:"failing_compiler,omitempty"`
	// Certificates is the certificate status of each routed hostname whose
	// tls mode is acme or manual (docs/certificates.md section 5).
	Certificates map[string]CertificateStatus `json:"certificates,omitempty"`
}

// CertificateStatus is one hostname's certificate: State pending, issued,
// renewing or failed; Challenge http-01, dns-01 or manual; NotAfter the
// expiry of the certificate served (zero when none); LastError the last
// failure (the CA's problem type and detail when it refused).
type CertificateStatus struct {
	Hostname  string    `json:"hostname"`
	State     string    `json:"state"`
	Challenge string    `json:"challenge"`
	NotAfter  time.Time `json:"not_after,omitzero"`
	LastError string    `json:"last_error,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PushModule uploads a WebAssembly module read from r (POST /modules,
// application/wasm). The server checks it against the ABI; a module that
// fails answers code "module_invalid".
func (c *Client) PushModule(ctx context.Context, r io.Reader) (*Module, error) {
	var out Module
	if err := c.do(ctx, http.MethodPost, "/modules", nil, r, "application/wasm", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Modules lists the module catalog, newest first.
func (c *Client) Modules(ctx context.Context) ([]Module, error) {
	var out List[Module]
	if err := c.do(ctx, http.MethodGet, "/modules", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// Bind creates a policy binding (POST /policy-bindings).
func (c *Client) Bind(ctx context.Context, req BindingRequest) (*Binding, error) {
	var out Binding
	if err := c.doJSON(ctx, http.MethodPost, "/policy-bindings", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Unbind removes a binding; an unknown id answers "binding_not_found".
func (c *Client) Unbind(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/policy-bindings/"+pathEscape(id), nil, nil, "", true, nil)
}

// Bindings lists every binding.
func (c *Client) Bindings(ctx context.Context) ([]Binding, error) {
	var out List[Binding]
	if err := c.do(ctx, http.MethodGet, "/policy-bindings", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PolicyDecisions returns the newest recorded decisions, at most limit (1 to 1000).
func (c *Client) PolicyDecisions(ctx context.Context, limit int) ([]PolicyDecision, error) {
	var out List[PolicyDecision]
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if err := c.do(ctx, http.MethodGet, "/policy-decisions", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PolicyInput returns the exact input of a recent decision by its
// InputSHA256 (GET /policy-inputs/{sha256}), as berthd keeps it in memory;
// an input it no longer keeps is an error of code input_not_recorded.
func (c *Client) PolicyInput(ctx context.Context, sha256 string) (json.RawMessage, error) {
	var out json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/policy-inputs/"+pathEscape(sha256), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Routes returns the route table in force (GET /routes).
func (c *Client) Routes(ctx context.Context) (*RouteStatus, error) {
	var out RouteStatus
	if err := c.do(ctx, http.MethodGet, "/routes", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
