// Package resources owns declared resources: objects of any type a provider plugin declares,
// kept as desired state with generations, made by operations on core/operations and read back
// periodically to find drift (docs/resources.md).
package resources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/host/plugin"
)

// Collection holds one [Resource] per declared resource, by id (<type>/<name>).
const Collection = "resources"

// WorkerTarget is the claim target of resource operations: only berthd's resource worker
// claims them, never a runner.
const WorkerTarget = "core:resources"

// Operation kinds of resource work, visible in `berth get operations`.
const (
	KindApply  = "resource.apply"  // plan and apply one generation's spec
	KindDelete = "resource.delete" // delete the resource (with purge when asked)
)

// Status is where a resource stands (docs/resources.md section 3).
type Status string

// Statuses. Reason says why for failed and drifted; Message is the provider's own words.
const (
	StatusProgressing Status = "progressing" // a generation's operation has not succeeded yet
	StatusReady       Status = "ready"       // the latest generation is applied and the last Read matched it
	StatusFailed      Status = "failed"      // the last attempt failed; retried while attempts last
	StatusDrifted     Status = "drifted"     // a Read differed from what was applied
	StatusDeleting    Status = "deleting"    // a delete operation is under way
)

// Drift answers (a resource's on_drift).
const (
	OnDriftReport    = "report"    // mark drifted, raise an event; change nothing (the default)
	OnDriftReconcile = "reconcile" // also apply the declared spec again, as a new generation
)

// Declaration is what an operator declares (`berth resource apply -f`): a resource of a type a
// provider plugin declares, named within the type, owned by a project, with its spec (a JSON
// object the type's schema describes).
type Declaration struct {
	Type    string          `json:"type"`
	Name    string          `json:"name"`
	Project string          `json:"project,omitempty"`
	Spec    json.RawMessage `json:"spec"`
	// OnDrift is report (default) or reconcile.
	OnDrift string `json:"on_drift,omitempty"`
}

// Resource is a document in [Collection]. Revision is its compare-and-set guard. Spec and
// Applied are canonical JSON strings (the declared spec, with its secret references as
// declared, and the state the provider last returned with secret values masked, see
// [opened.Mask]); neither holds a secret value.
type Resource struct {
	ID         string `bson:"_id" json:"id"` // <type>/<name>
	Type       string `bson:"type" json:"type"`
	Name       string `bson:"name" json:"name"`
	ProjectID  string `bson:"project_id" json:"project_id"`
	Project    string `bson:"project" json:"project"`
	Spec       string `bson:"spec" json:"-"`
	SpecDigest string `bson:"spec_digest" json:"spec_digest"`
	OnDrift    string `bson:"on_drift" json:"on_drift"`
	// Generation grows with every change that needs provider work: a new spec, a delete, a
	// reconcile after drift, a retry after a failed generation.
	Generation        int64  `bson:"generation" json:"generation"`
	AppliedGeneration int64  `bson:"applied_generation" json:"applied_generation"`
	Applied           string `bson:"applied" json:"-"`
	Status            Status `bson:"status" json:"status"`
	Reason            string `bson:"reason,omitempty" json:"reason,omitempty"`
	Message           string `bson:"message,omitempty" json:"message,omitempty"`
	Deleting          bool   `bson:"deleting,omitempty" json:"deleting,omitempty"`
	Purge             bool   `bson:"purge,omitempty" json:"purge,omitempty"`
	OperationID       string `bson:"operation_id,omitempty" json:"operation_id,omitempty"`
	// Outputs are the provider's outputs (its Apply's credentials) published as secrets of the
	// project, by output key (docs/resources.md section 8): names and versions only.
	Outputs map[string]secrets.Ref `bson:"outputs,omitempty" json:"outputs,omitempty"`
	// Drifts counts the drifts found since the resource was declared.
	Drifts     int64     `bson:"drifts,omitempty" json:"drifts,omitempty"`
	ObservedAt time.Time `bson:"observed_at,omitzero" json:"observed_at,omitzero"`
	UpdatedAt  time.Time `bson:"updated_at" json:"updated_at"`
	Revision   int64     `bson:"revision" json:"revision"`
}

// SpecJSON returns the declared spec.
func (r *Resource) SpecJSON() json.RawMessage { return json.RawMessage(r.Spec) }

// AppliedJSON returns the state last applied, nil before the first apply.
func (r *Resource) AppliedJSON() json.RawMessage {
	if r.Applied == "" {
		return nil
	}
	return json.RawMessage(r.Applied)
}

// Types is what the manager needs of berthd's provider registry ([plugin.Types]).
type Types interface {
	Lookup(typ string) (plugin.TypeEntry, bool)
}

// AdmitFunc asks the admission policies bound to hook resource.apply about a resource as it
// would be stored (old is the stored one, nil when new). A refusal is an error whose code is
// policy_denied.
type AdmitFunc func(ctx context.Context, next, old *Resource) error

// Config configures a [Manager]. Store, Queue and Types are required.
type Config struct {
	Store *store.Store
	Queue *operations.Queue
	Types Types
	// Secrets, optional, opens the secrets a spec refers to ("secret:NAME") and holds the
	// outputs a provider publishes; nil refuses specs with references and drops outputs.
	Secrets *secrets.Store
	// Admit, optional, is the resource.apply admission hook; nil admits everything.
	Admit AdmitFunc
	// Events, optional, receives resource.drifted and resource.failed events.
	Events *events.Log
	// Metrics, optional, registers the drift metrics.
	Metrics prometheus.Registerer
	// DriftInterval is the period between two Reads of one resource when its type declares
	// none; zero means DefaultDriftInterval.
	DriftInterval time.Duration
	// ReadsPerPass bounds the Reads of one drift pass; zero means DefaultReadsPerPass.
	ReadsPerPass int
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Defaults of [Config].
const (
	DefaultDriftInterval = 5 * time.Minute
	DefaultReadsPerPass  = 200
)

// Manager declares resources, runs their operations and watches them for drift. Safe for
// concurrent use; every change of a resource is one compare-and-set on its document.
type Manager struct {
	cfg     Config
	metrics *metrics

	mu       sync.Mutex
	nextRead map[string]time.Time // per resource id: when the drift pass reads it next; mu must be held
}

// New returns a Manager; it does no I/O. It panics when Store, Queue or Types is nil or the
// metrics are registered twice (programmer errors at start-up).
func New(cfg Config) *Manager {
	if cfg.Store == nil || cfg.Queue == nil || cfg.Types == nil {
		panic("resources: Config.Store, Queue and Types are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DriftInterval <= 0 {
		cfg.DriftInterval = DefaultDriftInterval
	}
	if cfg.ReadsPerPass <= 0 {
		cfg.ReadsPerPass = DefaultReadsPerPass
	}
	return &Manager{cfg: cfg, metrics: newMetrics(cfg.Metrics), nextRead: map[string]time.Time{}}
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ID returns a resource's id: <type>/<name>. A name is unique within its type across projects,
// because the provider knows the resource by type and name alone.
func ID(typ, name string) string { return typ + "/" + name }

// check resolves d's type and checks its name, spec and on_drift; it returns the type's entry
// and the canonical spec. Errors are *abierrors.Error with code validation_failed (422), naming
// the field.
func (m *Manager) check(d *Declaration) (plugin.TypeEntry, []byte, error) {
	if !nameRE.MatchString(d.Name) {
		return plugin.TypeEntry{}, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("name: %q is not a DNS label", d.Name))
	}
	e, ok := m.cfg.Types.Lookup(d.Type)
	if !ok {
		return e, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("type: no provider plugin of this berthd declares resource type %q (berth resource types lists them)", d.Type))
	}
	if e.Role != "" {
		return e, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("type: resources of type %q are written by berthd's %s role, not declared", d.Type, e.Role))
	}
	switch d.OnDrift {
	case "":
		d.OnDrift = OnDriftReport
	case OnDriftReport, OnDriftReconcile:
	default:
		return e, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("on_drift: %q is not report or reconcile", d.OnDrift))
	}
	spec := bytes.TrimSpace(d.Spec)
	if len(spec) == 0 || spec[0] != '{' || !json.Valid(spec) {
		return e, nil, abierrors.New(abierrors.ValidationFailed, "spec: must be a JSON object")
	}
	if len(spec) > operations.MaxPayloadBytes {
		return e, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("spec: larger than %d bytes", operations.MaxPayloadBytes))
	}
	if err := e.Validate(spec); err != nil {
		var se *plugin.SchemaError
		if errors.As(err, &se) {
			return e, nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s: %s (the schema of %s, declared by plugin %s)", se.Field, se.Reason, d.Type, e.Plugin))
		}
		return e, nil, abierrors.Wrap(abierrors.ValidationFailed, "spec", err)
	}
	canon, err := canonical(spec)
	if err != nil {
		return e, nil, abierrors.Wrap(abierrors.ValidationFailed, "spec", err)
	}
	return e, canon, nil
}

// checkSpecSecrets refuses a spec whose secret references are malformed or name a secret the
// project does not have (validation_failed naming the field and the secret); it opens nothing.
func (m *Manager) checkSpecSecrets(ctx context.Context, projectID, project string, spec []byte) error {
	refs, err := secretRefs(spec)
	if err != nil {
		return err
	}
	return m.checkSecrets(ctx, projectID, project, refs)
}

// canonical re-encodes a JSON document with sorted keys and no insignificant space.
func canonical(raw []byte) ([]byte, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Get returns one resource. Errors: wrapping [store.ErrNotFound].
func (m *Manager) Get(ctx context.Context, typ, name string) (*Resource, error) {
	var r Resource
	if err := m.cfg.Store.Get(ctx, Collection, ID(typ, name), &r); err != nil {
		return nil, fmt.Errorf("resources: get %s: %w", ID(typ, name), err)
	}
	return &r, nil
}

// GetInProject is [Manager.Get] that answers not found for a resource of another project.
func (m *Manager) GetInProject(ctx context.Context, projectID, typ, name string) (*Resource, error) {
	r, err := m.Get(ctx, typ, name)
	if err != nil {
		return nil, err
	}
	if r.ProjectID != projectID {
		return nil, fmt.Errorf("resources: get %s: %w", ID(typ, name), store.ErrNotFound)
	}
	return r, nil
}

// List returns a project's resources (every project's when projectID is empty), sorted by id.
// It reads the whole collection: an operator's listing, never a hot path.
func (m *Manager) List(ctx context.Context, projectID string) ([]Resource, error) {
	var all []Resource
	if err := m.cfg.Store.All(ctx, Collection, &all); err != nil {
		return nil, fmt.Errorf("resources: list: %w", err)
	}
	out := all[:0]
	for _, r := range all {
		if projectID == "" || r.ProjectID == projectID {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Apply declares d for the project (projectID, project): it checks the type, name, spec (against
// the type's schema) and on_drift, asks the resource.apply admission hook, and stores the
// resource at a new generation with an apply operation when the spec or on_drift changed, the
// resource was being deleted, or its last generation failed or drifted. Otherwise it changes
// nothing (and repairs a missing operation). Errors: *abierrors.Error with validation_failed
// (422) naming the field, conflict (409) when the name is taken in another project,
// policy_denied from the hook; nothing is stored then.
func (m *Manager) Apply(ctx context.Context, projectID, project string, d Declaration) (*Resource, error) {
	_, spec, err := m.check(&d)
	if err != nil {
		return nil, err
	}
	if err := m.checkSpecSecrets(ctx, projectID, project, spec); err != nil {
		return nil, err
	}
	id := ID(d.Type, d.Name)
	var out *Resource
	err = store.RetryOnConflict(ctx, func() error {
		now := m.cfg.Now().UTC()
		cur, err := m.Get(ctx, d.Type, d.Name)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if cur != nil && cur.ProjectID != projectID {
			return abierrors.New(abierrors.Conflict, fmt.Sprintf("resource %s belongs to project %s: a name is unique within its type", id, cur.Project))
		}
		next := Resource{ID: id, Type: d.Type, Name: d.Name, ProjectID: projectID, Project: project, Spec: string(spec),
			SpecDigest: digest(spec), OnDrift: d.OnDrift, Generation: 1, Status: StatusProgressing, UpdatedAt: now}
		if cur != nil {
			unchanged := cur.SpecDigest == next.SpecDigest && cur.OnDrift == next.OnDrift && !cur.Deleting &&
				cur.Status != StatusFailed && cur.Status != StatusDrifted
			if unchanged {
				out = cur
				return nil
			}
			next.Generation, next.AppliedGeneration, next.Applied, next.Drifts = cur.Generation+1, cur.AppliedGeneration, cur.Applied, cur.Drifts
			next.ObservedAt, next.Revision, next.Outputs = cur.ObservedAt, cur.Revision, cur.Outputs
		}
		if m.cfg.Admit != nil {
			if err := m.cfg.Admit(ctx, &next, cur); err != nil {
				return err
			}
		}
		if cur == nil {
			if err := m.cfg.Store.Insert(ctx, Collection, &next); err != nil {
				if store.IsDuplicateKey(err) {
					return fmt.Errorf("resources: apply %s: declared meanwhile: %w", id, store.ErrConflict)
				}
				return fmt.Errorf("resources: apply %s: %w", id, err)
			}
		} else {
			rev, err := m.cfg.Store.SetIfRevision(ctx, Collection, id, cur.Revision, store.Fields{
				"project": project, "spec": next.Spec, "spec_digest": next.SpecDigest, "on_drift": next.OnDrift,
				"generation": next.Generation, "status": next.Status, "reason": "", "message": "",
				"deleting": false, "purge": false, "updated_at": now})
			if err != nil {
				return fmt.Errorf("resources: apply %s: %w", id, err)
			}
			next.Revision = rev
		}
		out = &next
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out.Status == StatusProgressing {
		kind := KindApply
		if out.Deleting {
			kind = KindDelete
		}
		if err := m.enqueue(ctx, out, kind); err != nil {
			return nil, err
		}
	}
	return m.Get(ctx, d.Type, d.Name)
}

// Delete asks for the resource to be deleted by its provider (with purge, the data it holds
// too): a new generation in state deleting and a delete operation; the document goes once the
// provider deleted it. Idempotent. Errors: wrapping [store.ErrNotFound].
func (m *Manager) Delete(ctx context.Context, projectID, typ, name string, purge bool) (*Resource, error) {
	var out *Resource
	err := store.RetryOnConflict(ctx, func() error {
		cur, err := m.GetInProject(ctx, projectID, typ, name)
		if err != nil {
			return err
		}
		if cur.Deleting && (cur.Purge || !purge) {
			out = cur
			return nil
		}
		now := m.cfg.Now().UTC()
		rev, err := m.cfg.Store.SetIfRevision(ctx, Collection, cur.ID, cur.Revision, store.Fields{
			"generation": cur.Generation + 1, "status": StatusDeleting, "deleting": true, "purge": purge,
			"reason": "", "message": "", "updated_at": now})
		if err != nil {
			return fmt.Errorf("resources: delete %s: %w", cur.ID, err)
		}
		next := *cur
		next.Generation, next.Status, next.Deleting, next.Purge, next.Revision = cur.Generation+1, StatusDeleting, true, purge, rev
		out = &next
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := m.enqueue(ctx, out, KindDelete); err != nil {
		return nil, err
	}
	return out, nil
}

// payload is an operation's input: which resource at which generation. No secrets.
type payload struct {
	ID         string `json:"resource_id"`
	Generation int64  `json:"generation"`
}

// OpKey is the idempotency key of kind's operation on the resource typ/name at generation: the
// key the provider receives in the mutation, the same for every attempt of that generation.
func OpKey(kind, typ, name string, generation int64) string {
	return fmt.Sprintf("%s/%s/%s/%d", kind, typ, name, generation)
}

// maxAttempts bounds a resource operation's attempts; a new generation starts a new operation.
const maxAttempts = 100

// enqueue records kind's operation for r's generation (idempotent: the key converges on one
// operation) and notes its id on the resource.
func (m *Manager) enqueue(ctx context.Context, r *Resource, kind string) error {
	raw, _ := json.Marshal(payload{ID: r.ID, Generation: r.Generation}) // plain struct: cannot fail
	op, _, err := m.cfg.Queue.Enqueue(ctx, operations.EnqueueRequest{ProjectID: r.ProjectID, Kind: kind,
		IdempotencyKey: OpKey(kind, r.Type, r.Name, r.Generation), Payload: raw, TargetNode: WorkerTarget, MaxAttempts: maxAttempts})
	if err != nil {
		return fmt.Errorf("resources: %s %s: %w", kind, r.ID, err)
	}
	if r.OperationID != op.ID {
		if _, err := m.setAt(ctx, r.ID, r.Generation, store.Fields{"operation_id": op.ID}); err != nil {
			return fmt.Errorf("resources: %s %s: %w", kind, r.ID, err)
		}
		r.OperationID = op.ID
	}
	return nil
}

// setAt sets the fields of set on resource id when it is still at generation, as a
// compare-and-set on its revision (re-read and retried when another write won), and reports
// whether it did.
func (m *Manager) setAt(ctx context.Context, id string, generation int64, set store.Fields) (bool, error) {
	done := false
	err := store.RetryOnConflict(ctx, func() error {
		var r Resource
		err := m.cfg.Store.Get(ctx, Collection, id, &r)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if r.Generation != generation {
			return nil
		}
		if _, err := m.cfg.Store.SetIfRevision(ctx, Collection, id, r.Revision, set); err != nil {
			return err
		}
		done = true
		return nil
	})
	return done, err
}

// event appends a resource event (best effort: the resource's status already says it).
func (m *Manager) event(ctx context.Context, r *Resource, typ string, data map[string]any) {
	if m.cfg.Events == nil {
		return
	}
	data["type"], data["name"], data["generation"] = r.Type, r.Name, r.Generation
	ev := node.Event{Type: typ, Time: m.cfg.Now().UTC(), Source: node.EventSource{Kind: "core"},
		Subject: node.EventRef{Type: "resource", ID: r.ID}, ProjectID: r.ProjectID, Data: data}
	if _, _, err := m.cfg.Events.Append(ctx, ev); err != nil {
		m.cfg.Logger.Warn("resource event not recorded", "resource", r.ID, "event", typ, "error", err)
	}
}
