package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/berthhq/berth/sdk/runner"
)

// Operation kinds the worker executes (docs/backups.md section 4.1).
const (
	OpBackup  = "backup"
	OpRestore = "restore"
	OpDrill   = "drill"
)

// Target is the resource an operation acts on, as the provider resolves a binding.
type Target struct {
	Engine   Engine
	Resource string // the binding's database or bucket
}

// Resolver finds the engine and resource of one binding of a service in a project (its name
// when the operation's payload carries one, as berthd's does, else the project id); the
// Corestore provider answers from its servers' configuration and its binding resources.
type Resolver func(ctx context.Context, projectID, service, binding string, kind Kind) (Target, error)

// WorkerConfig configures [NewWorker]. Agent is the sdk/runner agent configuration without
// Execute (the worker sets it); BaseURL and HTTP reach berthd for the backup calls.
type WorkerConfig struct {
	Agent   runner.AgentConfig
	BaseURL string
	HTTP    *http.Client // nil: http.DefaultClient
	Resolve Resolver
}

// Worker is the Corestore provider's executor of backup, restore and drill operations: a
// runner node (sdk/runner, which claims, renews the lease while an archive streams, and
// settles) whose tasks run [RunBackup], [RunRestore] and [RunDrill] over an
// [HTTPCoordinator]. The core settles a backup at its commit and a drill when it records
// it, so the agent's own completion of those is expected to find the lease gone.
type Worker struct {
	agent *runner.Agent
	cfg   WorkerConfig
	mu    sync.Mutex
	done  map[string]bool // operations the core settled itself; mu must be held
}

// payload is the union of the backup and restore payloads the core writes.
type payload struct {
	BackupID string `json:"backup_id"`
	Project  string `json:"project"`
	Service  string `json:"service"`
	Binding  string `json:"binding"`
	Kind     Kind   `json:"kind"`
	Scratch  string `json:"scratch"`
}

// NewWorker registers (or resumes) the runner node and starts claiming. Close stops it.
func NewWorker(ctx context.Context, cfg WorkerConfig) (*Worker, error) {
	if cfg.Resolve == nil || cfg.BaseURL == "" {
		return nil, errors.New("corestore backup worker: Resolve and BaseURL are required")
	}
	w := &Worker{cfg: cfg, done: map[string]bool{}}
	onErr := cfg.Agent.OnError
	cfg.Agent.OnError = func(err error) {
		if errors.Is(err, runner.ErrLeaseLost) && w.settled(err) {
			return // the core settled the operation with its commit
		}
		if onErr != nil {
			onErr(err)
		}
	}
	cfg.Agent.Execute = w.execute
	a, err := runner.Open(ctx, cfg.Agent)
	if err != nil {
		return nil, err
	}
	w.agent = a
	return w, nil
}

// Close drains the agent (see runner.Agent.Close).
func (w *Worker) Close(ctx context.Context) error { return w.agent.Close(ctx) }

func (w *Worker) settled(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.done {
		if strings.Contains(err.Error(), id) {
			delete(w.done, id)
			return true
		}
	}
	return false
}

func (w *Worker) execute(ctx context.Context, t *runner.Task) (json.RawMessage, error) {
	var p payload
	if err := json.Unmarshal(t.Operation.Payload, &p); err != nil {
		return nil, fmt.Errorf("operation %s payload: %w", t.Operation.ID, err)
	}
	cred, err := w.cfg.Agent.Credentials.Load(ctx)
	if err != nil {
		return nil, err
	}
	co := &HTTPCoordinator{BaseURL: w.cfg.BaseURL, Credential: cred.Token, Lease: t.Lease(), HTTP: w.cfg.HTTP}
	project := p.Project
	if project == "" {
		project = t.Operation.ProjectID
	}
	tg, err := w.cfg.Resolve(ctx, project, p.Service, p.Binding, p.Kind)
	if err != nil {
		return nil, fmt.Errorf("resolve %s/%s: %w", p.Service, p.Binding, err)
	}
	switch t.Operation.Kind {
	case OpBackup:
		err = RunBackup(ctx, tg.Engine, tg.Resource, co)
		w.markSettled(t.Operation.ID)
	case OpDrill:
		_, err = RunDrill(ctx, tg.Engine, ScratchResource(p.Kind, p.Scratch), co)
		w.markSettled(t.Operation.ID)
	case OpRestore:
		into, scratch := tg.Resource, p.Scratch != ""
		if scratch {
			into = ScratchResource(p.Kind, p.Scratch)
		}
		err = RunRestore(ctx, tg.Engine, into, scratch, restoreCoordinator{co})
	default:
		return nil, fmt.Errorf("operation kind %q is not a backup operation", t.Operation.Kind)
	}
	if err != nil {
		return nil, err
	}
	return json.RawMessage(`{"ok":true}`), nil
}

func (w *Worker) markSettled(id string) {
	w.mu.Lock()
	w.done[id] = true
	w.mu.Unlock()
}

// restoreCoordinator leaves the restore's settlement to the agent.
type restoreCoordinator struct{ *HTTPCoordinator }

func (restoreCoordinator) Restored(context.Context) error { return nil }
