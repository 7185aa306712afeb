package resources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
)

// Work claims up to max resource operations and runs each to its settlement; it returns how
// many it ran. Safe to call from several processes: each claim is one compare-and-set with a
// fresh fence from the project's sequence, which the provider receives as the fencing token.
func (m *Manager) Work(ctx context.Context, max int) (int, error) {
	claimed, err := m.cfg.Queue.ClaimTargeted(ctx, WorkerTarget, max, func(o *operations.Operation) bool {
		return strings.HasPrefix(o.Kind, "resource.")
	})
	if err != nil {
		return 0, fmt.Errorf("resources: claim: %w", err)
	}
	for _, c := range claimed {
		m.run(ctx, c)
	}
	return len(claimed), nil
}

// Run works the queue every interval (and at once), and runs a drift pass every interval, until
// ctx ends.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for range 64 { // bounded: a full queue yields to the drift pass and to ctx
			n, err := m.Work(ctx, 16)
			if err != nil {
				m.cfg.Logger.Warn("resource work", "error", err)
			}
			if n == 0 || err != nil || ctx.Err() != nil {
				break
			}
		}
		if _, err := m.DriftPass(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("resource drift pass", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// run executes one claimed operation and settles it.
func (m *Manager) run(ctx context.Context, c operations.Claimed) {
	op := c.Operation
	h := operations.Holder{NodeID: WorkerTarget, Token: c.LeaseToken, Fence: op.Fence}
	var p payload
	if err := json.Unmarshal([]byte(op.Payload), &p); err != nil {
		_, _ = m.cfg.Queue.Fail(ctx, op.ID, h, "payload does not decode", false)
		return
	}
	var r Resource
	err := m.cfg.Store.Get(ctx, Collection, p.ID, &r)
	if errors.Is(err, store.ErrNotFound) || (err == nil && r.Generation != p.Generation) {
		// A newer generation superseded this work; it has its own operation.
		_, _ = m.cfg.Queue.Complete(ctx, op.ID, h, json.RawMessage(`{"superseded":true}`))
		return
	}
	if err != nil {
		_, _ = m.cfg.Queue.Fail(ctx, op.ID, h, err.Error(), true)
		return
	}
	mut := pluginapi.Mutation{OperationID: op.ID, IdempotencyKey: op.IdempotencyKey, FencingToken: uint64(op.Fence)}
	result, err := m.execute(ctx, op.Kind, &r, mut, op.Attempts)
	if err != nil {
		m.settleFailure(ctx, op, h, &r, err)
		return
	}
	if _, err := m.cfg.Queue.Complete(ctx, op.ID, h, result); err != nil {
		m.cfg.Logger.Warn("resource operation not completed", "operation", op.ID, "resource", r.ID, "error", err)
	}
}

// retryable reports whether err may pass by itself (the plugin restarting, a server down), as
// opposed to the provider judging the request, which gets the same answer again.
func retryable(err error) bool {
	switch abierrors.CodeOf(err) {
	case abierrors.ValidationFailed, abierrors.BadRequest, abierrors.Forbidden, abierrors.Conflict,
		abierrors.StaleFencingToken, abierrors.IdempotencyKeyReused:
		return false
	}
	return true
}

// settleFailure records err on r (status failed with the provider's message) when r is still at
// its generation, and settles the attempt: retry with the queue's backoff, or failed.
func (m *Manager) settleFailure(ctx context.Context, op operations.Operation, h operations.Holder, r *Resource, err error) {
	msg := err.Error()
	reason := string(abierrors.CodeOf(err))
	status := StatusFailed
	if r.Deleting {
		status = StatusDeleting
	}
	if _, werr := m.setAt(ctx, r.ID, r.Generation,
		store.Fields{"status": status, "reason": reason, "message": msg, "updated_at": m.cfg.Now().UTC()}); werr != nil {
		m.cfg.Logger.Warn("resource failure not recorded", "resource", r.ID, "error", werr)
	}
	if _, ferr := m.cfg.Queue.Fail(ctx, op.ID, h, reason+": "+msg, retryable(err)); ferr != nil {
		m.cfg.Logger.Warn("resource operation not settled", "operation", op.ID, "error", ferr)
	}
	m.metrics.failures.WithLabelValues(r.Type).Inc()
	r.Reason = reason
	m.event(ctx, r, "resource.failed", map[string]any{"reason": reason, "message": msg})
}

// provider returns the provider serving typ.
func (m *Manager) provider(typ string) (provider.Provider, error) {
	e, ok := m.cfg.Types.Lookup(typ)
	if !ok || e.Provider == nil {
		return nil, abierrors.New(abierrors.Unavailable, fmt.Sprintf("no provider plugin of this berthd serves resource type %q", typ))
	}
	return e.Provider, nil
}

// execute does the provider work of kind on r under mut; attempt is the operation's attempt
// (1 for the first). The spec's secret references are opened here, in the operation's work, and
// reach only the provider: what is recorded (applied state, error messages, the result) is
// masked ([opened.Mask]).
func (m *Manager) execute(ctx context.Context, kind string, r *Resource, mut pluginapi.Mutation, attempt int) (json.RawMessage, error) {
	prov, err := m.provider(r.Type)
	if err != nil {
		return nil, err
	}
	switch kind {
	case KindDelete:
		if _, err := prov.Delete(ctx, &provider.DeleteRequest{Type: r.Type, ID: r.Name, Purge: r.Purge, Mutation: mut}); err != nil {
			return nil, err
		}
		if _, err := m.cfg.Store.DeleteWhen(ctx, Collection, r.ID, store.Fields{"generation": r.Generation}); err != nil {
			return nil, fmt.Errorf("resources: forget %s: %w", r.ID, err)
		}
		m.mu.Lock()
		delete(m.nextRead, r.ID)
		m.mu.Unlock()
		return json.RawMessage(`{"deleted":true}`), nil
	case KindApply:
	default:
		return nil, abierrors.New(abierrors.ValidationFailed, "unknown resource operation "+kind)
	}
	spec, err := m.openSecrets(ctx, r)
	if err != nil {
		return nil, err
	}
	current, err := readCurrent(ctx, prov, r)
	if err != nil {
		return nil, spec.maskErr(err)
	}
	plan, err := prov.Plan(ctx, &provider.PlanRequest{Desired: provider.Resource{Type: r.Type, ID: r.Name, Attributes: spec.Spec}, Current: current})
	if err != nil {
		return nil, spec.maskErr(err)
	}
	state := plan.Planned
	var outputs json.RawMessage
	// A retried attempt applies again even when the plan shows no change: the earlier attempt
	// may have applied, and only the replay under the same key returns its outputs.
	if plan.Changes || current == nil || attempt > 1 {
		resp, err := prov.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: mut})
		if err != nil {
			return nil, spec.maskErr(err)
		}
		state, outputs = resp.State, resp.Credentials
	}
	masked, err := spec.Mask(state.Attributes)
	if err == nil {
		masked, err = canonical(masked)
	}
	if err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "the provider returned a state that is not JSON (a bug in the plugin)", err)
	}
	set := store.Fields{}
	if len(bytes.TrimSpace(outputs)) > 0 && !bytes.Equal(bytes.TrimSpace(outputs), []byte("null")) {
		refs, err := m.publish(ctx, r, outputs)
		if err != nil {
			return nil, err
		}
		set["outputs"] = refs
	}
	now := m.cfg.Now().UTC()
	set["status"], set["applied"], set["applied_generation"], set["reason"], set["message"] = StatusReady, string(masked), r.Generation, "", ""
	set["observed_at"], set["updated_at"] = now, now
	ok, err := m.setAt(ctx, r.ID, r.Generation, set)
	if err != nil {
		return nil, fmt.Errorf("resources: record %s: %w", r.ID, err)
	}
	if ok {
		m.scheduleRead(r.ID, r.Type, now)
	}
	return json.Marshal(map[string]any{"generation": r.Generation, "changes": plan.Changes || current == nil})
}

// readCurrent returns the provider's current state of r, nil when it has none.
func readCurrent(ctx context.Context, prov provider.Provider, r *Resource) (*provider.Resource, error) {
	cur, err := prov.Read(ctx, &provider.ReadRequest{Type: r.Type, ID: r.Name})
	if errors.Is(err, provider.ErrNotFound) || abierrors.CodeOf(err) == abierrors.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &cur.State, nil
}

// PlanResult is what applying a declaration would do (`berth resource plan`): the provider's
// current state (nil when the resource does not exist there), its planned state, whether they
// differ, and the difference line by line.
type PlanResult struct {
	Type    string          `json:"type"`
	Name    string          `json:"name"`
	Current json.RawMessage `json:"current,omitempty"`
	Planned json.RawMessage `json:"planned"`
	Changes bool            `json:"changes"`
	Diff    []string        `json:"diff"`
	// Generation is the stored generation (0 for a new resource); an apply of a changed spec
	// would store Generation+1.
	Generation int64 `json:"generation"`
}

// Plan checks d as [Manager.Apply] does (schema, admission) and asks the provider's Plan over
// its current state; it changes nothing. Errors: as Apply's, and the provider's refusal.
func (m *Manager) Plan(ctx context.Context, projectID, project string, d Declaration) (*PlanResult, error) {
	_, spec, err := m.check(&d)
	if err != nil {
		return nil, err
	}
	if err := m.checkSpecSecrets(ctx, projectID, project, spec); err != nil {
		return nil, err
	}
	stored, err := m.Get(ctx, d.Type, d.Name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if stored != nil && stored.ProjectID != projectID {
		return nil, abierrors.New(abierrors.Conflict, fmt.Sprintf("resource %s belongs to project %s", ID(d.Type, d.Name), stored.Project))
	}
	next := &Resource{ID: ID(d.Type, d.Name), Type: d.Type, Name: d.Name, ProjectID: projectID, Project: project, Spec: string(spec), OnDrift: d.OnDrift}
	if m.cfg.Admit != nil {
		if err := m.cfg.Admit(ctx, next, stored); err != nil {
			return nil, err
		}
	}
	prov, err := m.provider(d.Type)
	if err != nil {
		return nil, err
	}
	// The plan is the provider's over the spec as it would be sent, secrets opened; what is
	// answered is masked.
	desired, err := m.openSecrets(ctx, next)
	if err != nil {
		return nil, err
	}
	current, err := readCurrent(ctx, prov, next)
	if err != nil {
		return nil, desired.maskErr(err)
	}
	plan, err := prov.Plan(ctx, &provider.PlanRequest{Desired: provider.Resource{Type: d.Type, ID: d.Name, Attributes: desired.Spec}, Current: current})
	if err != nil {
		return nil, desired.maskErr(err)
	}
	out := &PlanResult{Type: d.Type, Name: d.Name, Changes: plan.Changes || current == nil}
	if stored != nil {
		out.Generation = stored.Generation
	}
	if out.Planned, err = desired.Mask(plan.Planned.Attributes); err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "the provider's plan is not JSON (a bug in the plugin)", err)
	}
	if current != nil {
		if out.Current, err = desired.Mask(current.Attributes); err != nil {
			return nil, abierrors.Wrap(abierrors.Internal, "the provider's state is not JSON (a bug in the plugin)", err)
		}
	}
	if out.Diff, err = Diff(out.Current, out.Planned); err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "the provider's plan is not JSON (a bug in the plugin)", err)
	}
	return out, nil
}
