// Package policy owns WebAssembly admission: the module catalog (bytes in the
// blob store), the bindings of modules to hooks, and the decision record.
//
// Every decision is appended to the cluster change log as an entry of type
// policy_decision, which is the record; the collection policy_decisions is a
// query index over those entries, kept for GET /api/v1/policy-decisions
// (docs/wasm-abi.md section 5.5).
package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/abi/node"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// DefaultMaxModuleBytes bounds an uploaded module: 16 MiB.
const DefaultMaxModuleBytes = 16 << 20

// Errors of [Engine] methods.
var (
	ErrModuleNotFound  = errors.New("berth: module not found")
	ErrBindingNotFound = errors.New("berth: policy binding not found")
	ErrInvalidBinding  = errors.New("berth: invalid policy binding")
)

// FailurePolicy says what a failing module (trap, deadline, error answer)
// means for the request it was asked about.
type FailurePolicy string

// Failure policies. Fail (the default) refuses the request: admission fails
// closed. Ignore lets it through with a warning.
const (
	Fail   FailurePolicy = "fail"
	Ignore FailurePolicy = "ignore"
)

// Module is a catalog entry in collection wasm_modules.
type Module struct {
	Digest    string       `bson:"_id" json:"digest"`
	Size      int64        `bson:"size" json:"size"`
	Kind      abiwasm.Kind `bson:"kind" json:"kind"`
	Name      string       `bson:"name" json:"name"`
	Version   string       `bson:"version" json:"version"`
	ABI       string       `bson:"abi" json:"abi"`
	CreatedAt time.Time    `bson:"created_at" json:"created_at"`
}

// BindingEntityType is the change-log entity type of a binding: created
// with the binding as payload, deleted by unbinding or by a newer
// routes.compile binding (docs/wasm-abi.md section 9).
const BindingEntityType = "policy_binding"

// Binding binds a policy module to a hook, for every project (Project empty)
// or one, or a route compiler to abiwasm.HookRoutesCompile (for every
// project, without config). Config is JSON handed to the module unchanged.
// Replaced, set only in Bind's answer, lists the routes.compile bindings the
// new one replaced.
type Binding struct {
	ID            string        `bson:"_id" json:"id"`
	Hook          abiwasm.Hook  `bson:"hook" json:"hook"`
	ModuleDigest  string        `bson:"module_digest" json:"module_digest"`
	Module        string        `bson:"module" json:"module"`
	Project       string        `bson:"project,omitempty" json:"project,omitempty"`
	FailurePolicy FailurePolicy `bson:"failure_policy" json:"failure_policy"`
	Config        string        `bson:"config,omitempty" json:"config,omitempty"`
	CreatedAt     time.Time     `bson:"created_at" json:"created_at"`
	Replaced      []string      `bson:"-" json:"replaced,omitempty"`

	// LogOutbox holds the binding's changes not yet in the change log,
	// written with the change (docs/node-protocol.md section 7.2): its
	// creation, and its deletion once unbound or replaced.
	LogOutbox []changelog.Pending `bson:"log_outbox,omitempty" json:"-"`
	// RemoveOn is the id of the deletion change of a binding that is
	// unbound or replaced ([changelog.RemoveOnField]): such a binding is
	// gone for every reader, and its document is removed once that change
	// is in the log. Empty for a binding in force.
	RemoveOn string `bson:"log_remove_on,omitempty" json:"-"`
	// ReplacedLog is, in Bind's answer, each replaced binding as its
	// deletion left it (for handing its outbox to the log).
	ReplacedLog []Binding `bson:"-" json:"-"`
}

// BindingsCollection holds one document per binding; each carries its
// change-log entries in its outbox until appended.
const BindingsCollection = "policy_bindings"

// live selects the bindings in force: not deleted by a change still on its
// way to the log.
func live(filter bson.M) bson.M {
	filter[changelog.RemoveOnField] = bson.M{"$exists": false}
	return filter
}

// DecisionEntityType is the change-log entity type of a policy decision
// (docs/wasm-abi.md section 5.5): entity id the decision's id, op create,
// payload the [Decision] without Seq.
const DecisionEntityType = "policy_decision"

// Decision is one recorded evaluation: a change-log entry of type
// [DecisionEntityType], indexed in collection policy_decisions. Seq is the
// entry's seq in the change log, zero when the engine has no log or the
// append failed.
type Decision struct {
	ID           string       `bson:"_id" json:"id"`
	Hook         abiwasm.Hook `bson:"hook" json:"hook"`
	BindingID    string       `bson:"binding_id" json:"binding_id"`
	ModuleDigest string       `bson:"module_digest" json:"module_digest"`
	InputSHA256  string       `bson:"input_sha256" json:"input_sha256"`
	Project      string       `bson:"project,omitempty" json:"project,omitempty"`
	Result       string       `bson:"result" json:"result"` // "allow", "deny" or "error"
	Reasons      []string     `bson:"reasons,omitempty" json:"reasons,omitempty"`
	Warnings     []string     `bson:"warnings,omitempty" json:"warnings,omitempty"`
	Error        string       `bson:"error,omitempty" json:"error,omitempty"`
	At           time.Time    `bson:"at" json:"at"`
	Seq          int64        `bson:"seq,omitempty" json:"seq,omitempty"`
}

// Verdict is the combined answer of every binding of a hook: denied when
// one denies (or fails under Fail), with every reason and warning.
type Verdict struct {
	Allowed  bool
	Reasons  []string
	Warnings []string
	// Denials says which module gave which of Reasons, one entry per binding that denied (or
	// failed under failure_policy fail), in binding order.
	Denials []Denial
}

// Denial is one binding's refusal within a [Verdict]: the module's name (its digest when it
// has none) and the reasons it gave.
type Denial struct {
	Module  string
	Reasons []string
}

// DeniedError is returned to API callers for a denied request; core/api
// turns it into policy_denied with Reasons.
type DeniedError struct {
	Hook    abiwasm.Hook
	Reasons []string
	// Denials says which module gave which reasons ([Verdict.Denials]); it may be empty.
	Denials []Denial
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("denied by policy at %s: %s", e.Hook, strings.Join(e.Reasons, "; "))
}

// ChangeAppender appends to the cluster change log; *changelog.Log is one.
// Record appends a change already stored in a document's outbox, or held
// only in memory for the zero Ref (docs/node-protocol.md section 7.2).
type ChangeAppender interface {
	Record(ctx context.Context, ref changelog.Ref, p changelog.Pending) (node.LogEntry, error)
}

// DecisionsCollection holds one document per policy decision, written
// once its change-log entry is stored, with its seq; a decision whose append
// failed carries the entry in its outbox until appended, then its seq.
const DecisionsCollection = "policy_decisions"

// Config wires an Engine. Store, Blobs and Runtime are required.
type Config struct {
	Store   *store.Store
	Blobs   *bundles.Store
	Runtime *hostwasm.Runtime
	// Changelog receives every decision (docs/wasm-abi.md section 5.5); nil
	// records decisions in the policy_decisions index only.
	Changelog ChangeAppender
	// MaxModuleBytes bounds an upload; zero means DefaultMaxModuleBytes.
	MaxModuleBytes int64
	Logger         *slog.Logger
	// Now is the clock of recorded times; nil means time.Now.
	Now func() time.Time
	// Metrics, when not nil, receives berth_policy_evaluations_total,
	// berth_policy_evaluation_duration_seconds and
	// berth_policy_admission_stage_seconds (docs/operating.md "Metrics"). New panics, as
	// MustRegister does, when Metrics holds them already.
	Metrics prometheus.Registerer
}

// Engine evaluates bound policies. It is safe for concurrent use.
type Engine struct {
	cfg       Config
	log       *slog.Logger
	metrics   *metrics // nil without Config.Metrics
	modules   *mongo.Collection
	bindings  *mongo.Collection
	decisions *mongo.Collection

	mu   sync.Mutex
	memo map[string]memoEntry // by binding id + input hash; mu must be held

	recent inputRing // the newest inputs, for RecordedInput

	liveBindings *store.Batcher[struct{}, bindingsRead] // every live binding, read once per burst
	storeRecords *store.Batcher[[]decisionDoc, []bool]  // decisions, written once per burst
}

// bindingsRead is one read of every live binding, oldest first.
type bindingsRead struct {
	bs  []Binding
	err error
}

type memoEntry struct {
	out abiwasm.PolicyOutput
	err string
}

// maxMemo bounds the memo of deterministic answers; it is cleared when full.
const maxMemo = 4096

// New returns an Engine.
func New(cfg Config) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxModuleBytes <= 0 {
		cfg.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Engine{
		cfg: cfg, log: cfg.Logger.With("component", "policy"),
		modules:   cfg.Store.Collection("wasm_modules"),
		bindings:  cfg.Store.Collection(BindingsCollection),
		decisions: cfg.Store.Collection(DecisionsCollection),
		memo:      map[string]memoEntry{},
		metrics:   newMetrics(cfg.Metrics),
	}
	// Both answer each caller from a run that started after it asked (the
	// store's group-commit writer, without its wait: a burst forms while the
	// run before it is in flight).
	e.liveBindings = store.NewBatcher(store.BatchConfig{Size: math.MaxInt32, Wait: -1}, unfailing(e.readBindings))
	e.storeRecords = store.NewBatcher(store.BatchConfig{Size: maxRecordBatch, Wait: -1}, unfailing(e.insertRecords))
	return e
}

// maxRecordBatch bounds the admissions whose decisions one InsertMany
// writes.
const maxRecordBatch = 256

// readBindings reads every live binding, oldest first, for each caller of
// one burst of admissions. It reads the store's read view (docs/store.md
// section 1): no round trip unless a binding was written since the last
// read, and every bind or unbind that finished before the read is seen (one
// through another berthd replica once its change stream delivers it). On
// the embedded store the read no longer queues behind the burst's writes on
// the one connection.
func (e *Engine) readBindings(ctx context.Context, items []struct{}) []bindingsRead {
	var r bindingsRead
	r.err = e.cfg.Store.View().Find(ctx, e.bindings, bson.D{{Key: changelog.RemoveOnField, Value: bson.Null{}}}, &r.bs)
	// The view orders by _id; bindings are combined oldest first.
	slices.SortStableFunc(r.bs, func(a, b Binding) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := make([]bindingsRead, len(items))
	for i := range out {
		out[i] = r
	}
	return out
}

// unfailing adapts a batch run that reports its outcome in its results to a
// [store.FlushFunc].
func unfailing[T, R any](run func(ctx context.Context, items []T) []R) store.FlushFunc[T, R] {
	return func(ctx context.Context, items []T) ([]R, []error) { return run(ctx, items), nil }
}

// bindingsFor returns the live bindings of hook, oldest first, read after
// the call began (a batched read joins only a run that starts later).
func (e *Engine) bindingsFor(ctx context.Context, hook abiwasm.Hook) ([]Binding, error) {
	r, err := e.liveBindings.Do(ctx, struct{}{})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return nil, err
	}
	var out []Binding
	for _, b := range r.bs {
		if b.Hook == hook {
			out = append(out, b)
		}
	}
	return out, nil
}

// MaxModuleBytes is the upload limit in bytes.
func (e *Engine) MaxModuleBytes() int64 { return e.cfg.MaxModuleBytes }

// EnsureIndexes creates the indexes the engine queries by.
func (e *Engine) EnsureIndexes(ctx context.Context) error {
	if _, err := e.bindings.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "hook", Value: 1}}}); err != nil {
		return fmt.Errorf("create policy binding index: %w", err)
	}
	if _, err := e.decisions.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "at", Value: -1}}}); err != nil {
		return fmt.Errorf("create policy decision index: %w", err)
	}
	return nil
}

// PutModule reads a module from r, loads it (which checks it against the
// ABI and compiles it), stores its bytes in the blob store and records it.
// Errors: bundles.ErrTooLarge, an error wrapping hostwasm.ErrBadModule, or a
// store error. Uploading the same bytes again returns the same entry.
func (e *Engine) PutModule(ctx context.Context, r io.Reader) (*Module, error) {
	raw, err := io.ReadAll(io.LimitReader(r, e.cfg.MaxModuleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("receive module: %w", err)
	}
	if int64(len(raw)) > e.cfg.MaxModuleBytes {
		return nil, bundles.ErrTooLarge
	}
	m, err := e.cfg.Runtime.Load(ctx, raw)
	if err != nil {
		return nil, err
	}
	digest, n, err := e.cfg.Blobs.PutBlob(ctx, m.Digest(), bytes.NewReader(raw), e.cfg.MaxModuleBytes)
	if err != nil {
		return nil, err
	}
	meta := m.Metadata()
	rec := &Module{Digest: digest, Size: n, Kind: meta.Kind, Name: meta.Name, Version: meta.Version,
		ABI: m.ABI(), CreatedAt: e.cfg.Now().UTC()}
	var existing Module
	if err := e.modules.FindOne(ctx, bson.M{"_id": digest}).Decode(&existing); err == nil {
		return &existing, nil
	}
	if _, err := e.modules.InsertOne(ctx, rec); err != nil && !store.IsDuplicateKey(err) {
		return nil, fmt.Errorf("record module: %w", err)
	}
	return rec, nil
}

// Modules lists the catalog, newest first.
func (e *Engine) Modules(ctx context.Context) ([]Module, error) {
	cur, err := e.modules.Find(ctx, bson.M{}, options.Find().SetSort(bson.D{{Key: "created_at", Value: -1}}))
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	out := []Module{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	return out, nil
}

// module returns the loaded module of digest, loading it from the blob store
// on first use after a restart.
func (e *Engine) module(ctx context.Context, digest string) (*hostwasm.Module, error) {
	if m, ok := e.cfg.Runtime.Loaded(digest); ok { // no blob read and hash per evaluation
		return m, nil
	}
	raw, err := e.ModuleBytes(digest)
	if err != nil {
		return nil, err
	}
	return e.cfg.Runtime.Load(ctx, raw)
}

// Bind records a binding. A policy binding needs a known policy hook and a
// policy module; config, when not empty, must be JSON. A routes.compile
// binding needs a route-compiler module, no project and no config, its
// failure policy is fail (a failing compiler leaves the last good table), and
// it replaces every older routes.compile binding: at most one is in force,
// the newest (docs/wasm-abi.md section 6.4). Errors: ErrModuleNotFound,
// ErrInvalidBinding, store errors.
func (e *Engine) Bind(ctx context.Context, b Binding) (*Binding, error) {
	want := abiwasm.KindPolicy
	if b.Hook == abiwasm.HookRoutesCompile {
		want = abiwasm.KindRoutes
		if b.Project != "" {
			return nil, fmt.Errorf("%w: the route compiler serves every project; bind %s without a project", ErrInvalidBinding, b.Hook)
		}
		if b.Config != "" {
			return nil, fmt.Errorf("%w: a route compiler takes no config", ErrInvalidBinding)
		}
		if b.FailurePolicy == Ignore {
			return nil, fmt.Errorf("%w: a failing route compiler always leaves the last good table; failure_policy ignore does not apply", ErrInvalidBinding)
		}
	} else if !b.Hook.Valid() {
		return nil, fmt.Errorf("%w: unknown hook %q", ErrInvalidBinding, b.Hook)
	}
	switch b.FailurePolicy {
	case "":
		b.FailurePolicy = Fail
	case Fail, Ignore:
	default:
		return nil, fmt.Errorf("%w: failure_policy %q is neither fail nor ignore", ErrInvalidBinding, b.FailurePolicy)
	}
	if b.Config != "" && !json.Valid([]byte(b.Config)) {
		return nil, fmt.Errorf("%w: config is not JSON", ErrInvalidBinding)
	}
	var m Module
	err := e.modules.FindOne(ctx, bson.M{"_id": b.ModuleDigest}).Decode(&m)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("%w: %s", ErrModuleNotFound, b.ModuleDigest)
	} else if err != nil {
		return nil, fmt.Errorf("find module: %w", err)
	}
	if m.Kind != want {
		return nil, fmt.Errorf("%w: module %s is a %s module; %s takes a %s module", ErrInvalidBinding, m.Name, m.Kind, b.Hook, want)
	}
	// Milliseconds, as the store keeps them: the order of routes.compile
	// bindings compares stored times with this one.
	b.ID, b.Module, b.CreatedAt, b.Replaced = identity.NewID("pbn_"), m.Name, e.cfg.Now().UTC().Truncate(time.Millisecond), nil
	b.LogOutbox, b.RemoveOn, b.ReplacedLog = nil, "", nil
	// The creation's change goes into the binding's outbox, in the insert
	// that commits it (docs/node-protocol.md section 7.2).
	if p, ok, err := logChange(ctx, b.ID, node.OpCreate, b); err != nil {
		return nil, err
	} else if ok {
		b.LogOutbox = []changelog.Pending{p}
	}
	if _, err := e.bindings.InsertOne(ctx, &b); err != nil {
		return nil, fmt.Errorf("record binding: %w", err)
	}
	if b.Hook == abiwasm.HookRoutesCompile {
		replaced, err := e.dropOlderRouteCompilers(ctx, &b)
		if err != nil {
			return nil, err
		}
		for _, o := range replaced {
			b.Replaced = append(b.Replaced, o.ID)
		}
		b.ReplacedLog = replaced
	}
	return &b, nil
}

// logChange prepares the change-log item of a change to binding id when
// ctx carries the actor (changelog.WithActor); ok is false when it carries
// none, and the write records nothing.
func logChange(ctx context.Context, id, op string, payload any) (p changelog.Pending, ok bool, err error) {
	a, ok := changelog.ActorFrom(ctx)
	if !ok {
		return changelog.Pending{}, false, nil
	}
	p, err = changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey, EntityType: BindingEntityType, EntityID: id, Op: op, Payload: payload})
	if err != nil {
		return changelog.Pending{}, false, fmt.Errorf("binding %s: %w", id, err)
	}
	return p, true, nil
}

// remove deletes binding id, once: without an actor in ctx, by deleting
// its document; with one, by one update that marks it removed
// ([changelog.RemoveOnField]) and puts its deletion change in its outbox,
// the commit point of the delete, after which the change log removes the
// document. It returns the binding as that write left it, or
// ErrBindingNotFound when there is none in force (another removal won).
func (e *Engine) remove(ctx context.Context, id string) (*Binding, error) {
	p, ok, err := logChange(ctx, id, node.OpDelete, nil)
	if err != nil {
		return nil, err
	}
	var b Binding
	if !ok {
		err = e.bindings.FindOneAndDelete(ctx, live(bson.M{"_id": id})).Decode(&b)
	} else {
		err = e.bindings.FindOneAndUpdate(ctx, live(bson.M{"_id": id}),
			bson.M{"$set": bson.M{changelog.RemoveOnField: p.ID}, "$push": bson.M{changelog.OutboxField: p}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&b)
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("%w: %s", ErrBindingNotFound, id)
	} else if err != nil {
		return nil, fmt.Errorf("remove binding %s: %w", id, err)
	}
	return &b, nil
}

// newestFirst orders routes.compile bindings: the first is in force.
var newestFirst = bson.D{{Key: "created_at", Value: -1}, {Key: "_id", Value: -1}}

// dropOlderRouteCompilers removes the routes.compile bindings older than b
// (each as [Engine.remove] does) and returns them as removed. Two binds
// racing both keep only the newer binding.
func (e *Engine) dropOlderRouteCompilers(ctx context.Context, b *Binding) ([]Binding, error) {
	cur, err := e.bindings.Find(ctx, live(bson.M{"hook": abiwasm.HookRoutesCompile}), options.Find().SetSort(newestFirst))
	if err != nil {
		return nil, fmt.Errorf("read route compiler bindings: %w", err)
	}
	var bs []Binding
	if err := cur.All(ctx, &bs); err != nil {
		return nil, fmt.Errorf("read route compiler bindings: %w", err)
	}
	var gone []Binding
	for _, o := range bs {
		if o.ID == b.ID {
			continue
		}
		older := o.CreatedAt.Before(b.CreatedAt) || (o.CreatedAt.Equal(b.CreatedAt) && o.ID < b.ID)
		if !older {
			continue
		}
		r, err := e.remove(ctx, o.ID)
		if errors.Is(err, ErrBindingNotFound) {
			continue // removed by a racing bind or unbind
		}
		if err != nil {
			return gone, fmt.Errorf("replace route compiler binding %s: %w", o.ID, err)
		}
		gone = append(gone, *r)
	}
	return gone, nil
}

// RouteCompiler returns the routes.compile binding in force (the newest), or
// nil when none is: the embedded default compiles the routes then. Called by
// the reconciler on every pass: one indexed read.
func (e *Engine) RouteCompiler(ctx context.Context) (*Binding, error) {
	var b Binding
	err := e.bindings.FindOne(ctx, live(bson.M{"hook": abiwasm.HookRoutesCompile}), options.FindOne().SetSort(newestFirst)).Decode(&b)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read route compiler binding: %w", err)
	}
	return &b, nil
}

// ModuleBytes returns the stored bytes of the module digest. Errors:
// ErrModuleNotFound, blob store errors.
func (e *Engine) ModuleBytes(digest string) ([]byte, error) {
	raw, err := e.cfg.Blobs.ReadBlob(digest)
	if errors.Is(err, bundles.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrModuleNotFound, digest)
	} else if err != nil {
		return nil, fmt.Errorf("read module %s: %w", digest, err)
	}
	return raw, nil
}

// Unbind removes a binding and returns it as removed: with an actor in ctx
// (changelog.WithActor) its deletion change is in its outbox
// (Binding.LogOutbox, last) and Binding.RemoveOn names it. A second Unbind
// of the same binding finds none. Errors: ErrBindingNotFound, store errors.
func (e *Engine) Unbind(ctx context.Context, id string) (*Binding, error) {
	return e.remove(ctx, id)
}

// Bindings lists every binding by hook, then creation.
func (e *Engine) Bindings(ctx context.Context) ([]Binding, error) {
	cur, err := e.bindings.Find(ctx, live(bson.M{}), options.Find().SetSort(bson.D{{Key: "hook", Value: 1}, {Key: "created_at", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list bindings: %w", err)
	}
	out := []Binding{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list bindings: %w", err)
	}
	return out, nil
}

// Decisions returns the newest recorded decisions, at most limit.
func (e *Engine) Decisions(ctx context.Context, limit int64) ([]Decision, error) {
	cur, err := e.decisions.Find(ctx, bson.M{}, options.Find().SetSort(bson.D{{Key: "at", Value: -1}}).SetLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("list decisions: %w", err)
	}
	out := []Decision{}
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list decisions: %w", err)
	}
	return out, nil
}

// Admit asks every binding of in.Hook that applies to project (bindings for
// every project, and those for this one) and combines their answers into a
// Verdict. in.Config is replaced by each binding's configuration. A module
// that fails denies under Fail and warns under Ignore. Every evaluation is
// recorded, except repeated identical deploy questions, which the engine
// answers from memory: modules are deterministic, so the same module, config
// and input give the same answer. An error means the bindings could not be
// read; callers fail closed on it.
func (e *Engine) Admit(ctx context.Context, project string, in abiwasm.PolicyInput) (Verdict, error) {
	start := time.Now()
	bs, err := e.bindingsFor(ctx, in.Hook)
	if err != nil {
		return Verdict{}, fmt.Errorf("read policy bindings: %w", err)
	}
	e.metrics.spent(stageBindings, start)
	start = time.Now()
	in.SchemaVersion = abiwasm.InputSchemaVersion
	// The bindings are independent: each sees the same input with its own
	// config, and none sees another's answer. So they run concurrently, each
	// on an instance of its own module, and are combined in binding order.
	type answer struct {
		b         Binding
		inputHash string
		out       abiwasm.PolicyOutput
		evalErr   string
		cached    bool
	}
	var answers []*answer
	for _, b := range bs {
		if b.Project == "" || b.Project == project {
			answers = append(answers, &answer{b: b})
		}
	}
	var wg sync.WaitGroup
	for _, a := range answers {
		in := in // each binding gets its own config
		in.Config = nil
		if a.b.Config != "" {
			in.Config = json.RawMessage(a.b.Config)
		}
		raw, err := json.Marshal(in)
		if err != nil {
			wg.Wait()
			return Verdict{}, fmt.Errorf("encode policy input: %w", err)
		}
		sum := sha256.Sum256(raw)
		a.inputHash = hex.EncodeToString(sum[:])
		e.recent.put(a.inputHash, raw)
		if len(answers) == 1 {
			a.out, a.evalErr, a.cached = e.evaluate(ctx, a.b, in.Hook, raw, a.inputHash)
			break
		}
		wg.Go(func() { a.out, a.evalErr, a.cached = e.evaluate(ctx, a.b, in.Hook, raw, a.inputHash) })
	}
	wg.Wait()
	e.metrics.spent(stageEvaluate, start)
	v := Verdict{Allowed: true}
	var records []*Decision
	for _, a := range answers {
		b, inputHash, out, evalErr, cached := a.b, a.inputHash, a.out, a.evalErr, a.cached
		d := Decision{ID: identity.NewID("pdc_"), Hook: in.Hook, BindingID: b.ID, ModuleDigest: b.ModuleDigest,
			InputSHA256: inputHash, Project: project, At: e.cfg.Now().UTC()}
		switch {
		case evalErr != "":
			d.Result, d.Error = "error", evalErr
			msg := fmt.Sprintf("policy %s failed: %s", b.Module, evalErr)
			if b.FailurePolicy == Ignore {
				v.Warnings = append(v.Warnings, msg+" (ignored: failure_policy ignore)")
			} else {
				v.Allowed = false
				v.Reasons = append(v.Reasons, msg)
				v.Denials = append(v.Denials, Denial{Module: moduleName(b), Reasons: []string{msg}})
			}
		case out.Decision == abiwasm.Deny:
			d.Result, d.Reasons, d.Warnings = "deny", out.Reasons, out.Warnings
			v.Allowed = false
			v.Reasons = append(v.Reasons, out.Reasons...)
			v.Warnings = append(v.Warnings, out.Warnings...)
			v.Denials = append(v.Denials, Denial{Module: moduleName(b), Reasons: out.Reasons})
		default:
			d.Result, d.Warnings = "allow", out.Warnings
			v.Warnings = append(v.Warnings, out.Warnings...)
		}
		e.metrics.answered(b, in.Hook, d.Result, cached)
		if cached && in.Hook == abiwasm.HookDeploy {
			continue
		}
		records = append(records, &d)
	}
	e.record(ctx, in.Actor, records)
	return v, nil
}

// record makes one admission's decisions durable before the request it
// decided goes on (docs/wasm-abi.md section 5.5):
//
//  1. each decision is appended to the change log, its record, as a change
//     held in memory until its entry is stored (the log takes the decisions
//     of every admission that asks meanwhile in one batch, one insert);
//  2. the decisions are indexed with their seq, those of every admission
//     that asks meanwhile in one ordered InsertMany.
//
// No decision document is written twice, so the index costs no write per
// decision after its entry (an outbox to clear and a seq to set were two
// thirds of the store's work under concurrent admissions). A decision whose
// append fails is indexed with its entry in its outbox instead, and handed
// to the log again (changelog.Log.Run and Recover retry it). A berthd that
// dies between the two steps leaves an entry without its index document,
// never an indexed decision without its entry. The work runs detached from
// ctx: when ctx ends first, record returns and the decisions are still
// recorded. The decisions stand either way: failing to record one is
// logged.
func (e *Engine) record(ctx context.Context, actor abiwasm.Actor, ds []*Decision) {
	if len(ds) == 0 {
		return
	}
	if actor.Kind == "system" && actor.ID == "" {
		actor.ID = "berthd" // as core/api records changes without a principal
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.recordDetached(context.WithoutCancel(ctx), actor, ds)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// recordWait bounds how long a decision whose first append failed waits
// for its second (it stays queued in the log after that).
const recordWait = 10 * time.Second

// recordDetached is [Engine.record]'s work, on a ctx that does not end.
func (e *Engine) recordDetached(ctx context.Context, actor abiwasm.Actor, ds []*Decision) {
	pending := make([]*changelog.Pending, len(ds))
	failed := make([]bool, len(ds))
	start := time.Now()
	var wg sync.WaitGroup
	for i, d := range ds {
		if e.cfg.Changelog == nil {
			continue
		}
		p, err := changelog.Prepare(changelog.Change{
			ActorType: actor.Kind, ActorID: actor.ID, EntityType: DecisionEntityType, EntityID: d.ID,
			Op: node.OpCreate, Payload: d,
		})
		if err != nil {
			e.log.Error("policy decision too large for the change log; indexed only", "hook", d.Hook, "decision_id", d.ID, "err", err)
			continue
		}
		pending[i] = &p
		wg.Go(func() {
			entry, err := e.cfg.Changelog.Record(ctx, changelog.Ref{}, p)
			if err != nil {
				e.log.Warn("append policy decision; it is indexed with its entry pending", "hook", d.Hook, "decision_id", d.ID, "err", err)
				failed[i] = true
				return
			}
			d.Seq = entry.Seq
		})
	}
	wg.Wait()
	if e.cfg.Changelog != nil {
		e.metrics.spent(stageLog, start)
	}
	start = time.Now()
	docs := make([]decisionDoc, len(ds))
	for i, d := range ds {
		docs[i] = decisionDoc{Decision: *d}
		if failed[i] {
			docs[i].Outbox = []changelog.Pending{*pending[i]}
		}
	}
	stored, err := e.storeRecords.Do(ctx, docs)
	e.metrics.spent(stageIndex, start)
	if err != nil || len(stored) != len(ds) { // not with a ctx that cannot end
		return
	}
	for i, d := range ds {
		if !stored[i] || !failed[i] {
			continue
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, recordWait)
			defer cancel()
			entry, err := e.cfg.Changelog.Record(rctx, changelog.Ref{Collection: DecisionsCollection, ID: d.ID, SeqField: "seq"}, *pending[i])
			if err != nil {
				e.log.Warn("policy decision indexed; its change-log entry follows", "hook", d.Hook, "decision_id", d.ID, "err", err)
				return
			}
			d.Seq = entry.Seq
		})
	}
	wg.Wait()
}

// insertRecords writes the decisions of a burst of admissions in one
// ordered InsertMany and reports, per admission and decision, which are
// stored. When it fails, some may be in (those before the one that
// failed): each is written again alone, and one already in (same _id)
// counts as stored.
func (e *Engine) insertRecords(ctx context.Context, batches [][]decisionDoc) [][]bool {
	out := make([][]bool, len(batches))
	var all []any
	for i, docs := range batches {
		out[i] = make([]bool, len(docs))
		for _, d := range docs {
			all = append(all, d)
		}
	}
	if len(all) == 0 {
		return out
	}
	_, err := e.decisions.InsertMany(ctx, all, options.InsertMany().SetOrdered(true))
	for i, docs := range batches {
		for j, d := range docs {
			if err == nil {
				out[i][j] = true
				continue
			}
			if _, err := e.decisions.InsertOne(ctx, d); err != nil && !mongo.IsDuplicateKeyError(err) {
				e.log.Warn("index policy decision", "hook", d.Hook, "decision_id", d.ID, "err", err)
				continue
			}
			out[i][j] = true
		}
	}
	return out
}

// decisionDoc is a Decision as stored: with its outbox until appended.
type decisionDoc struct {
	Decision `bson:",inline"`
	Outbox   []changelog.Pending `bson:"log_outbox,omitempty"`
}

// evaluate answers from the memo or the module.
func (e *Engine) evaluate(ctx context.Context, b Binding, hook abiwasm.Hook, raw []byte, inputHash string) (abiwasm.PolicyOutput, string, bool) {
	key := b.ID + "/" + inputHash
	e.mu.Lock()
	if m, ok := e.memo[key]; ok {
		e.mu.Unlock()
		return m.out, m.err, true
	}
	e.mu.Unlock()
	mod, err := e.module(ctx, b.ModuleDigest)
	if err != nil {
		return abiwasm.PolicyOutput{}, err.Error(), false // not memoized: may be transient
	}
	start := time.Now()
	out, err := mod.EvaluateJSON(ctx, raw)
	e.metrics.ran(b, hook, time.Since(start))
	if err != nil {
		if errors.Is(err, hostwasm.ErrDeadline) || ctx.Err() != nil {
			return out, err.Error(), false // time-dependent: not memoized
		}
		out, errText := abiwasm.PolicyOutput{}, err.Error()
		e.remember(key, memoEntry{out: out, err: errText})
		return out, errText, false
	}
	e.remember(key, memoEntry{out: out})
	return out, "", false
}

func (e *Engine) remember(key string, m memoEntry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.memo) >= maxMemo {
		e.memo = map[string]memoEntry{}
	}
	e.memo[key] = m
}

// moduleName names b's module for a refusal: its name, else its digest.
func moduleName(b Binding) string {
	if b.Module != "" {
		return b.Module
	}
	return b.ModuleDigest
}

// UniqueReasons returns v's reasons without repeats, in order.
func (v Verdict) UniqueReasons() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range v.Reasons {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}
