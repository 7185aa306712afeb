// Package machines owns cloud machines: the record of each server a provider
// plugin makes for a node, and the durable operations that create it, wait for
// its node to enroll from a join code, bind the two, and delete it
// (docs/machines.md).
package machines

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
)

// Collection holds one document per machine.
const Collection = "machines"

// Operation constants (docs/machines.md section 3): every machine operation is
// in the fence sequence of project ProjectID and targeted at Target, so no
// runner node claims it; berthd's machine worker does.
const (
	KindCreate = "machine.create"
	KindDelete = "machine.delete"
	ProjectID  = "machines"
	Target     = "core:machines"
)

// NodeLabel is the label a machine's node carries: the machine id. The join
// code made for the machine gives it, so the worker finds the node whichever
// of its codes the server booted with.
const NodeLabel = "berth-machine"

// States of a machine.
type State string

// Machine states (docs/machines.md section 2).
const (
	Provisioning State = "provisioning" // the create operation runs: server, join code, enrollment
	Ready        State = "ready"        // its node enrolled and is bound
	Failed       State = "failed"       // the create failed for good; the server was deleted
	Deleting     State = "deleting"     // the delete operation runs
	Deleted      State = "deleted"      // the server is gone
)

// Terminal reports whether s is failed or deleted.
func (s State) Terminal() bool { return s == Failed || s == Deleted }

// Machine is a document in [Collection].
type Machine struct {
	ID        string            `bson:"_id" json:"id"`
	Provider  string            `bson:"provider" json:"provider"`
	Type      string            `bson:"type" json:"type"`
	Location  string            `bson:"location" json:"location"`
	Image     string            `bson:"image" json:"image"`
	Labels    map[string]string `bson:"labels,omitempty" json:"labels,omitempty"`
	State     State             `bson:"state" json:"state"`
	NodeID    string            `bson:"node_id,omitempty" json:"node_id,omitempty"`
	Operation string            `bson:"operation" json:"operation"`
	// Status is what the running operation is doing or waiting for.
	Status    string    `bson:"status,omitempty" json:"status,omitempty"`
	LastError string    `bson:"last_error,omitempty" json:"last_error,omitempty"`
	CreatedAt time.Time `bson:"created_at" json:"created_at"`
	// JoinBy is when the create gives up waiting for the node to enroll.
	JoinBy    time.Time `bson:"join_by" json:"join_by"`
	UpdatedAt time.Time `bson:"updated_at" json:"updated_at"`
	Revision  int64     `bson:"revision" json:"revision"`
}

// Provider is what the package needs of a machine provider plugin;
// *host/plugin.Provider is one.
type Provider interface {
	Plan(ctx context.Context, req *abiprovider.PlanRequest) (*abiprovider.PlanResponse, error)
	Apply(ctx context.Context, req *abiprovider.ApplyRequest) (*abiprovider.ApplyResponse, error)
	Delete(ctx context.Context, req *abiprovider.DeleteRequest) (*abiprovider.DeleteResponse, error)
}

// Joins makes join codes for machines and tells when their node enrolled;
// *nodes.Registry is one.
type Joins interface {
	CreateJoin(ctx context.Context, req nodes.JoinRequest) (nodes.Join, error)
	List(ctx context.Context) ([]nodes.Node, error)
}

// Errors of [Machines].
var (
	// ErrInvalid is returned by Create for a request it refuses.
	ErrInvalid = errors.New("berth: invalid machine request")
	// ErrNotFound is returned for an unknown machine id.
	ErrNotFound = errors.New("berth: machine not found")
	// ErrNoProvider is returned by Create for a provider berthd does not run.
	ErrNoProvider = errors.New("berth: machine provider not configured")
)

// Config configures [New]. Store, Queue and Joins are required.
type Config struct {
	Store *store.Store
	Queue *operations.Queue
	Joins Joins
	// Providers are the machine providers by name ("hetzner") with their
	// resource type; none refuses every create.
	Providers map[string]ProviderEntry
	// JoinScript renders the cloud-init user data that sets a server up with
	// a join code (the one-line join command under runcmd). Required with
	// any provider.
	UserData func(code string) string
	// JoinTimeout bounds how long a create waits for the node to enroll
	// after the machine was recorded; 0 means 15 min.
	JoinTimeout time.Duration
	// Poll is how often the worker looks for due work and a waiting create
	// for its node; 0 means 2 s.
	Poll time.Duration
	// Image is the server image when a request names none; "" means ubuntu-24.04.
	Image string
	// Logger receives a line per step; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ProviderEntry is one machine provider: the plugin and the resource type
// its servers are.
type ProviderEntry struct {
	Plugin       Provider
	ResourceType string
}

// Machines owns the machines collection and runs the machine worker. Safe for
// concurrent use by several berthd processes on one store: every change of a
// machine is one compare-and-set on its document, and each operation is
// executed under its lease and fence.
type Machines struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}
}

// New returns Machines over cfg. It does no I/O.
func New(cfg Config) (*Machines, error) {
	if cfg.Store == nil || cfg.Queue == nil || cfg.Joins == nil {
		return nil, errors.New("machines: store, queue and joins are required")
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 15 * time.Minute
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.Image == "" {
		cfg.Image = "ubuntu-24.04"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Machines{cfg: cfg, log: cfg.Logger.With("component", "machines"), wake: make(chan struct{}, 1)}, nil
}

// CreateRequest asks for one machine.
type CreateRequest struct {
	Provider string            `json:"provider"`
	Type     string            `json:"type"`
	Location string            `json:"location"`
	Image    string            `json:"image,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// IdempotencyKey, when not empty, makes a repeat of the request return
	// the first machine (the machine id is derived from it).
	IdempotencyKey string `json:"-"`
}

var word = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Create records a machine in state provisioning and enqueues its create
// operation, in that order: the record first, so a server is never made for
// a machine Berth does not know. With an idempotency key a repeat returns the
// first machine. Errors: wrapping ErrInvalid or ErrNoProvider, or a store or
// queue error.
func (m *Machines) Create(ctx context.Context, req CreateRequest) (*Machine, error) {
	if _, ok := m.cfg.Providers[req.Provider]; !ok {
		return nil, fmt.Errorf("%w: %q (berthd runs: %s)", ErrNoProvider, req.Provider, strings.Join(slices.Sorted(maps.Keys(m.cfg.Providers)), ", "))
	}
	if req.Image == "" {
		req.Image = m.cfg.Image
	}
	for name, v := range map[string]string{"type": req.Type, "location": req.Location, "image": req.Image} {
		if !word.MatchString(v) {
			return nil, fmt.Errorf("%w: %s %q is not a name", ErrInvalid, name, v)
		}
	}
	if err := nodes.JoinCodeLabels(req.Labels); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, ok := req.Labels[NodeLabel]; ok {
		return nil, fmt.Errorf("%w: label %s is set by Berth", ErrInvalid, NodeLabel)
	}
	id := newMachineID(req.IdempotencyKey)
	now := m.cfg.Now().UTC()
	mc := &Machine{ID: id, Provider: req.Provider, Type: req.Type, Location: req.Location, Image: req.Image, Labels: req.Labels,
		State: Provisioning, Status: "queued", CreatedAt: now, JoinBy: now.Add(m.cfg.JoinTimeout), UpdatedAt: now}
	if err := m.cfg.Store.Insert(ctx, Collection, mc); err != nil {
		if !store.IsDuplicateKey(err) {
			return nil, fmt.Errorf("machines: record %s: %w", id, err)
		}
		// A repeat of the request: finish what the first one started.
		if mc, err = m.Get(ctx, id); err != nil {
			return nil, err
		}
	}
	payload, _ := json.Marshal(map[string]string{"machine": id}) // cannot fail
	op, _, err := m.cfg.Queue.Enqueue(ctx, operations.EnqueueRequest{ProjectID: ProjectID, Kind: KindCreate, IdempotencyKey: KindCreate + "/" + id,
		Payload: payload, TargetNode: Target, MaxAttempts: 10})
	if err != nil {
		return nil, fmt.Errorf("machines: enqueue the create of %s: %w", id, err)
	}
	if mc.Operation == "" {
		if err := m.update(ctx, id, func(cur *Machine) bool { cur.Operation = op.ID; return true }); err != nil {
			return nil, err
		}
		mc.Operation = op.ID
	}
	m.Wake()
	return mc, nil
}

// newMachineID is "m-" and 20 lower-case base32 characters: random, or
// derived from the request's idempotency key. It is a DNS label, as server
// names must be.
func newMachineID(key string) string {
	var b [16]byte
	if key == "" {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	} else {
		b = keySum(key)
	}
	return "m-" + strings.ToLower(base32NoPad.EncodeToString(b[:]))[:20]
}

// Get returns one machine. Errors: wrapping ErrNotFound.
func (m *Machines) Get(ctx context.Context, id string) (*Machine, error) {
	var mc Machine
	err := m.cfg.Store.Get(ctx, Collection, id, &mc)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("machine %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("machines: get %s: %w", id, err)
	}
	return &mc, nil
}

// List returns every machine, oldest first.
func (m *Machines) List(ctx context.Context) ([]Machine, error) {
	var out []Machine
	if err := m.cfg.Store.All(ctx, Collection, &out); err != nil {
		return nil, fmt.Errorf("machines: %w", err)
	}
	slices.SortFunc(out, func(a, b Machine) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// ByNode returns the machine bound to node id. Errors: wrapping ErrNotFound.
func (m *Machines) ByNode(ctx context.Context, nodeID string) (*Machine, error) {
	all, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].NodeID == nodeID {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("no machine is bound to node %s: %w", nodeID, ErrNotFound)
}

// Delete marks machine id deleting and enqueues the deletion of its server.
// Idempotent: a machine already deleting or deleted is returned as it is.
func (m *Machines) Delete(ctx context.Context, id string) (*Machine, error) {
	mc, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if mc.State == Deleted {
		return mc, nil
	}
	payload, _ := json.Marshal(map[string]string{"machine": id}) // cannot fail
	op, _, err := m.cfg.Queue.Enqueue(ctx, operations.EnqueueRequest{ProjectID: ProjectID, Kind: KindDelete, IdempotencyKey: KindDelete + "/" + id,
		Payload: payload, TargetNode: Target, MaxAttempts: 50})
	if err != nil {
		return nil, fmt.Errorf("machines: enqueue the deletion of %s: %w", id, err)
	}
	err = m.update(ctx, id, func(cur *Machine) bool {
		if cur.State == Deleted || cur.State == Deleting {
			return false
		}
		cur.State, cur.Operation, cur.Status = Deleting, op.ID, "queued"
		return true
	})
	if err != nil {
		return nil, err
	}
	m.Wake()
	return m.Get(ctx, id)
}

// Wake makes the worker look for work at once.
func (m *Machines) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// update applies change to machine id with one compare-and-set on its
// revision, read again after a lost race; change returns false to write
// nothing.
func (m *Machines) update(ctx context.Context, id string, change func(*Machine) bool) error {
	return store.RetryOnConflict(ctx, func() error {
		cur, err := m.Get(ctx, id)
		if err != nil {
			return err
		}
		if !change(cur) {
			return nil
		}
		_, err = m.cfg.Store.SetIfRevision(ctx, Collection, id, cur.Revision, store.Fields{
			"state": cur.State, "node_id": cur.NodeID, "operation": cur.Operation, "status": cur.Status,
			"last_error": cur.LastError, "updated_at": m.cfg.Now().UTC()})
		return err
	})
}
