package runner

import (
	"context"
	"encoding/json"
	"fmt"

	abirunner "github.com/berthhq/berth/abi/runner"
)

// Provider is the smaller contract a runtime integration implements when it runs projects placed
// with provider placement (docs/runner-protocol.md sections 6.2 and 6.3). [ProviderExecute] turns
// it into an [ExecuteFunc]: it accepts only the canonical kinds, verifies release content and the
// runtime capsule before any Provider method is called, derives lifecycle confirmations itself,
// reports the observation, and never hands the provider a node credential or a lease token.
//
// Every method must stop when ctx is cancelled and make its mutations idempotent under
// (OperationID, Fence): a method may run again for the same operation after a crash, and a lower
// fence than one already seen for the project must be refused.
type Provider interface {
	// Reconcile brings the project to the request's generation, release and run state.
	Reconcile(ctx context.Context, req ReconcileRequest) (json.RawMessage, error)
	// Rollback returns the project to what it ran before req.Generation.
	Rollback(ctx context.Context, req LifecycleRequest) error
	// Delete removes everything the provider holds for the project.
	Delete(ctx context.Context, req LifecycleRequest) error
}

// ReconcileRequest is what [Provider.Reconcile] receives: verified content only.
type ReconcileRequest struct {
	OperationID string
	ProjectID   string
	Fence       int64
	Generation  int64
	Release     string
	State       string
	// Artifact is the verified release bundle, nil when the release is not a bundle digest.
	Artifact *Artifact
	// Runtime is the verified capsule bound to this operation, nil for a reconcile that does not
	// select the runtime call. It holds application secrets.
	Runtime *abirunner.RuntimeCapsule
}

// LifecycleRequest is what [Provider.Rollback] and [Provider.Delete] receive.
type LifecycleRequest struct {
	OperationID string
	ProjectID   string
	Fence       int64
	Generation  int64
	// Confirmation is derived by the runner after the lease was validated: "rollback <project>
	// <generation>" or "delete <project>".
	Confirmation string
}

// ProviderExecute returns the ExecuteFunc that drives p:
//
//  1. reconcile: download and verify the artifact of a bundle release, then (for a payload that
//     selects it) the runtime capsule, verified and bound to the operation; call Reconcile; report
//     the observation of the generation; return the provider's bounded, non-secret result;
//  2. rollback and delete: derive the confirmation after validating the lease, call Rollback or
//     Delete; no artifact, runtime or observation;
//  3. any other kind fails without calling p.
func ProviderExecute(p Provider) ExecuteFunc {
	return func(ctx context.Context, t *Task) (json.RawMessage, error) {
		op := t.Operation
		switch op.Kind {
		case abirunner.KindRollback, abirunner.KindDelete:
			confirm, err := t.Confirmation(ctx)
			if err != nil {
				return nil, err
			}
			var lp abirunner.LifecyclePayload
			_ = json.Unmarshal(op.Payload, &lp) // Confirmation checked it
			req := LifecycleRequest{OperationID: op.ID, ProjectID: op.ProjectID, Fence: op.Fence, Generation: lp.Generation, Confirmation: confirm}
			if op.Kind == abirunner.KindDelete {
				err = p.Delete(ctx, req)
			} else {
				err = p.Rollback(ctx, req)
			}
			if err != nil {
				return nil, err
			}
			return json.Marshal(map[string]any{"kind": op.Kind, "generation": lp.Generation})
		case abirunner.KindReconcile:
		default:
			return nil, fmt.Errorf("runner: provider: operation kind %q is not reconcile, rollback or delete", op.Kind)
		}
		var rp abirunner.ReconcilePayload
		if err := json.Unmarshal(op.Payload, &rp); err != nil || rp.Generation < 1 {
			return nil, fmt.Errorf("runner: provider: reconcile %s: payload without a generation", op.ID)
		}
		req := ReconcileRequest{OperationID: op.ID, ProjectID: op.ProjectID, Fence: op.Fence, Generation: rp.Generation,
			Release: rp.Release, State: rp.State}
		if len(rp.Release) > len("sha256:") && rp.Release[:len("sha256:")] == "sha256:" {
			art, err := t.Artifact(ctx)
			if err != nil {
				return nil, err
			}
			if art.Digest != rp.Release {
				return nil, fmt.Errorf("runner: provider: artifact %s is not release %s: %w", art.Digest, rp.Release, ErrArtifact)
			}
			req.Artifact = art
		}
		if rp.Protocol != "" {
			rt, err := t.Runtime(ctx)
			if err != nil {
				return nil, err
			}
			req.Runtime = rt
		}
		res, err := p.Reconcile(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := t.Observe(ctx, rp.Generation, rp.Release, rp.State); err != nil {
			return nil, err
		}
		return res, nil
	}
}
