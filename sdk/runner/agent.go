package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
)

// DefaultFailureMessage is what the control plane receives for a failed execution unless
// [AgentConfig.FailureMessage] says otherwise: the local error may hold secrets.
const DefaultFailureMessage = "Deployment execution failed."

// ExecuteFunc runs one leased operation. It must stop when ctx is cancelled (the lease was lost,
// the credential rotated, or the shutdown timeout passed) and make every provider mutation
// idempotent under the operation id and its fence. It returns a bounded, non-secret JSON result.
type ExecuteFunc func(ctx context.Context, t *Task) (json.RawMessage, error)

// AgentConfig configures [Open]. Client, NodeID and Execute are required.
type AgentConfig struct {
	Client *Client
	// NodeID and Declaration are what the node registers and advertises.
	NodeID      string
	Declaration abirunner.Declaration
	// RegistrationToken is a one-time enrollment token (bre_), needed at first enrollment or for a
	// deliberate credential rotation only; empty otherwise.
	RegistrationToken string
	// Credentials keeps the node credential; nil keeps it in memory.
	Credentials Credentials
	// Concurrency is how many operations run at once; zero means 1.
	Concurrency int
	// ShutdownTimeout bounds [Agent.Close]'s grace period, after which remaining work is aborted
	// and abandoned for fenced reclamation; zero means 30 s.
	ShutdownTimeout time.Duration
	// PollInterval is the pause between claims that found nothing; zero means 1 s.
	PollInterval time.Duration
	Execute      ExecuteFunc
	// OnError receives local failures (executor errors, lost leases, uncertain completions,
	// authentication failures); nil logs them.
	OnError func(error)
	// FailureMessage turns an executor error into the bounded, non-secret text the control plane
	// receives; nil sends [DefaultFailureMessage].
	FailureMessage func(error) string
	// Logger is for the loop's own notes; nil discards.
	Logger *slog.Logger
}

// Agent is a running runner loop (docs/runner-protocol.md section 7). Lifecycle:
//
//  1. [Open] authenticates (enrolling when needed), heartbeats and clears draining;
//  2. the loop heartbeats, claims while it has free slots, runs each operation with lease renewal
//     during execution and settlement, and settles it;
//  3. [Agent.Close] drains, or a rotated credential stops it; [Agent.Done] is closed at the end.
type Agent struct {
	cfg   AgentConfig
	c     *Client
	cred  Credential
	ttl   time.Duration // operation lease TTL
	nodeT time.Duration // node TTL

	life      context.Context
	abort     context.CancelCauseFunc
	claimStop chan struct{}
	stopOnce  sync.Once
	slots     chan struct{}
	tasks     sync.WaitGroup
	done      chan struct{}
	mu        sync.Mutex
	closing   bool
	err       error
}

// ErrAbandoned is the cause given to executions still running when the shutdown timeout passes.
var ErrAbandoned = errors.New("berth: shutdown timeout: work abandoned for reclamation")

// Open starts an agent. With no stored credential (or one for another node id) it enrolls with
// RegistrationToken and saves the credential. A stored credential that the server refuses fails
// Open unless RegistrationToken is given, in which case the credential is cleared, the node
// re-enrolls and the replacement is saved atomically.
func Open(ctx context.Context, cfg AgentConfig) (*Agent, error) {
	if cfg.Client == nil || cfg.Execute == nil || cfg.NodeID == "" {
		return nil, errors.New("runner: Client, NodeID and Execute are required")
	}
	if cfg.Credentials == nil {
		cfg.Credentials = &MemoryCredentials{}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnError == nil {
		log := cfg.Logger
		cfg.OnError = func(err error) { log.Error("runner", "err", err) }
	}
	if cfg.FailureMessage == nil {
		cfg.FailureMessage = func(error) string { return DefaultFailureMessage }
	}
	a := &Agent{cfg: cfg, c: cfg.Client, claimStop: make(chan struct{}), slots: make(chan struct{}, cfg.Concurrency), done: make(chan struct{})}
	cred, err := cfg.Credentials.Load(ctx)
	switch {
	case errors.Is(err, ErrNoCredential) || (err == nil && cred.NodeID != cfg.NodeID):
		if cred, err = a.enroll(ctx); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	}
	a.cred = cred
	hb, err := a.heartbeat(ctx, true, false)
	if errors.Is(err, ErrUnauthenticated) && cfg.RegistrationToken != "" {
		if err := cfg.Credentials.Clear(ctx); err != nil {
			return nil, err
		}
		if a.cred, err = a.enroll(ctx); err != nil {
			return nil, err
		}
		hb, err = a.heartbeat(ctx, true, false)
	}
	if err != nil {
		return nil, fmt.Errorf("runner: startup heartbeat: %w", err)
	}
	a.ttl = time.Duration(hb.LeaseTTLSeconds * float64(time.Second))
	a.nodeT = time.Duration(hb.NodeTTLSeconds * float64(time.Second))
	a.life, a.abort = context.WithCancelCause(context.WithoutCancel(ctx))
	hbDone, claimDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(hbDone); a.heartbeatLoop() }()
	go func() { defer close(claimDone); a.claimLoop() }()
	go func() {
		// Heartbeats go on while draining, until the last execution returned.
		<-claimDone
		a.tasks.Wait()
		a.abort(nil)
		<-hbDone
		close(a.done)
	}()
	return a, nil
}

func (a *Agent) enroll(ctx context.Context) (Credential, error) {
	if a.cfg.RegistrationToken == "" {
		return Credential{}, fmt.Errorf("runner: node %s has no stored credential and no registration token: %w", a.cfg.NodeID, ErrNoCredential)
	}
	r, err := a.c.Register(ctx, a.cfg.RegistrationToken, a.cfg.NodeID, a.cfg.Declaration)
	if err != nil {
		return Credential{}, fmt.Errorf("runner: enroll %s: %w", a.cfg.NodeID, err)
	}
	c := Credential{NodeID: a.cfg.NodeID, Token: r.Credential}
	if err := a.cfg.Credentials.Save(ctx, c); err != nil {
		return Credential{}, fmt.Errorf("runner: save the credential of %s: %w", a.cfg.NodeID, err)
	}
	return c, nil
}

func (a *Agent) heartbeat(ctx context.Context, declare, draining bool) (*abirunner.HeartbeatResponse, error) {
	req := abirunner.HeartbeatRequest{NodeID: a.cfg.NodeID, Draining: &draining}
	if declare {
		d := a.cfg.Declaration
		req.Declaration = &d
	}
	return a.c.Heartbeat(ctx, a.cred.Token, req)
}

// Done is closed once the loop stopped and every execution returned or was abandoned.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Err returns the failure that stopped the agent (a rotated credential), or nil.
func (a *Agent) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// fatal stops claims and renewals, aborts active work and records err (first one wins).
func (a *Agent) fatal(err error) {
	a.mu.Lock()
	first := a.err == nil
	if first {
		a.err = err
	}
	a.mu.Unlock()
	if first {
		a.cfg.OnError(err)
	}
	a.stopClaims()
	a.abort(err)
}

func (a *Agent) stopClaims() { a.stopOnce.Do(func() { close(a.claimStop) }) }

func (a *Agent) isClosing() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closing
}

// Close drains: it marks the node draining, stops new claims, lets accepted work finish while
// heartbeats and renewals continue, and after the shutdown timeout (or ctx's end) aborts what
// remains, abandoning it for fenced reclamation. It returns when [Agent.Done] is closed.
func (a *Agent) Close(ctx context.Context) error {
	a.mu.Lock()
	already := a.closing
	a.closing = true
	a.mu.Unlock()
	if !already {
		a.stopClaims()
		hctx, cancel := context.WithTimeout(ctx, a.c.timeout)
		if _, err := a.heartbeat(hctx, false, true); err != nil && a.life.Err() == nil {
			a.cfg.OnError(fmt.Errorf("runner: mark draining: %w", err))
		}
		cancel()
	}
	t := time.NewTimer(a.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-a.done:
	case <-t.C:
		a.abort(ErrAbandoned)
		<-a.done
	case <-ctx.Done():
		a.abort(ErrAbandoned)
		<-a.done
	}
	return a.Err()
}

func (a *Agent) heartbeatLoop() {
	every := a.nodeT / 3
	if every <= 0 {
		every = 15 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-a.life.Done():
			return
		case <-t.C:
		}
		_, err := a.heartbeat(a.life, false, a.isClosing())
		if errors.Is(err, ErrUnauthenticated) {
			a.fatal(fmt.Errorf("runner: heartbeat: the node credential was refused (rotated or revoked): %w", err))
			return
		}
		if err != nil && a.life.Err() == nil {
			a.cfg.OnError(err)
		}
	}
}

func (a *Agent) claimLoop() {
	freed := make(chan struct{}, 1)
	for {
		select {
		case <-a.claimStop:
			return
		case <-a.life.Done():
			return
		default:
		}
		free := cap(a.slots) - len(a.slots)
		if free == 0 {
			select {
			case <-freed:
			case <-a.claimStop:
				return
			case <-a.life.Done():
				return
			}
			continue
		}
		ops, err := a.c.Claim(a.life, a.cfg.NodeID, a.cred.Token, min(free, abirunner.MaxClaim))
		if errors.Is(err, ErrUnauthenticated) {
			a.fatal(fmt.Errorf("runner: claim: the node credential was refused (rotated or revoked): %w", err))
			return
		}
		if err != nil && !errors.Is(err, ErrDraining) && a.life.Err() == nil {
			a.cfg.OnError(err)
		}
		for _, op := range ops {
			a.slots <- struct{}{}
			a.tasks.Add(1)
			go func() {
				defer a.tasks.Done()
				defer func() {
					<-a.slots
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
				a.run(op)
			}()
		}
		if len(ops) > 0 {
			continue
		}
		t := time.NewTimer(a.cfg.PollInterval)
		select {
		case <-t.C:
		case <-freed:
		case <-a.claimStop:
			t.Stop()
			return
		case <-a.life.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// errLeaseLost is the cause of an execution context whose lease was lost.
var errLeaseLost = fmt.Errorf("runner: %w", ErrLeaseLost)

// run executes one operation with lease renewal during execution and settlement.
func (a *Agent) run(op abirunner.Operation) {
	l := abirunner.Lease{NodeID: a.cfg.NodeID, OperationID: op.ID, LeaseToken: op.LeaseToken, Fence: op.Fence}
	ctx, cancel := context.WithCancelCause(a.life)
	defer cancel(nil)
	renewDone := make(chan struct{})
	stopRenew := make(chan struct{})
	go func() {
		defer close(renewDone)
		every := a.ttl / 3
		if every <= 0 {
			every = 10 * time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stopRenew:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, err := a.c.Renew(ctx, a.cred.Token, l)
			switch {
			case errors.Is(err, ErrLeaseLost):
				cancel(errLeaseLost)
				return
			case errors.Is(err, ErrUnauthenticated):
				a.fatal(fmt.Errorf("runner: renew %s: the node credential was refused (rotated or revoked): %w", op.ID, err))
				return
			case err != nil && ctx.Err() == nil:
				a.cfg.OnError(fmt.Errorf("runner: renew %s: %w", op.ID, err))
			}
		}
	}()
	defer func() { close(stopRenew); <-renewDone }()

	t := &Task{Operation: op, agent: a, lease: l}
	result, xerr := a.cfg.Execute(ctx, t)
	if ctx.Err() != nil {
		// Lease lost, credential rotated or shutdown timeout: never settle through a stale fence.
		a.cfg.OnError(fmt.Errorf("runner: operation %s (fence %d) aborted: %w", op.ID, op.Fence, context.Cause(ctx)))
		return
	}
	if xerr != nil {
		a.cfg.OnError(fmt.Errorf("runner: operation %s (fence %d): %w", op.ID, op.Fence, xerr))
		if err := a.c.Fail(ctx, a.cred.Token, l, a.cfg.FailureMessage(xerr), true); err != nil {
			a.cfg.OnError(fmt.Errorf("runner: report the failure of %s: %w", op.ID, err))
		}
		return
	}
	if err := a.c.Complete(ctx, a.cred.Token, l, result); err != nil {
		// A missing answer is an uncertain outcome: the lease is left to expire rather than
		// turning a possibly committed success into a retry.
		a.cfg.OnError(fmt.Errorf("runner: complete %s (fence %d): outcome uncertain: %w", op.ID, op.Fence, err))
	}
}

// Task is one leased operation handed to [ExecuteFunc].
type Task struct {
	Operation abirunner.Operation
	agent     *Agent
	lease     abirunner.Lease
}

// NewTaskForTest returns the task of op, leased by node nodeID holding credential cred, outside an
// agent loop: for tests of execute functions and of the control plane. Nothing renews its lease.
func NewTaskForTest(c *Client, nodeID, cred string, op abirunner.Operation) *Task {
	return &Task{Operation: op, agent: &Agent{c: c, cred: Credential{NodeID: nodeID, Token: cred}},
		lease: abirunner.Lease{NodeID: nodeID, OperationID: op.ID, LeaseToken: op.LeaseToken, Fence: op.Fence}}
}

// Lease returns the lease the task runs under (its fence orders provider writes).
func (t *Task) Lease() abirunner.Lease { return t.lease }

// Lifecycle reports whether the task is a provider lifecycle operation (rollback or delete).
func (t *Task) Lifecycle() bool {
	return t.Operation.Kind == abirunner.KindRollback || t.Operation.Kind == abirunner.KindDelete
}

// Artifact downloads and verifies the operation's artifact. Errors: [ErrLifecycle] for a
// lifecycle operation; as [Client.Artifact].
func (t *Task) Artifact(ctx context.Context) (*Artifact, error) {
	if t.Lifecycle() {
		return nil, fmt.Errorf("runner: artifact of a %s operation: %w", t.Operation.Kind, ErrLifecycle)
	}
	return t.agent.c.Artifact(ctx, t.agent.cred.Token, t.lease)
}

// Runtime downloads the runtime capsule of a runtime reconcile operation (its canonical payload
// names [abirunner.RuntimeProtocol]), verifies it again and binds it to the operation: the
// capsule must name the operation's id, project and fence and the payload's release and
// generation, or it is refused before the caller sees it. The capsule holds application secrets:
// keep it in memory and out of results, observations and logs (docs/runner-protocol.md section
// 6.2). Errors: [ErrLifecycle], [ErrRuntime], [ErrLeaseLost].
func (t *Task) Runtime(ctx context.Context) (*abirunner.RuntimeCapsule, error) {
	op := t.Operation
	var p abirunner.ReconcilePayload
	if op.Kind != abirunner.KindReconcile || json.Unmarshal(op.Payload, &p) != nil || p.Protocol != abirunner.RuntimeProtocol {
		return nil, fmt.Errorf("runner: runtime of a %s operation that does not select it: %w", op.Kind, ErrLifecycle)
	}
	rb, err := t.agent.c.Runtime(ctx, t.agent.cred.Token, t.lease)
	if err != nil {
		return nil, err
	}
	var c abirunner.RuntimeCapsule
	dec := json.NewDecoder(bytes.NewReader(rb.Bytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return nil, fmt.Errorf("runner: runtime of %s: not a capsule: %w", op.ID, ErrRuntime)
	}
	if c.Version != 1 || c.OperationID != op.ID || c.ProjectID != op.ProjectID || c.Fence != op.Fence ||
		c.Generation != p.Generation || c.Release != p.Release {
		return nil, fmt.Errorf("runner: runtime of %s: the capsule is bound to another operation, project, release or generation: %w", op.ID, ErrRuntime)
	}
	return &c, nil
}

// Confirmation returns the confirmation of a lifecycle operation, derived here from the canonical
// payload after the lease is validated with the control plane: "rollback <project> <generation>" or
// "delete <project>". No caller-supplied text is used. Errors: [ErrLifecycle] for another kind or
// a payload without a generation; [ErrLeaseLost].
func (t *Task) Confirmation(ctx context.Context) (string, error) {
	op := t.Operation
	var p abirunner.LifecyclePayload
	if !t.Lifecycle() || json.Unmarshal(op.Payload, &p) != nil || p.Generation < 1 {
		return "", fmt.Errorf("runner: confirmation of a %s operation: %w", op.Kind, ErrLifecycle)
	}
	if _, err := t.agent.c.Renew(ctx, t.agent.cred.Token, t.lease); err != nil {
		return "", fmt.Errorf("runner: confirmation of %s: %w", op.ID, err)
	}
	if op.Kind == abirunner.KindDelete {
		return "delete " + op.ProjectID, nil
	}
	return fmt.Sprintf("rollback %s %d", op.ProjectID, p.Generation), nil
}

// Observe reports what the node runs for the operation's project (generation checked by the
// control plane). Errors: [ErrLifecycle] for a lifecycle operation.
func (t *Task) Observe(ctx context.Context, generation int64, release, state string) error {
	if t.Lifecycle() {
		return fmt.Errorf("runner: observation of a %s operation: %w", t.Operation.Kind, ErrLifecycle)
	}
	return t.agent.c.Observe(ctx, t.agent.cred.Token, abirunner.ObserveRequest{Lease: t.lease, Generation: generation, Release: release, State: state})
}
