// Package runner is the runner side of /api/runner/v1: a transport client, node credential stores
// and the agent loop a provider author embeds (docs/runner-protocol.md sections 6 and 7).
package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/sdk/client"
)

// Errors of [Client].
var (
	// ErrUnauthenticated is returned when the server refused the bearer (node credential or
	// enrollment token): rotated, revoked, unknown, used or expired. Not retryable.
	ErrUnauthenticated = errors.New("berth: runner authentication failed")
	// ErrLeaseLost is returned by Renew, Complete, Fail, Observe and Artifact when the operation
	// lease is no longer current. Local work must stop; nothing may be settled through it.
	ErrLeaseLost = errors.New("berth: operation lease lost")
	// ErrDraining is returned by Claim for a draining node.
	ErrDraining = errors.New("berth: node is draining")
	// ErrArtifact is returned by Artifact when the answer's media type, length or digest is wrong,
	// or the artifact exceeds the client's ceiling.
	ErrArtifact = errors.New("berth: artifact refused")
	// ErrRuntime is returned by Runtime when the answer's media type, length or digest is wrong,
	// it exceeds the client's runtime ceiling, or the capsule is not bound to the operation's
	// project, release, generation and fence.
	ErrRuntime = errors.New("berth: runtime refused")
	// ErrLifecycle is returned by a [Task]'s Artifact, Runtime and Observe for a rollback or delete
	// operation, and by Confirmation for any other kind.
	ErrLifecycle = errors.New("berth: not available for this operation kind")
)

// Problem is an error answer of the transport that is none of the sentinels above.
type Problem struct {
	Status int
	Code   string
	Detail string
}

// Error reads "code: detail (status)".
func (p *Problem) Error() string { return fmt.Sprintf("%s: %s (%d)", p.Code, p.Detail, p.Status) }

// ClientConfig configures a [Client]. BaseURL is required; the zero value of the rest works.
type ClientConfig struct {
	// BaseURL is the control plane, e.g. "https://deploy.example.com". Outside loopback only
	// https is accepted.
	BaseURL string
	// Fingerprint pins the server certificate ("sha256:<hex>", see [client.PinnedTLSConfig]);
	// empty uses the system CAs.
	Fingerprint string
	// Timeout bounds each call; zero means 10 s.
	Timeout time.Duration
	// MaxArtifactBytes is the client's own artifact ceiling; zero means 512 MiB.
	MaxArtifactBytes int64
	// MaxRuntimeBytes is the client's own runtime ceiling, independent of the artifact's; zero
	// means 1 GiB.
	MaxRuntimeBytes int64
	// HTTPClient replaces the transport (tests); its redirect policy is replaced: redirects are
	// always refused. nil builds one from Fingerprint.
	HTTPClient *http.Client
}

// Client calls /api/runner/v1. Bearers travel only in the Authorization header; redirects are
// refused so a response cannot forward a bearer to another origin; answers are bounded. Safe for
// concurrent use.
type Client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
	maxArt  int64
	maxRt   int64
}

// NewClient returns a Client. Errors: a malformed URL, a non-https URL outside loopback, or a
// malformed fingerprint.
func NewClient(cfg ClientConfig) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(cfg.BaseURL))
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("runner: base URL %q: want scheme://host[:port] without credentials or query", cfg.BaseURL)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && loopback(u.Hostname()):
	default:
		return nil, fmt.Errorf("runner: base URL %q: only https is accepted outside loopback", cfg.BaseURL)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		if hc, err = client.PinnedHTTPClient(cfg.Fingerprint); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	} else {
		c := *hc
		hc = &c
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxArtifactBytes <= 0 {
		cfg.MaxArtifactBytes = 512 << 20
	}
	if cfg.MaxRuntimeBytes <= 0 {
		cfg.MaxRuntimeBytes = 1 << 30
	}
	return &Client{base: strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/") + abirunner.Prefix,
		hc: hc, timeout: cfg.Timeout, maxArt: cfg.MaxArtifactBytes, maxRt: cfg.MaxRuntimeBytes}, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// post sends in to path with bearer and returns the 200 response; the caller closes its body.
func (c *Client) post(ctx context.Context, path, bearer string, in any) (*http.Response, context.CancelFunc, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, nil, fmt.Errorf("runner: %s: encode: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(b))
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("runner: %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("runner: %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, nil, answerError(path, resp)
	}
	return resp, cancel, nil
}

func answerError(path string, resp *http.Response) error {
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return fmt.Errorf("runner: %s: refused a redirect (%d)", path, resp.StatusCode)
	}
	var p struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(raw, &p)
	switch p.Code {
	case "unauthenticated", "enrollment_invalid":
		return fmt.Errorf("runner: %s: %w", path, ErrUnauthenticated)
	case "operation_lease_lost":
		return fmt.Errorf("runner: %s: %w", path, ErrLeaseLost)
	case "node_draining":
		return fmt.Errorf("runner: %s: %w", path, ErrDraining)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("runner: %s: %w", path, ErrUnauthenticated)
	}
	return fmt.Errorf("runner: %s: %w", path, &Problem{Status: resp.StatusCode, Code: p.Code, Detail: p.Detail})
}

func (c *Client) call(ctx context.Context, path, bearer string, in, out any) error {
	resp, cancel, err := c.post(ctx, path, bearer, in)
	if err != nil {
		return err
	}
	defer cancel()
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, abirunner.MaxResponseBytes)).Decode(out); err != nil {
		return fmt.Errorf("runner: %s: decode answer: %w", path, err)
	}
	return nil
}

// Register consumes a one-time enrollment token and returns the node with its new credential,
// shown once. Errors: wrapping [ErrUnauthenticated] for a bad token.
func (c *Client) Register(ctx context.Context, enrollmentToken, nodeID string, d abirunner.Declaration) (*abirunner.RegisterResponse, error) {
	var out abirunner.RegisterResponse
	if err := c.call(ctx, abirunner.PathRegister, enrollmentToken, abirunner.RegisterRequest{NodeID: nodeID, Declaration: d}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Heartbeat keeps the node online and applies req's declaration and draining change.
func (c *Client) Heartbeat(ctx context.Context, cred string, req abirunner.HeartbeatRequest) (*abirunner.HeartbeatResponse, error) {
	var out abirunner.HeartbeatResponse
	if err := c.call(ctx, abirunner.PathHeartbeat, cred, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Claim leases up to max (1 to [abirunner.MaxClaim]) operations. Errors: [ErrDraining].
func (c *Client) Claim(ctx context.Context, nodeID, cred string, max int) ([]abirunner.Operation, error) {
	var out abirunner.ClaimResponse
	if err := c.call(ctx, abirunner.PathClaim, cred, abirunner.ClaimRequest{NodeID: nodeID, Max: max}, &out); err != nil {
		return nil, err
	}
	return out.Operations, nil
}

// Renew extends a lease and returns its new expiry. Errors: [ErrLeaseLost].
func (c *Client) Renew(ctx context.Context, cred string, l abirunner.Lease) (time.Time, error) {
	var out abirunner.RenewResponse
	if err := c.call(ctx, abirunner.PathRenew, cred, l, &out); err != nil {
		return time.Time{}, err
	}
	return out.LeaseExpiresAt, nil
}

// Complete settles an operation as succeeded with a bounded, non-secret result.
func (c *Client) Complete(ctx context.Context, cred string, l abirunner.Lease, result json.RawMessage) error {
	var out abirunner.SettleResponse
	return c.call(ctx, abirunner.PathComplete, cred, abirunner.CompleteRequest{Lease: l, Result: result}, &out)
}

// Fail settles a failed attempt with bounded, non-secret text.
func (c *Client) Fail(ctx context.Context, cred string, l abirunner.Lease, msg string, retryable bool) error {
	var out abirunner.SettleResponse
	return c.call(ctx, abirunner.PathFail, cred, abirunner.FailRequest{Lease: l, Error: msg, Retryable: retryable}, &out)
}

// Observe reports what the node runs for the leased operation's project.
func (c *Client) Observe(ctx context.Context, cred string, req abirunner.ObserveRequest) error {
	var out abirunner.SettleResponse
	return c.call(ctx, abirunner.PathObserve, cred, req, &out)
}

// Artifact is a verified artifact.
type Artifact struct {
	Digest string
	Bytes  []byte
}

// Artifact downloads the artifact of a leased operation. It requires the exact media type, an
// exact Content-Length within the client's ceiling and a matching SHA-256 digest before it returns
// bytes. Errors: [ErrLeaseLost], [ErrArtifact].
func (c *Client) Artifact(ctx context.Context, cred string, l abirunner.Lease) (*Artifact, error) {
	digest, data, err := c.blob(ctx, abirunner.PathArtifact, cred, abirunner.ArtifactRequest{Lease: l}, abirunner.ArtifactMediaType, c.maxArt, ErrArtifact)
	if err != nil {
		return nil, err
	}
	return &Artifact{Digest: digest, Bytes: data}, nil
}

// RuntimeBytes is a verified runtime answer: the capsule's JSON and its digest. It holds
// application secrets.
type RuntimeBytes struct {
	Digest string
	Bytes  []byte
}

// Runtime downloads the runtime capsule of a leased runtime reconcile operation with the same
// checks as [Client.Artifact] under the client's own runtime ceiling. It does not decode or bind
// the capsule; [Task.Runtime] does. Errors: [ErrLeaseLost], [ErrRuntime].
func (c *Client) Runtime(ctx context.Context, cred string, l abirunner.Lease) (*RuntimeBytes, error) {
	digest, data, err := c.blob(ctx, abirunner.PathRuntime, cred, abirunner.RuntimeRequest{Lease: l}, abirunner.RuntimeMediaType, c.maxRt, ErrRuntime)
	if err != nil {
		return nil, err
	}
	return &RuntimeBytes{Digest: digest, Bytes: data}, nil
}

// blob posts in and returns a binary answer after checking its media type, its exact length
// within max and its SHA-256 digest; refusals wrap refused.
func (c *Client) blob(ctx context.Context, path, cred string, in any, mediaType string, max int64, refused error) (string, []byte, error) {
	resp, cancel, err := c.post(ctx, path, cred, in)
	if err != nil {
		return "", nil, err
	}
	defer cancel()
	defer resp.Body.Close()
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != mediaType {
		return "", nil, fmt.Errorf("runner: %s: media type %q: %w", path, mt, refused)
	}
	n, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	if err != nil || n < 0 || n > max || resp.ContentLength != n {
		return "", nil, fmt.Errorf("runner: %s: length %q outside 0..%d: %w", path, resp.Header.Get("Content-Length"), max, refused)
	}
	want := resp.Header.Get(abirunner.HeaderDigest)
	data, err := io.ReadAll(io.LimitReader(resp.Body, n+1))
	if err != nil {
		return "", nil, fmt.Errorf("runner: %s: read: %w", path, err)
	}
	if int64(len(data)) != n {
		return "", nil, fmt.Errorf("runner: %s: got %d bytes, announced %d: %w", path, len(data), n, refused)
	}
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != want {
		return "", nil, fmt.Errorf("runner: %s: content hashes to %s, announced %q: %w", path, got, want, refused)
	}
	return want, data, nil
}
