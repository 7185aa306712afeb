package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
)

// DefaultArtifactMaxBytes is the transport's artifact ceiling when [Orchestration.ArtifactMaxBytes]
// is zero: 512 MiB.
const DefaultArtifactMaxBytes = 512 << 20

// ArtifactProvider returns the artifact of a leased operation (docs/runner-protocol.md section 6):
// the bytes of the release its canonical payload names, and their "sha256:<hex>" digest. It receives
// a frozen snapshot of the operation without its lease token digest. The caller closes body.
type ArtifactProvider interface {
	Artifact(ctx context.Context, op operations.Operation) (body io.ReadCloser, digest string, err error)
}

// ErrNoArtifact is returned by an [ArtifactProvider] when the operation names no artifact it holds.
var ErrNoArtifact = errors.New("berth: the operation names no artifact")

// Orchestration wires project leases, runner nodes, placements and the operation queue into the
// API (docs/runner-protocol.md). Every field but Transport, Artifacts and ArtifactMaxBytes is
// required.
type Orchestration struct {
	Leases     *leases.Manager
	Runners    *runners.Registry
	Operations *operations.Queue
	Placement  *placement.Service
	// Transport reports whether /api/runner/v1 is served; false answers 404 on the whole prefix.
	Transport bool
	// Artifacts serves POST /api/runner/v1/artifact; nil serves release bundles of the API's
	// bundle store.
	Artifacts ArtifactProvider
	// ArtifactMaxBytes bounds one artifact answer; zero means [DefaultArtifactMaxBytes].
	ArtifactMaxBytes int64
	// Runtime serves POST /api/runner/v1/runtime; nil composes capsules from the API's catalog
	// ([CatalogRuntime]).
	Runtime RuntimeProvider
	// RuntimeMaxBytes bounds one runtime answer; zero means [DefaultRuntimeMaxBytes].
	RuntimeMaxBytes int64
	// LegacyRegistration, when not nil, accepts one shared registration secret at POST /register
	// besides one-time enrollment tokens (docs/runner-protocol.md section 6.4). Off when nil.
	LegacyRegistration *runners.LegacySecret
}

// BundleArtifacts serves the release bundle a reconcile payload names ({"release": "sha256:..."}),
// when the operation's project holds it.
type BundleArtifacts struct{ Bundles *bundles.Store }

// Artifact implements [ArtifactProvider].
func (b BundleArtifacts) Artifact(ctx context.Context, op operations.Operation) (io.ReadCloser, string, error) {
	var p struct {
		Release string `json:"release"`
	}
	if err := json.Unmarshal(op.PayloadJSON(), &p); err != nil || !bundles.ValidDigest(p.Release) {
		return nil, "", ErrNoArtifact
	}
	m, err := b.Bundles.Resolve(ctx, op.ProjectID, p.Release)
	if errors.Is(err, bundles.ErrNotFound) {
		return nil, "", ErrNoArtifact
	}
	if err != nil {
		return nil, "", err
	}
	f, _, err := b.Bundles.Open(ctx, m.Digest)
	if errors.Is(err, bundles.ErrNotFound) {
		return nil, "", ErrNoArtifact
	}
	if err != nil {
		return nil, "", err
	}
	return f, m.Digest, nil
}

func (s *Server) registerOrchestration(v1 *echo.Group) {
	if s.cfg.Orchestration == nil {
		return
	}
	v1.POST("/runners/enrollment-tokens", s.createRunnerEnrollment, s.auth(identity.ScopeNodeEnroll))
	v1.GET("/runners", s.listRunners, s.auth(identity.ScopeNodesRead))
	v1.PUT("/projects/:project/placement", s.putPlacement, s.auth(identity.ScopeServicesWrite))
	v1.GET("/projects/:project/placement", s.getPlacement, s.auth(identity.ScopeServicesRead))
	v1.DELETE("/projects/:project/placement", s.deletePlacement, s.auth(identity.ScopeServicesWrite))
	v1.POST("/projects/:project/placement/rollback", s.rollbackPlacement, s.auth(identity.ScopeServicesWrite))
	v1.POST("/projects/:project/operations", s.enqueueOperation, s.auth(identity.ScopeServicesWrite))
	v1.GET("/projects/:project/operations", s.listOperations, s.auth(identity.ScopeServicesRead))
	v1.GET("/operations/:id", s.getOperation, s.auth(identity.ScopeServicesRead))
}

// orchestrationProblem maps the orchestration packages' errors to stable codes; nil for others.
func orchestrationProblem(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, leases.ErrBusy):
		return problem(abierrors.ProjectBusy, "another control-plane worker is changing this project; retry shortly")
	case errors.Is(err, leases.ErrLost):
		return abierrors.Wrap(abierrors.ProjectLeaseLost, "the project lease was lost before the change was confirmed; its outcome is unknown", err)
	case errors.Is(err, operations.ErrLeaseLost):
		return problem(abierrors.OperationLeaseLost, "the operation lease is not current: reclaimed, expired or settled")
	case errors.Is(err, operations.ErrIdempotencyKeyReused):
		return problem(abierrors.IdempotencyKeyReused, "this Idempotency-Key was used with another request body")
	case errors.Is(err, placement.ErrModeImmutable):
		return problem(abierrors.PlacementModeImmutable, "placement_mode cannot change")
	case errors.Is(err, placement.ErrProviderImmutable):
		return problem(abierrors.PlacementModeImmutable, "provider placement is chosen when the placement is created and cannot change")
	case errors.Is(err, placement.ErrNotProvider):
		return problem(abierrors.ValidationFailed, "the project is not placed with provider placement on a node")
	case errors.Is(err, placement.ErrDeleting):
		return problem(abierrors.RevisionConflict, "the project's placement is being deleted")
	case errors.Is(err, placement.ErrPinned):
		return problem(abierrors.PlacementPinned, "the placement is pinned to its node: region and requirements cannot change")
	case errors.Is(err, placement.ErrInvalid):
		return problem(abierrors.ValidationFailed, deploy.TrimSentinel(err))
	case errors.Is(err, placement.ErrStale):
		return problem(abierrors.ValidationFailed, "the observation is older than the recorded one or not from the assigned node")
	case errors.Is(err, runners.ErrCapacityInUse):
		return problem(abierrors.CapacityInUse, "capacity below the node's reservations")
	case errors.Is(err, runners.ErrRequirementInUse):
		return problem(abierrors.RequirementInUse, "an assigned placement requires what the declaration drops")
	case errors.Is(err, runners.ErrDraining):
		return problem(abierrors.NodeDraining, "the node is draining")
	}
	return nil
}

func apiRunner(n *runners.Node, now time.Time) client.Runner {
	return client.Runner{ID: n.ID, Region: n.Region, Endpoint: n.Endpoint, Capacity: n.Capacity, Reserved: n.Reserved,
		Labels: n.Labels, Draining: n.Draining, Revoked: n.Revoked, Online: !n.Revoked && !n.Offline(now),
		LastHeartbeatAt: n.LastHeartbeatAt, ExpiresAt: n.ExpiresAt}
}

func apiOperation(o *operations.Operation) client.Operation {
	out := client.Operation{ID: o.ID, ProjectID: o.ProjectID, Kind: o.Kind, IdempotencyKey: o.IdempotencyKey,
		Payload: o.PayloadJSON(), TargetNode: o.TargetNode, State: string(o.State), Attempts: o.Attempts,
		MaxAttempts: o.MaxAttempts, NodeID: o.NodeID, Fence: o.Fence, LastError: o.LastError,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt}
	if o.Result != "" {
		out.Result = json.RawMessage(o.Result)
	}
	return out
}

func (s *Server) createRunnerEnrollment(c echo.Context) error {
	var req client.RunnerEnrollmentRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if !runners.ValidNodeID(req.NodeID) {
		return problem(abierrors.InvalidName, fmt.Sprintf("node_id %q must be a DNS label", req.NodeID))
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if req.TTLSeconds < 0 || ttl > runners.MaxEnrollmentTTL || len(req.Region) > 63 {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("ttl_seconds must be between 0 and %d and region at most 63 bytes", int(runners.MaxEnrollmentTTL.Seconds())))
	}
	tok, exp, err := s.cfg.Orchestration.Runners.CreateEnrollment(c.Request().Context(), req.NodeID, req.Region, ttl)
	if err != nil {
		return err
	}
	s.log.Info("runner enrollment token created", "node_id", req.NodeID, "region", req.Region, "expires_at", exp)
	return c.JSON(http.StatusCreated, client.RunnerEnrollment{Token: tok, NodeID: req.NodeID, Region: req.Region, ExpiresAt: exp})
}

func (s *Server) listRunners(c echo.Context) error {
	r := s.cfg.Orchestration.Runners
	ns, err := r.List(c.Request().Context())
	if err != nil {
		return err
	}
	out := client.List[client.Runner]{Items: []client.Runner{}}
	now := r.Now()
	for i := range ns {
		out.Items = append(out.Items, apiRunner(&ns[i], now))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) putPlacement(c echo.Context) error {
	var req client.PlacementRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	release := req.Release
	if release == "" {
		return problem(abierrors.ValidationFailed, "release is required: a bundle digest or name, or an image digest")
	}
	if m, err := s.cfg.Bundles.Resolve(ctx, p.ID, release); err == nil {
		release = m.Digest
	} else if !bundles.ValidDigest(release) {
		return problem(abierrors.BundleNotFound, fmt.Sprintf("no bundle %q in project %q", release, p.Name))
	}
	dr := placement.DesiredRequest{Release: release, State: placement.RunState(req.State), Region: req.Region, CapacityUnits: req.CapacityUnits, Provider: req.Provider}
	if req.PlacementMode != nil {
		m := placement.Mode(*req.PlacementMode)
		dr.Mode = &m
	}
	if req.NodeRequirements != nil {
		dr.Requirements = &placement.Requirements{Endpoint: req.NodeRequirements.Endpoint, Labels: req.NodeRequirements.Labels}
	}
	o := s.cfg.Orchestration
	var out *placement.Placement
	// A deploy is a destructive project operation: it runs under the project lease.
	err = o.Leases.Hold(ctx, leases.Key(p.ID), func(ctx context.Context, _ leases.Lease) error {
		var err error
		out, err = o.Placement.SetDesired(ctx, p.ID, dr)
		return err
	})
	if perr := orchestrationProblem(err); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	s.log.Info("placement set", "project", p.Name, "generation", out.Generation, "status", out.Status, "node_id", out.NodeID)
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getPlacement(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	out, err := s.cfg.Orchestration.Placement.Get(c.Request().Context(), p.ID)
	if errors.Is(err, store.ErrNotFound) {
		return problem(abierrors.NotFound, fmt.Sprintf("project %q has no placement", p.Name))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// enqueueOperation enqueues under the Idempotency-Key header, which it requires. The middleware
// (idempotency.go) replays a repeat by the same bearer as for every mutating route; the key is
// also the operation's own idempotency key within the project, so a repeat by another bearer
// answers the operation the first request created, with Idempotency-Replayed: true, and another
// body under the key is refused idempotency_key_reused.
func (s *Server) enqueueOperation(c echo.Context) error {
	key := c.Request().Header.Get("Idempotency-Key")
	if key == "" || len(key) > 200 {
		return problem(abierrors.IdempotencyKeyRequired, "an Idempotency-Key header of 1 to 200 bytes is required")
	}
	var req client.OperationRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	if req.Kind == "" || len(req.Kind) > 63 || req.MaxAttempts < 0 || req.MaxAttempts > 100 ||
		(req.TargetNode != "" && !runners.ValidNodeID(req.TargetNode)) {
		return problem(abierrors.ValidationFailed, "kind (1 to 63 bytes) is required; max_attempts 0..100; target_node a node id")
	}
	if lifecycleKind(req.Kind) {
		return problem(abierrors.ValidationFailed, fmt.Sprintf("kind %q is derived by the control plane (POST .../placement/rollback, DELETE .../placement)", req.Kind))
	}
	if req.Kind == placement.KindReconcile {
		var rp placement.ReconcilePayload
		if json.Unmarshal(req.Payload, &rp) == nil && rp.Protocol != "" {
			return problem(abierrors.ValidationFailed, "reconcile operations of provider placements are derived from the placement")
		}
	}
	if len(req.Payload) > operations.MaxPayloadBytes {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("payload is larger than %d bytes", operations.MaxPayloadBytes))
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	op, created, err := s.cfg.Orchestration.Operations.Enqueue(c.Request().Context(), operations.EnqueueRequest{
		ProjectID: p.ID, Kind: req.Kind, IdempotencyKey: key, Payload: req.Payload, TargetNode: req.TargetNode, MaxAttempts: req.MaxAttempts,
	})
	if perr := orchestrationProblem(err); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	if !created {
		// The recorded answer: the same status and the operation the first request created.
		c.Response().Header().Set("Idempotency-Replayed", "true")
		return c.JSON(http.StatusCreated, apiOperation(op))
	}
	s.log.Info("operation enqueued", "project", p.Name, "operation_id", op.ID, "kind", op.Kind)
	return c.JSON(http.StatusCreated, apiOperation(op))
}

func (s *Server) listOperations(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ops, err := s.cfg.Orchestration.Operations.List(c.Request().Context(), p.ID)
	if err != nil {
		return err
	}
	out := client.List[client.Operation]{Items: []client.Operation{}}
	for i := range ops {
		out.Items = append(out.Items, apiOperation(&ops[i]))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getOperation(c echo.Context) error {
	op, err := s.cfg.Orchestration.Operations.Get(c.Request().Context(), c.Param("id"))
	if errors.Is(err, operations.ErrNotFound) {
		return problem(abierrors.NotFound, fmt.Sprintf("no operation %q", c.Param("id")))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiOperation(op))
}

// rollbackPlacement enqueues the provider rollback of the project's exact current generation
// under the project lease (docs/runner-protocol.md section 6.3). The runner derives the
// confirmation itself; the body is empty or the empty object {}.
func (s *Server) rollbackPlacement(c echo.Context) error {
	if err := s.bindOptional(c, &struct{}{}); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	var op *operations.Operation
	err = o.Leases.Hold(ctx, leases.Key(p.ID), func(ctx context.Context, _ leases.Lease) error {
		var err error
		op, err = o.Placement.Lifecycle(ctx, p.ID, placement.KindRollback)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return problem(abierrors.NotFound, fmt.Sprintf("project %q has no placement", p.Name))
	}
	if perr := orchestrationProblem(err); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	s.log.Info("provider rollback enqueued", "project", p.Name, "operation_id", op.ID)
	return c.JSON(http.StatusCreated, apiOperation(op))
}

// deletePlacement runs the project-delete workflow of the project's orchestration state under the
// project lease ([placement.Service.Delete]): 200 once done, 202 while the provider's delete
// operation runs (call again). Repeating the call is safe at every step.
func (s *Server) deletePlacement(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	var res *placement.DeleteResult
	err = o.Leases.Hold(ctx, leases.Key(p.ID), func(ctx context.Context, _ leases.Lease) error {
		var err error
		res, err = o.Placement.Delete(ctx, p.ID)
		return err
	})
	if errors.Is(err, operations.ErrProjectLive) {
		return problem(abierrors.RevisionConflict, "operations were enqueued while the project was being deleted; call again")
	}
	if perr := orchestrationProblem(err); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	s.log.Info("project placement delete", "project", p.Name, "status", res.Status, "revoked", res.Revoked)
	out := client.PlacementDeletion{Project: p.Name, Status: res.Status, ProviderOperation: res.ProviderOperation,
		ProviderState: res.ProviderState, Revoked: res.Revoked}
	if res.Status == placement.DeleteWaitingProvider {
		return c.JSON(http.StatusAccepted, out)
	}
	return c.JSON(http.StatusOK, out)
}
