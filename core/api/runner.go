package api

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
)

// registerRunnerTransport serves /api/runner/v1 (docs/runner-protocol.md section 6) when the
// transport is on; off, the prefix is left to the not-found route (404).
func (s *Server) registerRunnerTransport(e *echo.Echo) {
	o := s.cfg.Orchestration
	if o == nil || !o.Transport {
		return
	}
	g := e.Group(abirunner.Prefix, s.runnerHeaders)
	g.POST(abirunner.PathRegister, s.runnerRegister)
	g.POST(abirunner.PathHeartbeat, s.runnerHeartbeat)
	g.POST(abirunner.PathClaim, s.runnerClaim)
	g.POST(abirunner.PathRenew, s.runnerRenew)
	g.POST(abirunner.PathComplete, s.runnerComplete)
	g.POST(abirunner.PathFail, s.runnerFail)
	g.POST(abirunner.PathObserve, s.runnerObserve)
	g.POST(abirunner.PathArtifact, s.runnerArtifact)
	g.POST(abirunner.PathRuntime, s.runnerRuntime)
	s.registerBackupTransport(g)
}

// runnerHeaders marks every transport answer private and non-sniffable.
func (s *Server) runnerHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "private, no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		return next(c)
	}
}

var errAuth = problem(abierrors.Unauthenticated, "authentication failed")

// bearer returns the Authorization bearer, or "" when there is none.
func bearer(c echo.Context) string {
	scheme, tok, ok := strings.Cut(c.Request().Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "" // schemes are case-insensitive (RFC 9110 section 11.1)
	}
	return tok
}

// runnerBind decodes a JSON body of at most abirunner.MaxRequestBytes into v, like bind.
func runnerBind(c echo.Context, v any) error {
	r := c.Request()
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return problem(abierrors.UnsupportedMedia, "request body must be application/json")
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, abirunner.MaxRequestBytes+1))
	if err != nil {
		return problem(abierrors.BadRequest, "could not read the request body")
	}
	if len(raw) > abirunner.MaxRequestBytes {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("request body is larger than %d bytes", abirunner.MaxRequestBytes))
	}
	return decodeObject(raw, v)
}

// runnerNode authenticates the node credential of the request for nodeID; every failure is the
// one generic 401.
func (s *Server) runnerNode(c echo.Context, nodeID string) (*runners.Node, error) {
	n, err := s.cfg.Orchestration.Runners.Authenticate(c.Request().Context(), nodeID, bearer(c))
	if errors.Is(err, runners.ErrUnauthenticated) {
		return nil, errAuth
	}
	return n, err
}

// runnerError maps a transport failure to its problem; unknown errors stay internal.
func runnerError(err error) error {
	if errors.Is(err, runners.ErrUnauthenticated) {
		return errAuth
	}
	if p := orchestrationProblem(err); p != nil {
		return p
	}
	if errors.Is(err, runners.ErrNotFound) {
		return problem(abierrors.NodeOffline, "the node's heartbeat expired; send a heartbeat first")
	}
	return err
}

func wireNode(n *runners.Node) abirunner.Node {
	return abirunner.Node{ID: n.ID, Region: n.Region, Endpoint: n.Endpoint, Capacity: n.Capacity, Reserved: n.Reserved,
		Labels: n.Labels, Draining: n.Draining, ExpiresAt: n.ExpiresAt, HeartbeatAt: n.LastHeartbeatAt}
}

func declaration(d abirunner.Declaration) runners.Declaration {
	return runners.Declaration{Region: d.Region, Endpoint: d.Endpoint, Capacity: d.Capacity, Labels: d.Labels}
}

func (s *Server) runnerRegister(c echo.Context) error {
	var req abirunner.RegisterRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	d := declaration(req.Declaration)
	if err := d.Validate(); err != nil {
		return problem(abierrors.ValidationFailed, err.Error())
	}
	o := s.cfg.Orchestration
	tok := bearer(c)
	var (
		n    *runners.Node
		cred string
		err  error
	)
	if !strings.HasPrefix(tok, "bre_") && o.LegacyRegistration.Matches(tok) {
		// The legacy shared secret can rotate any named node: every use is on the record.
		if !runners.ValidNodeID(req.NodeID) {
			return problem(abierrors.InvalidName, "node_id must be a DNS label")
		}
		n, cred, err = o.Runners.RegisterLegacy(c.Request().Context(), req.NodeID, d)
		if err == nil {
			s.log.Warn("runner registered with the legacy shared registration secret", "node_id", req.NodeID, "remote", c.RealIP())
		}
	} else {
		n, cred, err = o.Runners.Register(c.Request().Context(), tok, req.NodeID, d)
	}
	switch {
	case errors.Is(err, runners.ErrEnrollmentInvalid):
		return problem(abierrors.EnrollmentInvalid, "authentication failed")
	case err != nil:
		return runnerError(err)
	}
	s.log.Info("runner registered", "node_id", n.ID, "region", n.Region, "capacity", n.Capacity)
	return c.JSON(http.StatusOK, abirunner.RegisterResponse{Node: wireNode(n), Credential: cred})
}

func (s *Server) runnerHeartbeat(c echo.Context) error {
	var req abirunner.HeartbeatRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	o := s.cfg.Orchestration
	hr := runners.HeartbeatRequest{Draining: req.Draining}
	if req.Declaration != nil {
		d := declaration(*req.Declaration)
		if err := d.Validate(); err != nil {
			return problem(abierrors.ValidationFailed, err.Error())
		}
		hr.Declaration = &d
	}
	n, err := o.Runners.Heartbeat(c.Request().Context(), req.NodeID, bearer(c), hr)
	if err != nil {
		return runnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.HeartbeatResponse{Node: wireNode(n),
		LeaseTTLSeconds: o.Operations.Policy().LeaseTTL.Seconds(), NodeTTLSeconds: o.Runners.NodeTTL().Seconds()})
}

func (s *Server) runnerClaim(c echo.Context) error {
	var req abirunner.ClaimRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if req.Max < 1 || req.Max > abirunner.MaxClaim {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("max must be between 1 and %d", abirunner.MaxClaim))
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	// The claim gate is the linearisation point against a drain (docs/runner-protocol.md section 3).
	if _, err := o.Runners.ClaimGate(ctx, req.NodeID, bearer(c)); err != nil {
		return runnerError(err)
	}
	claimed, err := o.Operations.Claim(ctx, req.NodeID, req.Max, nil)
	out := abirunner.ClaimResponse{Operations: []abirunner.Operation{}}
	for _, cl := range claimed {
		op := cl.Operation
		out.Operations = append(out.Operations, abirunner.Operation{ID: op.ID, ProjectID: op.ProjectID, Kind: op.Kind,
			Payload: op.PayloadJSON(), Attempts: op.Attempts, Fence: op.Fence, LeaseToken: cl.LeaseToken, LeaseExpiresAt: op.LeaseExpiresAt})
	}
	if err != nil {
		if len(claimed) == 0 {
			return err
		}
		// The claimed operations are leased: hand them out rather than strand them until expiry.
		s.log.Warn("claim stopped early", "node_id", req.NodeID, "claimed", len(claimed), "err", err)
	}
	return c.JSON(http.StatusOK, out)
}

// runnerOperation authenticates the runner node nodeID and checks that the
// lease presented holds operation id, without changing it: the common start
// of the observe, artifact and runtime calls (docs/runner-protocol.md
// section 7). It returns the operation as stored and the lease holder for
// the recheck after provider I/O; errors are already problems.
func (s *Server) runnerOperation(c echo.Context, nodeID, id string, l abirunner.Lease) (*operations.Operation, operations.Holder, error) {
	if _, err := s.runnerNode(c, nodeID); err != nil {
		return nil, operations.Holder{}, err
	}
	h := holder(l)
	op, err := s.cfg.Orchestration.Operations.Check(c.Request().Context(), id, h)
	if err != nil {
		return nil, operations.Holder{}, runnerError(err)
	}
	return op, h, nil
}

func holder(l abirunner.Lease) operations.Holder {
	return operations.Holder{NodeID: l.NodeID, Token: l.LeaseToken, Fence: l.Fence}
}

func (s *Server) runnerRenew(c echo.Context) error {
	var req abirunner.Lease
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	op, err := s.cfg.Orchestration.Operations.Renew(c.Request().Context(), req.OperationID, holder(req))
	if err != nil {
		return runnerError(leaseErr(err))
	}
	return c.JSON(http.StatusOK, abirunner.RenewResponse{LeaseExpiresAt: op.LeaseExpiresAt})
}

// leaseErr reads an unknown operation as a lost lease, so the answer says nothing about which
// operation ids exist.
func leaseErr(err error) error {
	if errors.Is(err, operations.ErrNotFound) {
		return fmt.Errorf("%w: %w", operations.ErrLeaseLost, err)
	}
	return err
}

func (s *Server) runnerComplete(c echo.Context) error {
	var req abirunner.CompleteRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	if len(req.Result) > operations.MaxPayloadBytes {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("result is larger than %d bytes", operations.MaxPayloadBytes))
	}
	op, err := s.cfg.Orchestration.Operations.Complete(c.Request().Context(), req.OperationID, holder(req.Lease), req.Result)
	if err != nil {
		return runnerError(leaseErr(err))
	}
	s.log.Info("operation completed", "operation_id", op.ID, "node_id", req.NodeID, "fence", op.Fence)
	return c.JSON(http.StatusOK, abirunner.SettleResponse{State: string(op.State)})
}

func (s *Server) runnerFail(c echo.Context) error {
	var req abirunner.FailRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	op, err := s.cfg.Orchestration.Operations.Fail(c.Request().Context(), req.OperationID, holder(req.Lease), req.Error, req.Retryable)
	if err != nil {
		return runnerError(leaseErr(err))
	}
	s.log.Info("operation attempt failed", "operation_id", op.ID, "node_id", req.NodeID, "state", op.State, "attempts", op.Attempts)
	return c.JSON(http.StatusOK, abirunner.SettleResponse{State: string(op.State)})
}

func (s *Server) runnerObserve(c echo.Context) error {
	var req abirunner.ObserveRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	op, _, err := s.runnerOperation(c, req.NodeID, req.OperationID, req.Lease)
	if err != nil {
		return err
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	if lifecycleKind(op.Kind) {
		return problem(abierrors.ValidationFailed, "lifecycle operations report no observation")
	}
	p, err := o.Placement.Observe(ctx, op.ProjectID, placement.Observation{Generation: req.Generation, Release: req.Release,
		State: placement.RunState(req.State), NodeID: req.NodeID})
	if err != nil {
		return runnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.SettleResponse{State: string(p.Status)})
}

// runnerArtifact answers the artifact of a leased operation with all three authorities at once: the
// node credential, the operation's current lease, and a provider result for the canonical payload
// read back from the store (never the echoed request). The bytes are read under the ceiling and
// their digest verified before the lease is checked again and the answer sent.
func (s *Server) runnerArtifact(c echo.Context) error {
	var req abirunner.ArtifactRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	op, h, err := s.runnerOperation(c, req.NodeID, req.OperationID, req.Lease)
	if err != nil {
		return err
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	if lifecycleKind(op.Kind) {
		return problem(abierrors.BundleNotFound, "lifecycle operations have no artifact")
	}
	snap := *op
	snap.TokenDigest = ""
	prov := o.Artifacts
	if prov == nil {
		prov = BundleArtifacts{Bundles: s.cfg.Bundles}
	}
	limit := o.ArtifactMaxBytes
	if limit <= 0 {
		limit = DefaultArtifactMaxBytes
	}
	body, digest, err := prov.Artifact(ctx, snap)
	if errors.Is(err, ErrNoArtifact) {
		return problem(abierrors.BundleNotFound, "the operation names no artifact this server holds")
	}
	if err != nil {
		return fmt.Errorf("artifact of %s: %w", op.ID, err)
	}
	data, err := io.ReadAll(io.LimitReader(body, limit+1))
	_ = body.Close()
	if err != nil {
		return fmt.Errorf("artifact of %s: read: %w", op.ID, err)
	}
	if int64(len(data)) > limit {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("the artifact is larger than the transport's ceiling of %d bytes", limit))
	}
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return fmt.Errorf("artifact of %s: provider digest %s, content hashes to %s", op.ID, digest, got)
	}
	// Work reclaimed during a slow read gets no artifact.
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	if _, err := o.Operations.Check(ctx, req.OperationID, h); err != nil {
		return runnerError(err)
	}
	hd := c.Response().Header()
	hd.Set(abirunner.HeaderDigest, digest)
	hd.Set(echo.HeaderContentLength, strconv.Itoa(len(data)))
	return c.Blob(http.StatusOK, abirunner.ArtifactMediaType, data)
}
