package routes

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	abiroutes "github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// Binding is the route compiler an operator bound to routes.compile
// (docs/wasm-abi.md section 6.4): the binding's id and the module's digest
// and name.
type Binding struct {
	ID           string
	ModuleDigest string
	Module       string
}

// Source tells a [Bindable] which route compiler is bound and reads its
// bytes. core/policy's Engine keeps the bindings and the module catalog.
type Source interface {
	// BoundRouteCompiler returns the routes.compile binding in force, or nil
	// when none is. It is called once per compilation.
	BoundRouteCompiler(ctx context.Context) (*Binding, error)
	// ModuleBytes returns the stored bytes of the module digest.
	ModuleBytes(digest string) ([]byte, error)
}

// BindableConfig wires a [Bindable]. Default, Source and Runtime are required.
type BindableConfig struct {
	// Default compiles the routes while nothing is bound: the embedded module.
	Default Wasm
	Source  Source
	// Runtime loads bound modules; its Timeout bounds one compilation. The
	// Bindable unloads a bound module from it once it is no longer bound.
	Runtime *hostwasm.Runtime
	// Logger receives compiler switches; nil discards them.
	Logger *slog.Logger
}

// Bindable is the Compiler berthd runs: the module bound to routes.compile
// when there is one, else the default (docs/wasm-abi.md section 6.4). It looks
// the binding up on every Compile, so binding and unbinding take effect on
// the next reconcile pass. A bound module that cannot be read, loaded or run
// fails the compilation; it never falls back to the default, whose table may
// route differently (a dropped allow list, say), so the caller keeps its last
// good table. Compile is meant to be called by one goroutine at a time (the
// reconciler's passes); Describe is safe at any time.
type Bindable struct {
	cfg BindableConfig
	log *slog.Logger

	mu   sync.Mutex
	cur  *hostwasm.Module // the loaded bound module, nil while none is; mu must be held
	used string           // Describe of the compiler the latest Compile ran; mu must be held
}

var _ Compiler = (*Bindable)(nil)

// NewBindable returns a Bindable over cfg.
func NewBindable(cfg BindableConfig) *Bindable {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Bindable{cfg: cfg, log: cfg.Logger.With("component", "routes"), used: describeDefault(cfg.Default)}
}

func describeDefault(w Wasm) string { return w.Describe() + ", default" }

// Compile runs the bound route compiler, or the default when none is bound.
// Errors name the binding and the module: the binding could not be read, the
// module is missing from the blob store, does not load, is not a route
// compiler, or failed (host/wasm errors: deadline, trap, error answer, broken
// output).
func (b *Bindable) Compile(ctx context.Context, in Input) (abiroutes.Table, error) {
	bound, err := b.cfg.Source.BoundRouteCompiler(ctx)
	if err != nil {
		b.setUsed("unknown (the routes.compile binding could not be read)")
		return abiroutes.Table{}, fmt.Errorf("find the bound route compiler: %w", err)
	}
	if bound == nil {
		b.release(ctx, nil)
		b.setUsed(describeDefault(b.cfg.Default))
		return b.cfg.Default.Compile(ctx, in)
	}
	b.setUsed(fmt.Sprintf("%s (%s, binding %s)", bound.Module, bound.ModuleDigest, bound.ID))
	m, err := b.load(ctx, bound)
	if err != nil {
		return abiroutes.Table{}, fmt.Errorf("route compiler %s bound as %s: %w", bound.Module, bound.ID, err)
	}
	b.setUsed(Wasm{Module: m}.Describe() + ", binding " + bound.ID)
	t, err := Wasm{Module: m}.Compile(ctx, in)
	if err != nil {
		return abiroutes.Table{}, fmt.Errorf("route compiler %s bound as %s: %w", bound.Module, bound.ID, err)
	}
	return t, nil
}

// Describe names the compiler the latest Compile ran (before the first: the
// default), for example "default-routes 1.0.0 (sha256:...), default".
func (b *Bindable) Describe() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

func (b *Bindable) setUsed(s string) {
	b.mu.Lock()
	b.used = s
	b.mu.Unlock()
}

// load returns the bound module, loading it on the first compilation after
// a change of binding.
func (b *Bindable) load(ctx context.Context, bound *Binding) (*hostwasm.Module, error) {
	b.mu.Lock()
	cur := b.cur
	b.mu.Unlock()
	if cur != nil && cur.Digest() == bound.ModuleDigest {
		return cur, nil
	}
	raw, err := b.cfg.Source.ModuleBytes(bound.ModuleDigest)
	if err != nil {
		return nil, err
	}
	m, err := b.cfg.Runtime.Load(ctx, raw)
	if err != nil {
		return nil, err
	}
	if k := m.Metadata().Kind; k != abiwasm.KindRoutes {
		if m.Digest() != b.cfg.Default.Module.Digest() {
			b.cfg.Runtime.Unload(ctx, m.Digest())
		}
		return nil, fmt.Errorf("module %s (%s) is a %s module, not a route compiler: %w", m.Metadata().Name, m.Digest(), k, hostwasm.ErrBadModule)
	}
	b.release(ctx, m)
	b.log.Info("route compiler bound", "module", m.Metadata().Name, "digest", m.Digest(), "binding_id", bound.ID)
	return m, nil
}

// release makes next the bound module (nil: none) and unloads the previous
// one from the runtime, unless it is the default's.
func (b *Bindable) release(ctx context.Context, next *hostwasm.Module) {
	b.mu.Lock()
	prev := b.cur
	b.cur = next
	b.mu.Unlock()
	if prev == nil || prev == next || prev.Digest() == b.cfg.Default.Module.Digest() {
		return
	}
	b.cfg.Runtime.Unload(ctx, prev.Digest())
	if next == nil {
		b.log.Info("route compiler unbound; the default compiles the routes", "module", prev.Metadata().Name, "digest", prev.Digest())
	}
}
