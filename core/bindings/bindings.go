// Package bindings owns service bindings in the core: the records of the databases and buckets
// services declare, the provider work that makes them (operations on core/operations, executed by
// [Manager.Work]) and the credentials it seals into the service's secrets (docs/bindings.md).
package bindings

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	abibindings "github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one [Binding] per declared binding, by id.
const Collection = "bindings"

// WorkerTarget is the claim target of binding operations: only berthd's binding worker claims
// them, never a runner.
const WorkerTarget = "core:bindings"

// Operation kinds of binding work, visible in `berth get operations`.
const (
	KindApply   = "binding.apply"   // make the resource at a generation and seal its credentials
	KindRelease = "binding.release" // the service no longer declares it: release, keep the data
	KindPurge   = "binding.purge"   // drop the data (berth binding delete --purge)
)

// Binding states.
const (
	StatePending  = "pending"  // its apply operation has not succeeded yet
	StateReady    = "ready"    // made; credentials sealed into the service's secrets
	StateFailed   = "failed"   // the last attempt failed; LastError says why; it is retried
	StateReleased = "released" // no longer declared or deleted without purge; the data is kept
	StatePurged   = "purged"   // its data was dropped
)

// Spec is one entry of a service's `bindings:`.
type Spec struct {
	Name string `bson:"name" json:"name"` // DNS label, unique within the service
	Kind string `bson:"kind" json:"kind"` // postgres | mongodb | s3
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// Validate checks a service's bindings: each name a DNS label of at most 32 characters used once
// (binding_name_clash), each kind one of postgres, mongodb, s3 (binding_kind_unknown). Errors are
// *abierrors.Error with those codes (422).
func Validate(specs []Spec) error {
	seen := map[string]bool{}
	for _, s := range specs {
		if !nameRE.MatchString(s.Name) {
			return abierrors.New(abierrors.BindingNameClash, fmt.Sprintf("binding name %q is not a DNS label of at most 32 characters", s.Name))
		}
		if seen[s.Name] {
			return abierrors.New(abierrors.BindingNameClash, fmt.Sprintf("binding name %q is used twice", s.Name))
		}
		seen[s.Name] = true
		if _, ok := abibindings.Kinds[s.Kind]; !ok {
			return abierrors.New(abierrors.BindingKindUnknown, fmt.Sprintf("binding %q: kind %q is not postgres, mongodb or s3", s.Name, s.Kind))
		}
	}
	return nil
}

// Binding is a document in [Collection]. Revision is its compare-and-set guard. It never holds a
// credential: Secrets names the sealed secrets that do.
type Binding struct {
	ID         string `bson:"_id" json:"id"` // <project id>/<service>/<name>
	ProjectID  string `bson:"project_id" json:"project_id"`
	Project    string `bson:"project" json:"project"`
	Service    string `bson:"service" json:"service"`
	Name       string `bson:"name" json:"name"`
	Kind       string `bson:"kind" json:"kind"`
	Generation int64  `bson:"generation" json:"generation"` // grows on every (re)declaration that needs new work
	State      string `bson:"state" json:"state"`
	Endpoint   string `bson:"endpoint,omitempty" json:"endpoint,omitempty"` // credential-free: host:port or the S3 URL
	Database   string `bson:"database,omitempty" json:"database,omitempty"`
	User       string `bson:"user,omitempty" json:"user,omitempty"`
	Users      string `bson:"users,omitempty" json:"users,omitempty"` // own | unsupported
	LastError  string `bson:"last_error,omitempty" json:"last_error,omitempty"`
	// Failures counts the failed attempts since the last success (for the backoff).
	Failures    int    `bson:"failures,omitempty" json:"failures,omitempty"`
	OperationID string `bson:"operation_id,omitempty" json:"operation_id,omitempty"`
	// Secrets maps the environment variables the service receives to the sealed secrets that
	// hold the credentials, versions pinned (docs/bindings.md section 4).
	Secrets   map[string]secrets.Ref `bson:"secrets,omitempty" json:"secrets,omitempty"`
	UpdatedAt time.Time              `bson:"updated_at" json:"updated_at"`
	Revision  int64                  `bson:"revision" json:"revision"`
}

// ResourceID is the provider resource id: <project name>/<service>/<name>.
func (b *Binding) ResourceID() string { return b.Project + "/" + b.Service + "/" + b.Name }

// Request is the value-free request the grant covers.
func (b *Binding) Request() abibindings.Request {
	return abibindings.Request{Project: b.Project, Service: b.Service, Binding: b.Name, Generation: b.Generation}
}

func bindingID(projectID, service, name string) string { return projectID + "/" + service + "/" + name }

// Config configures a [Manager].
type Config struct {
	Store   *store.Store
	Queue   *operations.Queue
	Secrets *secrets.Store
	// Provider is the Corestore plugin; nil fails every binding operation as unavailable until
	// one is set with [Manager.SetProvider].
	Provider provider.Provider
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// OnReady, optional, is called after a binding became ready with new credentials (the server
	// rolls the service out with them). An error is logged and the call is not repeated.
	OnReady func(ctx context.Context, b *Binding) error
}

// Manager declares bindings, executes their operations and reports them. Safe for concurrent
// use; every state change is one compare-and-set on one binding document.
type Manager struct {
	cfg  Config
	coll *mongo.Collection
	prov providerBox
}

// New returns a Manager; it does no I/O.
func New(cfg Config) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, coll: cfg.Store.Collection(Collection)}
	m.prov.set(cfg.Provider)
	return m
}

// SetProvider replaces the Corestore plugin (after a relaunch); nil means none.
func (m *Manager) SetProvider(p provider.Provider) { m.prov.set(p) }

// Get returns one binding. Errors: wrapping [store.ErrNotFound].
func (m *Manager) Get(ctx context.Context, projectID, service, name string) (*Binding, error) {
	var b Binding
	if err := store.FindByID(ctx, m.coll, bindingID(projectID, service, name), &b); err != nil {
		return nil, fmt.Errorf("bindings: get %s/%s: %w", service, name, err)
	}
	return &b, nil
}

// List returns a project's bindings (service "" for all), sorted by service and name. It scans
// the collection: bindings are few and the listing is an operator's read.
func (m *Manager) List(ctx context.Context, projectID, service string) ([]Binding, error) {
	filter := bson.M{"project_id": projectID}
	if service != "" {
		filter["service"] = service
	}
	cur, err := m.coll.Find(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("bindings: list: %w", err)
	}
	var out []Binding
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("bindings: list: %w", err)
	}
	slices.SortFunc(out, func(a, b Binding) int {
		return strings.Compare(a.Service+"/"+a.Name, b.Service+"/"+b.Name)
	})
	return out, nil
}

// Declare makes a service's bindings match specs (already validated): a new binding, a changed
// kind or a released or purged one gets a new generation and an apply operation; a binding specs
// no longer name gets a release operation (its data is kept). Idempotent: a repeat with the same
// specs enqueues nothing new (operation keys derive from binding and generation). Each binding is
// one insert or one compare-and-set; a crash between a binding's write and its enqueue is
// repaired by the next Declare (the key converges on one operation).
func (m *Manager) Declare(ctx context.Context, projectID, project, service string, specs []Spec) error {
	have, err := m.List(ctx, projectID, service)
	if err != nil {
		return err
	}
	byName := map[string]*Binding{}
	for i := range have {
		byName[have[i].Name] = &have[i]
	}
	for _, s := range specs {
		b, err := m.declareOne(ctx, projectID, project, service, s, byName[s.Name])
		if err != nil {
			return err
		}
		if err := m.enqueue(ctx, b, KindApply); err != nil {
			return err
		}
		delete(byName, s.Name)
	}
	for _, b := range byName {
		if b.State == StateReleased || b.State == StatePurged {
			continue
		}
		if err := m.Release(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// declareOne returns the binding of s at its current generation, writing it when it is new or
// needs new work.
func (m *Manager) declareOne(ctx context.Context, projectID, project, service string, s Spec, cur *Binding) (*Binding, error) {
	now := m.cfg.Now().UTC()
	var out *Binding
	again := false
	err := store.RetryOnConflict(ctx, func() error {
		if again { // a lost race: judge what won
			var err error
			if cur, err = m.Get(ctx, projectID, service, s.Name); err != nil {
				return err
			}
		}
		again = true
		if cur == nil {
			b := &Binding{ID: bindingID(projectID, service, s.Name), ProjectID: projectID, Project: project, Service: service,
				Name: s.Name, Kind: s.Kind, Generation: 1, State: StatePending, UpdatedAt: now}
			_, err := m.coll.InsertOne(ctx, b)
			if store.IsDuplicateKey(err) {
				return fmt.Errorf("bindings: declare %s/%s: declared meanwhile: %w", service, s.Name, store.ErrConflict)
			}
			if err != nil {
				return fmt.Errorf("bindings: declare %s/%s: %w", service, s.Name, err)
			}
			out = b
			return nil
		}
		if cur.Kind == s.Kind && cur.State != StateReleased && cur.State != StatePurged {
			out = cur
			return nil
		}
		set := bson.M{"kind": s.Kind, "generation": cur.Generation + 1, "state": StatePending, "last_error": "",
			"failures": 0, "updated_at": now}
		rev, err := m.cfg.Store.UpdateIfRevision(ctx, m.coll, cur.ID, cur.Revision, bson.M{"$set": set})
		if err != nil {
			return fmt.Errorf("bindings: declare %s/%s: %w", service, s.Name, err)
		}
		next := *cur
		next.Kind, next.Generation, next.State, next.LastError, next.Failures, next.Revision = s.Kind, cur.Generation+1, StatePending, "", 0, rev
		out = &next
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// payload is an operation's input: which binding at which generation. No secrets.
type payload struct {
	BindingID  string `json:"binding_id"`
	Generation int64  `json:"generation"`
}

// opKey is the idempotency key of kind's operation on b at its generation.
func opKey(b *Binding, kind string) string {
	return fmt.Sprintf("%s/%s/%d", kind, b.ID, b.Generation)
}

// maxAttempts bounds a binding operation's attempts: with the backoff capped at 60 s or 5 min
// that is days of retries, and a new generation starts a new operation.
const maxAttempts = 10000

func (m *Manager) enqueue(ctx context.Context, b *Binding, kind string) error {
	raw := fmt.Appendf(nil, `{"binding_id":%q,"generation":%d}`, b.ID, b.Generation)
	op, _, err := m.cfg.Queue.Enqueue(ctx, operations.EnqueueRequest{ProjectID: b.ProjectID, Kind: kind,
		IdempotencyKey: opKey(b, kind), Payload: raw, TargetNode: WorkerTarget, MaxAttempts: maxAttempts})
	if err != nil {
		return fmt.Errorf("bindings: %s %s: %w", kind, b.ID, err)
	}
	if b.OperationID != op.ID {
		_, err := m.cfg.Store.UpdateIf(ctx, m.coll, b.ID, bson.D{{Key: "generation", Value: b.Generation}},
			bson.M{"$set": bson.M{"operation_id": op.ID}, "$inc": bson.M{store.RevisionField: 1}})
		if err != nil {
			return fmt.Errorf("bindings: %s %s: %w", kind, b.ID, err)
		}
	}
	return nil
}

// Release asks for b to be released (its data kept): the binding moves to a new generation in
// state released and a release operation runs Delete without purge.
func (m *Manager) Release(ctx context.Context, b *Binding) error {
	return m.retire(ctx, b, KindRelease)
}

// Purge asks for the data of binding service/name to be dropped (`berth binding delete --purge`):
// a purge operation, fenced by the project's fence sequence like every claim, runs Delete with
// purge. Errors: wrapping [store.ErrNotFound].
func (m *Manager) Purge(ctx context.Context, projectID, service, name string) (*Binding, error) {
	b, err := m.Get(ctx, projectID, service, name)
	if err != nil {
		return nil, err
	}
	if b.State == StatePurged {
		return b, nil
	}
	return b, m.retire(ctx, b, KindPurge)
}

// retire moves b to a new generation in state released and enqueues kind's operation for it.
func (m *Manager) retire(ctx context.Context, b *Binding, kind string) error {
	again := false
	return store.RetryOnConflict(ctx, func() error {
		if again { // a lost race: retire what won
			var err error
			if b, err = m.Get(ctx, b.ProjectID, b.Service, b.Name); err != nil {
				return err
			}
		}
		again = true
		now := m.cfg.Now().UTC()
		set := bson.M{"generation": b.Generation + 1, "state": StateReleased, "last_error": "", "failures": 0, "updated_at": now}
		rev, err := m.cfg.Store.UpdateIfRevision(ctx, m.coll, b.ID, b.Revision, bson.M{"$set": set})
		if err != nil {
			return fmt.Errorf("bindings: %s %s: %w", kind, b.ID, err)
		}
		next := *b
		next.Generation, next.State, next.Revision = b.Generation+1, StateReleased, rev
		return m.enqueue(ctx, &next, kind)
	})
}
