// Package policy owns WebAssembly admission: the module catalog (bytes in the
// blob store), the bindings of modules to hooks, and the decision record.
//
// Decisions are recorded in the collection policy_decisions. When the change
// log lands, each decision becomes a change-log entry and this collection goes.
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
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
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

// Binding binds a policy module to a hook, for every project (Project empty)
// or one. Config is JSON handed to the module unchanged.
type Binding struct {
	ID            string        `bson:"_id" json:"id"`
	Hook          abiwasm.Hook  `bson:"hook" json:"hook"`
	ModuleDigest  string        `bson:"module_digest" json:"module_digest"`
	Module        string        `bson:"module" json:"module"`
	Project       string        `bson:"project,omitempty" json:"project,omitempty"`
	FailurePolicy FailurePolicy `bson:"failure_policy" json:"failure_policy"`
	Config        string        `bson:"config,omitempty" json:"config,omitempty"`
	CreatedAt     time.Time     `bson:"created_at" json:"created_at"`
}

// Decision is one recorded evaluation in collection policy_decisions.
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
}

// Verdict is the combined answer of every binding of a hook: denied when
// one denies (or fails under Fail), with every reason and warning.
type Verdict struct {
	Allowed  bool
	Reasons  []string
	Warnings []string
}

// DeniedError is returned to API callers for a denied request; core/api
// turns it into policy_denied with Reasons.
type DeniedError struct {
	Hook    abiwasm.Hook
	Reasons []string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("denied by policy at %s: %s", e.Hook, strings.Join(e.Reasons, "; "))
}

// Config wires an Engine. Store, Blobs and Runtime are required.
type Config struct {
	Store   *store.Store
	Blobs   *bundles.Store
	Runtime *hostwasm.Runtime
	// MaxModuleBytes bounds an upload; zero means DefaultMaxModuleBytes.
	MaxModuleBytes int64
	Logger         *slog.Logger
	// Now is the clock of recorded times; nil means time.Now.
	Now func() time.Time
}

// Engine evaluates bound policies. It is safe for concurrent use.
type Engine struct {
	cfg       Config
	log       *slog.Logger
	modules   *mongo.Collection
	bindings  *mongo.Collection
	decisions *mongo.Collection

	mu   sync.Mutex
	memo map[string]memoEntry // by binding id + input hash; mu must be held
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
	return &Engine{
		cfg: cfg, log: cfg.Logger.With("component", "policy"),
		modules:   cfg.Store.Collection("wasm_modules"),
		bindings:  cfg.Store.Collection("policy_bindings"),
		decisions: cfg.Store.Collection("policy_decisions"),
		memo:      map[string]memoEntry{},
	}
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
		ABI: fmt.Sprintf("%d.%d", meta.ABIMajor, meta.ABIMinor), CreatedAt: e.cfg.Now().UTC()}
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
	raw, err := e.cfg.Blobs.ReadBlob(digest)
	if errors.Is(err, bundles.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrModuleNotFound, digest)
	} else if err != nil {
		return nil, err
	}
	return e.cfg.Runtime.Load(ctx, raw)
}

// Bind records a binding. The module must be in the catalog and be a policy;
// the hook must be known; config, when not empty, must be JSON. Errors:
// ErrModuleNotFound, ErrInvalidBinding.
func (e *Engine) Bind(ctx context.Context, b Binding) (*Binding, error) {
	if !b.Hook.Valid() {
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
	if m.Kind != abiwasm.KindPolicy {
		return nil, fmt.Errorf("%w: module %s is a %s module, not a policy", ErrInvalidBinding, m.Name, m.Kind)
	}
	b.ID, b.Module, b.CreatedAt = identity.NewID("pbn_"), m.Name, e.cfg.Now().UTC()
	if _, err := e.bindings.InsertOne(ctx, &b); err != nil {
		return nil, fmt.Errorf("record binding: %w", err)
	}
	return &b, nil
}

// Unbind removes a binding. Errors: ErrBindingNotFound.
func (e *Engine) Unbind(ctx context.Context, id string) error {
	res, err := e.bindings.DeleteOne(ctx, bson.M{"_id": id})
	if err != nil {
		return fmt.Errorf("remove binding: %w", err)
	}
	if res.DeletedCount == 0 {
		return fmt.Errorf("%w: %s", ErrBindingNotFound, id)
	}
	return nil
}

// Bindings lists every binding by hook, then creation.
func (e *Engine) Bindings(ctx context.Context) ([]Binding, error) {
	cur, err := e.bindings.Find(ctx, bson.M{}, options.Find().SetSort(bson.D{{Key: "hook", Value: 1}, {Key: "created_at", Value: 1}}))
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
	cur, err := e.bindings.Find(ctx, bson.M{"hook": in.Hook}, options.Find().SetSort(bson.D{{Key: "created_at", Value: 1}}))
	if err != nil {
		return Verdict{}, fmt.Errorf("read policy bindings: %w", err)
	}
	var bs []Binding
	if err := cur.All(ctx, &bs); err != nil {
		return Verdict{}, fmt.Errorf("read policy bindings: %w", err)
	}
	v := Verdict{Allowed: true}
	for _, b := range bs {
		if b.Project != "" && b.Project != project {
			continue
		}
		in.Config = nil
		if b.Config != "" {
			in.Config = json.RawMessage(b.Config)
		}
		raw, err := json.Marshal(in)
		if err != nil {
			return Verdict{}, fmt.Errorf("encode policy input: %w", err)
		}
		sum := sha256.Sum256(raw)
		inputHash := hex.EncodeToString(sum[:])
		out, evalErr, cached := e.evaluate(ctx, b, raw, inputHash)
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
			}
		case out.Decision == abiwasm.Deny:
			d.Result, d.Reasons, d.Warnings = "deny", out.Reasons, out.Warnings
			v.Allowed = false
			v.Reasons = append(v.Reasons, out.Reasons...)
			v.Warnings = append(v.Warnings, out.Warnings...)
		default:
			d.Result, d.Warnings = "allow", out.Warnings
			v.Warnings = append(v.Warnings, out.Warnings...)
		}
		if cached && in.Hook == abiwasm.HookDeploy {
			continue
		}
		if _, err := e.decisions.InsertOne(ctx, &d); err != nil {
			// The decision stands; losing its record is logged, not fatal.
			e.log.Warn("record policy decision", "hook", in.Hook, "binding_id", b.ID, "err", err)
		}
	}
	return v, nil
}

// evaluate answers from the memo or the module.
func (e *Engine) evaluate(ctx context.Context, b Binding, raw []byte, inputHash string) (abiwasm.PolicyOutput, string, bool) {
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
	out, err := mod.EvaluateJSON(ctx, raw)
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
