// Package wasm runs Berth's WebAssembly modules with wazero: it compiles them
// (with an on-disk compilation cache), checks them against abi/wasm, pools
// instances, and bounds every call in memory, time and log output.
//
// Modules get no clock, randomness, file system, environment or network: the
// WASI clock is fixed and random_get is a fixed sequence, so the same input
// gives the same output bytes (docs/wasm-abi.md section 3).
package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/valyala/fastjson"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
)

// Defaults of [Config].
const (
	DefaultMemoryLimitPages = 1024    // 64 MiB
	DefaultFuel             = 1 << 30 // about a second of a tight loop on one core
	DefaultMaxInputBytes    = 4 << 20
	DefaultMaxOutputBytes   = 4 << 20
	DefaultLogLines         = 16
	DefaultLogLineBytes     = 1024
)

// Config configures a [Runtime]. The zero value works: in-memory compilation
// only, the defaults above, GOMAXPROCS instances per module.
type Config struct {
	// CacheDir holds compiled machine code across restarts; empty keeps it in
	// memory only. Compiling a Go module takes about a second; loading it from
	// the cache tens of milliseconds.
	CacheDir string
	// MemoryLimitPages caps one instance's linear memory in 64 KiB pages; zero
	// means DefaultMemoryLimitPages. A module declaring more fails to load; a
	// module growing past it gets a failed memory.grow.
	MemoryLimitPages uint32
	// Fuel bounds the work of one call (allocate, entry point, deallocate,
	// or an instance's _initialize) in units of one loop iteration or
	// call of a function that is counted (package interrupt: small helpers
	// on no cycle of calls are not); zero means DefaultFuel. A call that
	// uses it up is stopped and fails with ErrDeadline. Fuel, not the wall
	// clock, is what bounds a module's time: it does not run out faster when
	// the machine is busy, so a legal input is not refused under load, and
	// the same input always gets the same answer (docs/wasm-abi.md 3.3).
	Fuel uint64
	// Timeout, when positive, also bounds one call's wall-clock time; zero
	// or negative means no wall-clock limit: fuel and the caller's ctx bound
	// the call. A wall clock refuses legal calls on a busy machine (64
	// concurrent applies of 0.9 MiB were refused at 1 s and, under the race
	// detector, some at 10 s), so policies run without one. A call past it,
	// or whose ctx ends, is stopped and fails with ErrDeadline, and its
	// instance is discarded.
	Timeout time.Duration
	// MaxInstances bounds the instances of one module, and so its concurrent
	// calls; zero or negative means GOMAXPROCS. Callers beyond it wait.
	MaxInstances int
	// MaxInputBytes and MaxOutputBytes bound the JSON crossing the boundary;
	// zero means the defaults (4 MiB).
	MaxInputBytes  int
	MaxOutputBytes int
	// LogLines and LogLineBytes bound what one call may write with the host
	// log import; zero means the defaults (16 lines of 1 KiB). Further lines
	// are dropped and counted.
	LogLines     int
	LogLineBytes int
	// Logger receives module log lines and host events; nil discards them.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.MemoryLimitPages == 0 {
		c.MemoryLimitPages = DefaultMemoryLimitPages
	}
	if c.Fuel == 0 {
		c.Fuel = DefaultFuel
	}
	if c.MaxInstances <= 0 {
		c.MaxInstances = runtime.GOMAXPROCS(0)
	}
	if c.MaxInputBytes <= 0 {
		c.MaxInputBytes = DefaultMaxInputBytes
	}
	if c.MaxOutputBytes <= 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.LogLines <= 0 {
		c.LogLines = DefaultLogLines
	}
	if c.LogLineBytes <= 0 {
		c.LogLineBytes = DefaultLogLineBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Errors of [Runtime.Load] and [Module] calls. Each is wrapped with the
// module's name and digest; test with errors.Is.
var (
	// ErrBadModule: Load refused the module: not WebAssembly, an import the
	// host does not provide, a missing or mistyped export, an ABI major this
	// host does not speak, or invalid metadata.
	ErrBadModule = errors.New("berth: module does not implement the WebAssembly ABI")
	// ErrDeadline: a call ran past Config.Timeout (or the caller's ctx ended)
	// and was stopped.
	ErrDeadline = errors.New("berth: module call stopped at its deadline")
	// ErrTrap: the module trapped or exited during a call (a bug in the
	// module, or memory exhausted).
	ErrTrap = errors.New("berth: module trapped")
	// ErrMemory: the module could not allocate room for the input.
	ErrMemory = errors.New("berth: module could not allocate memory")
	// ErrTooLarge: the input or the output is over its limit.
	ErrTooLarge = errors.New("berth: module input or output too large")
	// ErrBadOutput: the module answered something the ABI does not allow;
	// this is a bug in the module.
	ErrBadOutput = errors.New("berth: module broke the ABI")
	// ErrGuest: the module answered with the error convention; the
	// *abiwasm.GuestError is in the chain.
	ErrGuest = errors.New("berth: module refused the input")
)

// Runtime compiles and runs modules. It is safe for concurrent use. Close it
// to free compiled code and instances.
type Runtime struct {
	cfg   Config
	log   *slog.Logger
	rt    wazero.Runtime
	cache wazero.CompilationCache

	parsers fastjson.ParserPool // for the answers every evaluation decodes

	mu      sync.Mutex
	modules map[string]*Module // by digest; mu must be held
}

// New returns a Runtime with the WASI preview 1 imports (deterministic, no
// system access) and the berth host module.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.defaults()
	// No WithCloseOnContextDone: it leaves compiled code for Go at every
	// loop iteration (wazero issue 2466). Load instruments every module with
	// package interrupt instead: the module calls refillFuel once every
	// FuelPerRefill loop iterations and calls, which ends the call when its
	// ctx is done (docs/wasm-abi.md section 3).
	rc := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(cfg.MemoryLimitPages)
	var cache wazero.CompilationCache
	if cfg.CacheDir != "" {
		if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("create wasm cache directory: %w", err)
		}
		c, err := wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("open wasm compilation cache: %w", err)
		}
		cache = c
		rc = rc.WithCompilationCache(c)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	r := &Runtime{cfg: cfg, log: cfg.Logger.With("component", "wasm"), rt: rt, cache: cache, modules: map[string]*Module{}}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("instantiate WASI: %w", err)
	}
	if _, err := rt.NewHostModuleBuilder(abiwasm.HostModule).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(r.hostLog),
		[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil).
		Export(abiwasm.HostLog).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostSHA256),
		[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil).
		Export(abiwasm.HostSHA256).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(refillFuel), nil, []api.ValueType{api.ValueTypeI32}).
		Export(interrupt.ImportName).
		Instantiate(ctx); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("instantiate host module: %w", err)
	}
	env := rt.NewHostModuleBuilder(opaEnv).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(opaAbortFn), []api.ValueType{api.ValueTypeI32}, nil).Export(opaAbort).
		NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(r.opaPrintlnFn), []api.ValueType{api.ValueTypeI32}, nil).Export(opaPrintln)
	for n := 0; n <= 4; n++ {
		params := make([]api.ValueType, 2+n)
		for i := range params {
			params[i] = api.ValueTypeI32
		}
		env = env.NewFunctionBuilder().WithGoModuleFunction(opaBuiltinFn(n), params, []api.ValueType{api.ValueTypeI32}).Export(fmt.Sprintf("%s%d", opaBuiltin, n))
	}
	if _, err := env.Instantiate(ctx); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("instantiate the OPA host module: %w", err)
	}
	return r, nil
}

// withDeadline bounds ctx by Config.Timeout when there is one; without one
// it returns ctx itself (the caller's ctx and the fuel bound the call).
func (r *Runtime) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.cfg.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, r.cfg.Timeout)
}

// FuelPerRefill is how many loop iterations and function calls an
// instrumented module runs between two visits to the host (package
// interrupt). A visit costs about as much as one iteration did under
// WithCloseOnContextDone, so the check is 1/FuelPerRefill of that cost; at
// about a nanosecond per iteration a call learns of its deadline, and the Go
// runtime gets to stop its goroutine, within tens of microseconds.
const FuelPerRefill = 1 << 15

// errStopped is the trap refillFuel raises when the call's ctx is done; it
// wraps the ctx's error, which [Module.callError] classifies. errNoFuel is
// the trap when the call's fuel is used up.
var (
	errStopped = errors.New("berth: call stopped")
	errNoFuel  = errors.New("berth: call used all its fuel")
)

type callKey struct{}

// callState is what one call's host functions share through its ctx: its
// fuel and, for calls of an entry point, the module, the instance and the
// log budget. A call runs on one goroutine, so it needs no lock. Each
// instance keeps one and reuses it for every call it serves.
type callState struct {
	fuel    int64
	m       *Module   // nil during load and _initialize: nothing is logged
	in      *instance // nil with m
	logLeft int
	dropped int
}

// withFuel gives a call outside an entry point (load, _initialize) its
// budget of fuel units.
func withFuel(ctx context.Context, units uint64) context.Context {
	return context.WithValue(ctx, callKey{}, &callState{fuel: int64(min(units, 1<<62))})
}

// refillFuel implements berth.fuel() -> i32 for instrumented modules: the
// next stretch of fuel, or a trap when the call must stop.
func refillFuel(ctx context.Context, _ api.Module, stack []uint64) {
	if err := ctx.Err(); err != nil {
		panic(fmt.Errorf("%w: %w", errStopped, err))
	}
	if st, ok := ctx.Value(callKey{}).(*callState); ok {
		if st.fuel <= 0 {
			panic(errNoFuel)
		}
		st.fuel -= FuelPerRefill
	}
	stack[0] = FuelPerRefill
}

// Close closes every module and frees compiled code. Calls in flight fail.
func (r *Runtime) Close(ctx context.Context) error {
	err := r.rt.Close(ctx)
	if r.cache != nil {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	return err
}

// Digest returns "sha256:<hex>" of wasm, the id of a module.
func Digest(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Load compiles wasm, checks it against the ABI (imports, exports and their
// types, berth_abi_version, berth_metadata) and returns the module, ready to
// call. A module loaded before is returned again without compiling. Errors
// wrap ErrBadModule, or a call error of the first instance. Load does not
// take ownership of wasm.
func (r *Runtime) Load(ctx context.Context, wasm []byte) (*Module, error) {
	digest := Digest(wasm)
	r.mu.Lock()
	if m, ok := r.modules[digest]; ok {
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()

	opa := isOPA(wasm)
	metered, err := interrupt.InstrumentWith(wasm, interrupt.Options{DefineImportedMemory: opa})
	if err != nil {
		return nil, fmt.Errorf("module %s: compile: %w: %w", digest, ErrBadModule, err)
	}
	compiled, err := r.rt.CompileModule(ctx, metered)
	if err != nil {
		return nil, fmt.Errorf("module %s: compile: %w: %w", digest, ErrBadModule, err)
	}
	m := &Module{rt: r, compiled: compiled, digest: digest, idle: make(chan *instance, r.cfg.MaxInstances), slots: make(chan struct{}, r.cfg.MaxInstances)}
	m.meta.Name = "unnamed"
	if opa {
		m.opa = &opaModule{}
	}
	if err := m.check(ctx, wasm); err != nil {
		_ = compiled.Close(ctx)
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.modules[digest]; ok { // lost a race with another Load
		_ = m.Close(ctx)
		return prev, nil
	}
	r.modules[digest] = m
	return m, nil
}

// Loaded returns the module of digest when it is loaded, without reading or
// hashing its bytes again: callers that know the digest use it before Load.
func (r *Runtime) Loaded(digest string) (*Module, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.modules[digest]
	return m, ok
}

// Unload closes the module of digest and forgets it; unknown digests are
// ignored.
func (r *Runtime) Unload(ctx context.Context, digest string) {
	r.mu.Lock()
	m := r.modules[digest]
	delete(r.modules, digest)
	r.mu.Unlock()
	if m != nil {
		_ = m.Close(ctx)
	}
}
