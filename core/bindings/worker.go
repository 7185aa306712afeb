package bindings

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	abibindings "github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// providerBox holds the current provider.
type providerBox struct {
	mu sync.Mutex
	p  provider.Provider // mu must be held
}

func (b *providerBox) set(p provider.Provider) { b.mu.Lock(); b.p = p; b.mu.Unlock() }
func (b *providerBox) get() provider.Provider  { b.mu.Lock(); defer b.mu.Unlock(); return b.p }

// Backoff of binding work (docs/bindings.md section 9): 5 s after the first failure, doubling,
// capped at 5 min after a refusal (the provider judged the request: the same request gets the
// same answer) and at 60 s after any other failure (a server down, a plugin restarting).
const (
	BackoffBase       = 5 * time.Second
	BackoffRefusalCap = 5 * time.Minute
	BackoffFailureCap = 60 * time.Second
)

// Backoff is the delay before the next attempt after failures failed attempts (1-based).
func Backoff(failures int, refusal bool) time.Duration {
	limit := BackoffFailureCap
	if refusal {
		limit = BackoffRefusalCap
	}
	d := BackoffBase
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// refusal reports whether err is the provider judging the request (a 4xx class: validation,
// grant, conflict), as opposed to a failure that may pass by itself.
func refusal(err error) bool {
	switch abierrors.CodeOf(err) {
	case abierrors.ValidationFailed, abierrors.BindingNotGranted, abierrors.BadRequest, abierrors.Forbidden,
		abierrors.Conflict, abierrors.StaleFencingToken, abierrors.IdempotencyKeyReused, abierrors.NotFound:
		return true
	}
	return false
}

// Work claims up to max binding operations and runs each to its settlement; it returns how many
// it ran. Called by berthd's binding loop ([Manager.Run]); safe to call from several processes
// (each claim is one compare-and-set with a fresh fence from the project's sequence).
func (m *Manager) Work(ctx context.Context, max int) (int, error) {
	claimed, err := m.cfg.Queue.Claim(ctx, WorkerTarget, max, func(o *operations.Operation) bool {
		return strings.HasPrefix(o.Kind, "binding.")
	})
	if err != nil {
		return 0, fmt.Errorf("bindings: claim: %w", err)
	}
	for _, c := range claimed {
		m.run(ctx, c)
	}
	return len(claimed), nil
}

// Run calls Work every interval (and at once) until ctx ends.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := m.Work(ctx, 8)
			if err != nil {
				m.cfg.Logger.Warn("binding work", "error", err)
			}
			if n == 0 || err != nil || ctx.Err() != nil {
				break
			}
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
	b, err := m.getByID(ctx, p.BindingID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && b.Generation != p.Generation) {
		// A newer declaration superseded this work; it has its own operation.
		_, _ = m.cfg.Queue.Complete(ctx, op.ID, h, json.RawMessage(`{"superseded":true}`))
		return
	}
	if err != nil {
		m.settleFailure(ctx, op, h, nil, err)
		return
	}
	result, err := m.execute(ctx, op, b)
	if err != nil {
		m.settleFailure(ctx, op, h, b, err)
		return
	}
	if _, err := m.cfg.Queue.Complete(ctx, op.ID, h, result); err != nil {
		m.cfg.Logger.Warn("binding operation not completed", "operation", op.ID, "binding", b.ID, "error", err)
	}
}

// settleFailure records err on the binding and sets the operation to retry after the backoff of
// its class.
func (m *Manager) settleFailure(ctx context.Context, op operations.Operation, h operations.Holder, b *Binding, err error) {
	msg := fmt.Sprintf("%s: %s", abierrors.CodeOf(err), err.Error())
	failures := 1
	if b != nil {
		failures = b.Failures + 1
		_, werr := m.cfg.Store.UpdateIf(ctx, m.coll, b.ID, bson.D{{Key: "generation", Value: b.Generation}},
			bson.M{"$set": bson.M{"state": failedState(b), "last_error": msg, "failures": failures, "updated_at": m.cfg.Now().UTC()},
				"$inc": bson.M{store.RevisionField: 1}})
		if werr != nil {
			m.cfg.Logger.Warn("binding failure not recorded", "binding", b.ID, "error", werr)
		}
	}
	delay := Backoff(failures, refusal(err))
	if _, ferr := m.cfg.Queue.FailAfter(ctx, op.ID, h, msg, delay); ferr != nil {
		m.cfg.Logger.Warn("binding operation not settled", "operation", op.ID, "error", ferr)
	}
}

// failedState keeps released bindings released while their release or purge retries.
func failedState(b *Binding) string {
	if b.State == StateReleased {
		return StateReleased
	}
	return StateFailed
}

func (m *Manager) getByID(ctx context.Context, id string) (*Binding, error) {
	var b Binding
	if err := store.FindByID(ctx, m.coll, id, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// execute does op's provider work on b; the result is the operation's credential-free result.
func (m *Manager) execute(ctx context.Context, op operations.Operation, b *Binding) (json.RawMessage, error) {
	prov := m.prov.get()
	if prov == nil {
		return nil, abierrors.New(abierrors.Unavailable, "no corestore provider plugin is running")
	}
	typ := abibindings.Kinds[b.Kind]
	mut := pluginapi.Mutation{OperationID: op.ID, IdempotencyKey: op.IdempotencyKey, FencingToken: uint64(op.Fence)}
	switch op.Kind {
	case KindRelease, KindPurge:
		if _, err := prov.Delete(ctx, &provider.DeleteRequest{Type: typ, ID: b.ResourceID(), Purge: op.Kind == KindPurge, Mutation: mut}); err != nil {
			return nil, err
		}
		state := StateReleased
		if op.Kind == KindPurge {
			state = StatePurged
		}
		if err := m.settle(ctx, b, bson.M{"state": state, "secrets": nil}); err != nil {
			return nil, err
		}
		return json.RawMessage(fmt.Sprintf(`{"state":%q}`, state)), nil
	case KindApply:
	default:
		return nil, abierrors.New(abierrors.ValidationFailed, "unknown binding operation "+op.Kind)
	}
	attrs, err := abibindings.DesiredAttributes(typ, b.Request())
	if err != nil {
		return nil, err
	}
	plan, err := prov.Plan(ctx, &provider.PlanRequest{Desired: provider.Resource{Type: typ, ID: b.ResourceID(), Attributes: attrs}})
	if err != nil {
		return nil, err
	}
	resp, err := prov.Apply(ctx, &provider.ApplyRequest{Planned: plan.Planned, Mutation: mut})
	if err != nil {
		return nil, err
	}
	var st abibindings.State
	if err := json.Unmarshal(resp.State.Attributes, &st); err != nil {
		return nil, abierrors.Wrap(abierrors.Internal, "the corestore plugin returned a state that does not decode (a bug in the plugin)", err)
	}
	var creds map[string]string
	if err := json.Unmarshal(resp.Credentials, &creds); err != nil || len(creds) == 0 {
		return nil, abierrors.New(abierrors.Internal, "the corestore plugin returned no credentials (a bug in the plugin)")
	}
	refs, changed, err := m.seal(ctx, b, creds)
	if err != nil {
		return nil, err
	}
	if err := m.settle(ctx, b, bson.M{"state": StateReady, "endpoint": st.Endpoint, "database": st.Database, "user": st.User,
		"users": st.Users, "secrets": refs}); err != nil {
		return nil, err
	}
	if changed && m.cfg.OnReady != nil {
		next := *b
		next.State, next.Endpoint, next.Database, next.User, next.Users, next.Secrets = StateReady, st.Endpoint, st.Database, st.User, st.Users, refs
		if err := m.cfg.OnReady(ctx, &next); err != nil {
			m.cfg.Logger.Warn("binding ready, service not updated", "binding", b.ID, "error", err)
		}
	}
	return json.Marshal(map[string]string{"endpoint": st.Endpoint, "database": st.Database, "users": st.Users})
}

// settle writes set on b (and clears its failure) if b is still at its generation.
func (m *Manager) settle(ctx context.Context, b *Binding, set bson.M) error {
	set["last_error"], set["failures"], set["updated_at"] = "", 0, m.cfg.Now().UTC()
	_, err := m.cfg.Store.UpdateIf(ctx, m.coll, b.ID, bson.D{{Key: "generation", Value: b.Generation}},
		bson.M{"$set": set, "$inc": bson.M{store.RevisionField: 1}})
	if err != nil {
		return fmt.Errorf("bindings: record %s: %w", b.ID, err)
	}
	return nil
}

// EnvName is the environment variable of credential key of binding name:
// BERTH_BINDING_<NAME>_<KEY>, the name upper-cased with '-' as '_'.
func EnvName(name, key string) string {
	return "BERTH_BINDING_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_" + strings.ToUpper(key)
}

// SecretName is the project secret holding credential key of binding name of service: a DNS
// label ("bnd-<service>-<name>-<key>", the key lower-cased with '_' as '-', or a digest of the
// service and name when that is too long).
func SecretName(service, name, key string) string {
	k := strings.ReplaceAll(strings.ToLower(key), "_", "-")
	n := "bnd-" + service + "-" + name + "-" + k
	if len(n) <= 63 {
		return n
	}
	sum := sha256.Sum256([]byte(service + "/" + name))
	return "bnd-" + hex.EncodeToString(sum[:])[:24] + "-" + k
}

// seal stores each credential as a version of its secret (a version only when the value
// changed, so a retried apply adds none) and returns the references by environment variable, and
// whether any value changed.
func (m *Manager) seal(ctx context.Context, b *Binding, creds map[string]string) (map[string]secrets.Ref, bool, error) {
	refs := map[string]secrets.Ref{}
	changed := false
	for _, key := range slices.Sorted(maps.Keys(creds)) {
		name := SecretName(b.Service, b.Name, key)
		sec, v, err := m.cfg.Secrets.Resolve(ctx, b.ProjectID, name, 0)
		if err == nil {
			if cur, err := m.cfg.Secrets.Open(sec, v); err == nil && string(cur) == creds[key] {
				refs[EnvName(b.Name, key)] = secrets.Ref{Secret: name, Version: v.Version}
				continue
			}
		} else if !errors.Is(err, secrets.ErrNotFound) && !errors.Is(err, secrets.ErrVersionNotFound) {
			return nil, false, fmt.Errorf("bindings: seal %s: %w", b.ID, err)
		}
		_, nv, err := m.cfg.Secrets.Put(ctx, b.ProjectID, b.Project, name, []byte(creds[key]), "corestore")
		if err != nil {
			return nil, false, fmt.Errorf("bindings: seal %s: %w", b.ID, err)
		}
		refs[EnvName(b.Name, key)] = secrets.Ref{Secret: name, Version: nv.Version}
		changed = true
	}
	return refs, changed || !maps.Equal(refs, b.Secrets), nil
}
