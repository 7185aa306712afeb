package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

// DefaultRuntimeMaxBytes is the transport's runtime ceiling when [Orchestration.RuntimeMaxBytes] is
// zero: 1 GiB, independent of (and larger than) the artifact ceiling, room for a data snapshot.
const DefaultRuntimeMaxBytes = 1 << 30

// runtimeDeadline bounds the composition of one runtime answer.
const runtimeDeadline = 30 * time.Second

// RuntimeProvider composes the runtime capsule of a leased runtime reconcile operation
// (docs/runner-protocol.md section 6.2): the JSON of an [abirunner.RuntimeCapsule] binding the
// release of the operation's canonical payload to the project's final environment, placement
// intent and managed-ingress identity. It receives a frozen snapshot of the operation without its
// lease token digest and the placement as read after the lease was authenticated. The bytes hold
// application secrets: the provider must not log or store them.
type RuntimeProvider interface {
	Runtime(ctx context.Context, op operations.Operation, p placement.Placement) ([]byte, error)
}

// CatalogRuntime composes runtime capsules from the service catalog: each service's declared
// environment, command, port and replicas, and its domains as ingress routes. Berth holds no
// secret values yet, so every service's Secrets map is empty; a secret store plugs in here.
type CatalogRuntime struct{ Catalog *services.Catalog }

// Runtime implements [RuntimeProvider].
func (r CatalogRuntime) Runtime(ctx context.Context, op operations.Operation, p placement.Placement) ([]byte, error) {
	var rp placement.ReconcilePayload
	if err := json.Unmarshal(op.PayloadJSON(), &rp); err != nil {
		return nil, fmt.Errorf("runtime of %s: canonical payload: %w", op.ID, err)
	}
	projects, err := r.Catalog.ListProjects(ctx)
	if err != nil {
		return nil, fmt.Errorf("runtime of %s: %w", op.ID, err)
	}
	i := slices.IndexFunc(projects, func(x services.Project) bool { return x.ID == op.ProjectID })
	if i < 0 {
		return nil, fmt.Errorf("runtime of %s: project %s: %w", op.ID, op.ProjectID, services.ErrProjectNotFound)
	}
	proj := projects[i]
	svcs, err := r.Catalog.ListServices(ctx, &proj)
	if err != nil {
		return nil, fmt.Errorf("runtime of %s: %w", op.ID, err)
	}
	capsule := abirunner.RuntimeCapsule{
		Version: 1, ProjectID: op.ProjectID, Project: proj.Name, OperationID: op.ID, Fence: op.Fence,
		Generation: rp.Generation, Release: rp.Release, State: string(rp.State), Services: []abirunner.RuntimeService{},
		Placement: abirunner.RuntimePlacement{Mode: string(p.Mode), Region: p.Region, CapacityUnits: p.CapacityUnits, NodeID: p.NodeID},
		Ingress:   abirunner.RuntimeIngress{Identity: "project:" + proj.Name, Routes: []abirunner.RuntimeRoute{}},
	}
	for _, s := range svcs {
		env := map[string]string{}
		for k, v := range s.Env {
			env[k] = v
		}
		capsule.Services = append(capsule.Services, abirunner.RuntimeService{Name: s.Name, Command: s.Command, Port: s.Port,
			Replicas: s.Replicas, Env: env, Secrets: map[string]string{}})
		for _, d := range s.Domains {
			capsule.Ingress.Routes = append(capsule.Ingress.Routes, abirunner.RuntimeRoute{Domain: d, Service: s.Name, Port: s.Port})
		}
	}
	return json.Marshal(capsule)
}

// lifecycleKind reports whether kind is a provider lifecycle operation: no artifact, runtime or
// observation is served for it.
func lifecycleKind(kind string) bool {
	return kind == placement.KindRollback || kind == placement.KindDelete
}

// runnerRuntime answers the runtime capsule of a leased runtime reconcile operation with the same
// authorities as the artifact call: the node credential, the operation's current lease, and a
// provider result for the canonical payload read back from the store, bound to the placement's
// exact current generation. The capsule is bounded by its own ceiling, hashed, and sent only after
// the node and the lease are checked again; it travels only in the body and is never stored.
func (s *Server) runnerRuntime(c echo.Context) error {
	var req abirunner.RuntimeRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	op, h, err := s.runnerOperation(c, req.NodeID, req.OperationID, req.Lease)
	if err != nil {
		return err
	}
	o := s.cfg.Orchestration
	ctx := c.Request().Context()
	var rp placement.ReconcilePayload
	if op.Kind != placement.KindReconcile || json.Unmarshal(op.PayloadJSON(), &rp) != nil || rp.Protocol != placement.RuntimeProtocol {
		return problem(abierrors.ValidationFailed, "the operation does not select the runtime call")
	}
	p, err := o.Placement.Get(ctx, op.ProjectID)
	if errors.Is(err, store.ErrNotFound) {
		return problem(abierrors.ValidationFailed, "the operation does not select the runtime call")
	}
	if err != nil {
		return err
	}
	if !p.Provider || p.NodeID != req.NodeID {
		return problem(abierrors.ValidationFailed, "the operation does not select the runtime call")
	}
	if p.Generation != rp.Generation || p.Release != rp.Release {
		return problem(abierrors.RevisionConflict, "the operation's generation is no longer the placement's current one")
	}
	snap := *op
	snap.TokenDigest = ""
	prov := o.Runtime
	if prov == nil {
		prov = CatalogRuntime{Catalog: s.cfg.Catalog}
	}
	limit := o.RuntimeMaxBytes
	if limit <= 0 {
		limit = DefaultRuntimeMaxBytes
	}
	cctx, cancel := context.WithTimeout(ctx, runtimeDeadline)
	data, err := prov.Runtime(cctx, snap, *p)
	cancel()
	if err != nil {
		return fmt.Errorf("runtime of %s: %w", op.ID, err)
	}
	if int64(len(data)) > limit {
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("the runtime is larger than the transport's ceiling of %d bytes", limit))
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	// Work reclaimed, or a credential rotated, while the runtime was composed gets nothing.
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	if _, err := o.Operations.Check(ctx, req.OperationID, h); err != nil {
		return runnerError(err)
	}
	s.log.Info("runtime sent", "operation_id", op.ID, "node_id", req.NodeID, "generation", rp.Generation, "bytes", len(data))
	hd := c.Response().Header()
	hd.Set(abirunner.HeaderDigest, digest)
	hd.Set(echo.HeaderContentLength, strconv.Itoa(len(data)))
	return c.Blob(http.StatusOK, abirunner.RuntimeMediaType, data)
}
