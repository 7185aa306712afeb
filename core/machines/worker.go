package machines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
)

// Run claims and executes machine operations until ctx ends: at once when
// woken, otherwise every Poll. Each operation runs in its own goroutine (a
// create waits minutes for its node), bounded by how many it claims at once.
func (m *Machines) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Poll)
	defer t.Stop()
	for {
		claimed, err := m.cfg.Queue.ClaimTargeted(ctx, Target, 8, func(o *operations.Operation) bool {
			return o.Kind == KindCreate || o.Kind == KindDelete
		})
		if err != nil && ctx.Err() == nil {
			m.log.Warn("machines: claim operations", "error", err)
		}
		for _, c := range claimed {
			go m.execute(ctx, c)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-t.C:
		}
	}
}

// holder is the lease of a claimed operation, renewed while it runs.
type holder struct {
	m  *Machines
	op operations.Operation
	h  operations.Holder
}

// renew extends the lease; false when it was lost (another berthd reclaimed
// the operation after this one stalled): the caller stops at once.
func (h *holder) renew(ctx context.Context) bool {
	_, err := h.m.cfg.Queue.Renew(ctx, h.op.ID, h.h)
	return err == nil
}

func (m *Machines) execute(ctx context.Context, c operations.Claimed) {
	op := c.Operation
	h := &holder{m: m, op: op, h: operations.Holder{NodeID: op.NodeID, Token: c.LeaseToken, Fence: op.Fence}}
	var p struct {
		Machine string `json:"machine"`
	}
	if err := json.Unmarshal(op.PayloadJSON(), &p); err != nil || p.Machine == "" {
		_, _ = m.cfg.Queue.Fail(ctx, op.ID, h.h, "payload names no machine", false)
		return
	}
	var err error
	switch op.Kind {
	case KindCreate:
		err = m.create(ctx, h, p.Machine)
	case KindDelete:
		err = m.remove(ctx, h, p.Machine)
	}
	if ctx.Err() != nil {
		return // berthd stops: the lease expires and the next claim goes on
	}
	if err == nil {
		_, _ = m.cfg.Queue.Complete(ctx, op.ID, h.h, nil)
		return
	}
	retry := retryable(err)
	m.log.Info("machine operation failed", "operation", op.ID, "kind", op.Kind, "machine", p.Machine, "attempt", op.Attempts, "retry", retry, "error", err)
	if !retry {
		m.fail(ctx, h, p.Machine, err)
	}
	_, _ = m.cfg.Queue.Fail(ctx, op.ID, h.h, err.Error(), retry)
}

// errLeaseLost stops an operation whose lease another berthd took.
var errLeaseLost = abierrors.New(abierrors.Unavailable, "the operation's lease was lost")

// errJoinTimeout is the final failure of a create whose node did not enroll in time.
type errJoinTimeout struct{ after time.Duration }

func (e errJoinTimeout) Error() string {
	return fmt.Sprintf("the machine's node did not enroll within %s of its creation; the server was deleted", e.after)
}

// retryable reports whether a failed attempt is worth another: the provider
// or berthd was unavailable, or the failure has no code of ours. Invalid
// input, refused permissions, exhausted limits and a node that never
// enrolled are final.
func retryable(err error) bool {
	var jt errJoinTimeout
	if errors.As(err, &jt) {
		return false
	}
	switch abierrors.CodeOf(err) {
	case abierrors.ValidationFailed, abierrors.ProviderInvalidInput, abierrors.ProviderForbidden, abierrors.ProviderResourceLimitExceeded,
		abierrors.ProviderNameTaken, abierrors.ProviderActionFailed:
		return false
	}
	return true
}

// mutation is the fenced, idempotent mutation of attempt h.
func (h *holder) mutation(step string) pluginapi.Mutation {
	return pluginapi.Mutation{OperationID: h.op.ID, IdempotencyKey: h.op.ID + "/" + strconv.FormatInt(h.op.Fence, 10) + "/" + step, FencingToken: uint64(h.op.Fence)}
}

// create runs one attempt of a machine's create (docs/machines.md section 3):
//
//  1. a join code for the machine (labels: the machine's and berth-machine=<id>);
//  2. Plan and Apply of its server with that code in its user data: the
//     plugin finds a server an earlier attempt made by its label and adopts
//     it, so no attempt makes a second server;
//  3. wait, renewing the lease, until a node labelled berth-machine=<id>
//     enrolled, and bind it; past the machine's JoinBy, delete the server and
//     fail for good.
func (m *Machines) create(ctx context.Context, h *holder, id string) error {
	mc, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	if mc.State != Provisioning {
		return nil // bound, failed or deleted since
	}
	prov, ok := m.cfg.Providers[mc.Provider]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoProvider, mc.Provider)
	}
	if n := m.nodeOf(ctx, id); n != "" {
		return m.bind(ctx, id, n)
	}
	now := m.cfg.Now()
	if !now.Before(mc.JoinBy) {
		return m.giveUp(ctx, h, mc, prov)
	}
	labels := maps.Clone(mc.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[NodeLabel] = id
	j, err := m.cfg.Joins.CreateJoin(ctx, nodes.JoinRequest{Code: true, TTL: min(mc.JoinBy.Sub(now)+time.Minute, nodes.MaxJoinCodeTTL), Labels: labels, MachineID: id})
	if err != nil {
		return err
	}
	m.status(ctx, id, "creating the server")
	attrs, _ := json.Marshal(map[string]any{"server_type": mc.Type, "image": mc.Image, "location": mc.Location, "labels": mc.Labels,
		"user_data": m.cfg.UserData(j.Secret)}) // plain values: cannot fail
	plan, err := prov.Plugin.Plan(ctx, &abiprovider.PlanRequest{Desired: abiprovider.Resource{Type: prov.ResourceType, ID: id, Attributes: attrs}})
	if err != nil {
		return err
	}
	if !h.renew(ctx) {
		return errLeaseLost
	}
	if _, err := prov.Plugin.Apply(ctx, &abiprovider.ApplyRequest{Planned: plan.Planned, Mutation: h.mutation("apply")}); err != nil {
		return err
	}
	m.log.Info("machine server running; waiting for its node", "machine", id, "join_by", mc.JoinBy)
	m.status(ctx, id, "waiting for the node to enroll")
	t := time.NewTicker(m.cfg.Poll)
	defer t.Stop()
	renewAt := time.Now().Add(m.cfg.Queue.Policy().LeaseTTL / 3)
	for {
		if n := m.nodeOf(ctx, id); n != "" {
			return m.bind(ctx, id, n)
		}
		if !m.cfg.Now().Before(mc.JoinBy) {
			return m.giveUp(ctx, h, mc, prov)
		}
		if time.Now().After(renewAt) {
			if !h.renew(ctx) {
				return errLeaseLost
			}
			renewAt = time.Now().Add(m.cfg.Queue.Policy().LeaseTTL / 3)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// nodeOf returns the id of the node labelled berth-machine=id, or "".
func (m *Machines) nodeOf(ctx context.Context, id string) string {
	ns, err := m.cfg.Joins.List(ctx)
	if err != nil {
		return ""
	}
	for _, n := range ns {
		if n.Labels[NodeLabel] == id && n.Status != nodes.StatusRemoved {
			return n.ID
		}
	}
	return ""
}

// bind records machine id ready with node.
func (m *Machines) bind(ctx context.Context, id, node string) error {
	m.log.Info("machine bound to its node", "machine", id, "node", node)
	return m.update(ctx, id, func(cur *Machine) bool {
		if cur.State != Provisioning {
			return false
		}
		cur.State, cur.NodeID, cur.Status, cur.LastError = Ready, node, "", ""
		return true
	})
}

// giveUp deletes the server of a machine whose node did not enroll in time
// and returns the final error that says so.
func (m *Machines) giveUp(ctx context.Context, h *holder, mc *Machine, prov ProviderEntry) error {
	m.status(ctx, mc.ID, "the node did not enroll in time: deleting the server")
	if _, err := prov.Plugin.Delete(ctx, &abiprovider.DeleteRequest{Type: prov.ResourceType, ID: mc.ID, Mutation: h.mutation("delete")}); err != nil {
		return fmt.Errorf("delete the server of %s, whose node did not enroll: %w", mc.ID, err) // retried
	}
	return errJoinTimeout{after: mc.JoinBy.Sub(mc.CreatedAt)}
}

// remove runs one attempt of a machine's deletion: the server is deleted
// (an absent one is success) and the machine recorded deleted.
func (m *Machines) remove(ctx context.Context, h *holder, id string) error {
	mc, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	if mc.State == Deleted {
		return nil
	}
	prov, ok := m.cfg.Providers[mc.Provider]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoProvider, mc.Provider)
	}
	m.status(ctx, id, "deleting the server")
	if _, err := prov.Plugin.Delete(ctx, &abiprovider.DeleteRequest{Type: prov.ResourceType, ID: id, Mutation: h.mutation("delete")}); err != nil {
		return err
	}
	m.log.Info("machine deleted", "machine", id, "node", mc.NodeID)
	return m.update(ctx, id, func(cur *Machine) bool {
		cur.State, cur.Status = Deleted, ""
		return true
	})
}

// fail records a create's final failure on its machine.
func (m *Machines) fail(ctx context.Context, h *holder, id string, cause error) {
	msg := cause.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	_ = m.update(ctx, id, func(cur *Machine) bool {
		if h.op.Kind != KindCreate || cur.State != Provisioning {
			cur.LastError = msg
			return true
		}
		cur.State, cur.Status, cur.LastError = Failed, "", msg
		return true
	}) // best effort: the operation keeps the reason too
}

// status records what the running operation does (best effort).
func (m *Machines) status(ctx context.Context, id, what string) {
	_ = m.update(ctx, id, func(cur *Machine) bool {
		if cur.Status == what {
			return false
		}
		cur.Status = what
		return true
	})
}
