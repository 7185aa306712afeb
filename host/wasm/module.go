package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
)

// Module is a loaded module: its compiled code, metadata and a pool of
// instances. Its methods are safe for concurrent use; each call takes one
// instance for itself.
type Module struct {
	rt       *Runtime
	compiled wazero.CompiledModule
	digest   string
	meta     abiwasm.Metadata
	entry    string
	opa      *opaModule // set for OPA-compiled modules (docs/wasm-abi.md section 11)

	idle  chan *instance // instances ready for a call
	slots chan struct{}  // one token per live instance, bounding them
	once  sync.Once
}

// instance is one instantiated module. It serves one call at a time.
type instance struct {
	mod     api.Module
	mem     api.Memory
	alloc   api.Function
	dealloc api.Function
	entry   api.Function
	stderr  *capped
	opa     *opaInstance // OPA-compiled modules only
	state   callState    // the current call's; reused
	stack   [8]uint64    // arguments and results of CallWithStack; reused
}

// Digest is the module's id: "sha256:<hex>" of its bytes.
func (m *Module) Digest() string { return m.digest }

// ABI names the module's binary interface: "1.0" style for Berth's own ABI
// (docs/wasm-abi.md section 1), "opa 1.x" for OPA-compiled modules (section
// 11).
func (m *Module) ABI() string {
	if m.opa != nil {
		return "opa 1.x"
	}
	return fmt.Sprintf("%d.%d", m.meta.ABIMajor, m.meta.ABIMinor)
}

// Metadata is what the module's berth_metadata returned at load; for an
// OPA-compiled module, what its berth.opa section says, with the kind policy.
func (m *Module) Metadata() abiwasm.Metadata { return m.meta }

// Close closes every instance and the compiled code. Calls in flight fail.
func (m *Module) Close(ctx context.Context) error {
	var err error
	m.once.Do(func() {
		for {
			select {
			case in := <-m.idle:
				_ = in.mod.Close(ctx)
				continue
			default:
			}
			break
		}
		err = m.compiled.Close(ctx)
	})
	return err
}

func (m *Module) errf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("module %s (%s): %w: %s", m.meta.Name, m.digest, sentinel, fmt.Sprintf(format, args...))
}

var signatures = map[string][2][]api.ValueType{
	abiwasm.ExportABIVersion:     {nil, {api.ValueTypeI32}},
	abiwasm.ExportMetadata:       {nil, {api.ValueTypeI64}},
	abiwasm.ExportAllocate:       {{api.ValueTypeI32}, {api.ValueTypeI32}},
	abiwasm.ExportDeallocate:     {{api.ValueTypeI32, api.ValueTypeI32}, nil},
	abiwasm.ExportPolicyEvaluate: {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI64}},
	abiwasm.ExportRoutesCompile:  {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI64}},
}

func sameTypes(a, b []api.ValueType) bool { return bytes.Equal(a, b) }

// check verifies imports and exports, then instantiates the first instance to
// read the ABI version and metadata.
func (m *Module) check(ctx context.Context, raw []byte) error {
	if m.opa != nil {
		return m.checkOPA(ctx, raw)
	}
	for _, imp := range m.compiled.ImportedFunctions() {
		mod, name, _ := imp.Import()
		switch {
		case mod == "wasi_snapshot_preview1":
		case mod == abiwasm.HostModule && (name == abiwasm.HostLog || name == abiwasm.HostSHA256):
		case mod == interrupt.ImportModule && name == interrupt.ImportName: // added by Load
		default:
			return m.errf(ErrBadModule, "imports %s.%s, which the host does not provide (docs/wasm-abi.md section 3)", mod, name)
		}
	}
	if _, ok := m.compiled.ExportedMemories()[abiwasm.ExportMemory]; !ok {
		return m.errf(ErrBadModule, "exports no memory named %q", abiwasm.ExportMemory)
	}
	exports := m.compiled.ExportedFunctions()
	for _, name := range []string{abiwasm.ExportABIVersion, abiwasm.ExportMetadata, abiwasm.ExportAllocate, abiwasm.ExportDeallocate} {
		if err := m.checkExport(exports, name); err != nil {
			return err
		}
	}
	in, err := m.instantiate(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := m.rt.withDeadline(ctx)
	defer cancel()
	cctx = withFuel(cctx, m.rt.cfg.Fuel)
	res, err := in.mod.ExportedFunction(abiwasm.ExportABIVersion).Call(cctx)
	if err != nil {
		_ = in.mod.Close(ctx)
		return m.callError(in, abiwasm.ExportABIVersion, err)
	}
	major, minor := abiwasm.SplitVersion(uint32(res[0]))
	if major != abiwasm.Major {
		_ = in.mod.Close(ctx)
		return m.errf(ErrBadModule, "speaks ABI %d.%d; this host speaks %d.x", major, minor, abiwasm.Major)
	}
	res, err = in.mod.ExportedFunction(abiwasm.ExportMetadata).Call(cctx)
	if err != nil {
		_ = in.mod.Close(ctx)
		return m.callError(in, abiwasm.ExportMetadata, err)
	}
	raw, err = m.readOutput(cctx, in, res[0])
	if err != nil {
		_ = in.mod.Close(ctx)
		return err
	}
	var meta abiwasm.Metadata
	if err := json.Unmarshal(raw, &meta); err != nil {
		_ = in.mod.Close(ctx)
		return m.errf(ErrBadModule, "berth_metadata is not JSON: %s", err)
	}
	if err := meta.Validate(); err != nil {
		_ = in.mod.Close(ctx)
		return m.errf(ErrBadModule, "%s", err)
	}
	if meta.ABIMajor != major || meta.ABIMinor != minor {
		_ = in.mod.Close(ctx)
		return m.errf(ErrBadModule, "metadata says ABI %d.%d, berth_abi_version %d.%d", meta.ABIMajor, meta.ABIMinor, major, minor)
	}
	m.meta = meta
	m.entry = meta.Kind.EntryPoint()
	if err := m.checkExport(exports, m.entry); err != nil {
		_ = in.mod.Close(ctx)
		return err
	}
	in.entry = in.mod.ExportedFunction(m.entry)
	m.slots <- struct{}{}
	m.idle <- in
	return nil
}

func (m *Module) checkExport(exports map[string]api.FunctionDefinition, name string) error {
	def, ok := exports[name]
	if !ok {
		return m.errf(ErrBadModule, "does not export %s (docs/wasm-abi.md section 2)", name)
	}
	want := signatures[name]
	if !sameTypes(def.ParamTypes(), want[0]) || !sameTypes(def.ResultTypes(), want[1]) {
		return m.errf(ErrBadModule, "export %s has type %v -> %v, want %v -> %v", name,
			typeNames(def.ParamTypes()), typeNames(def.ResultTypes()), typeNames(want[0]), typeNames(want[1]))
	}
	return nil
}

func typeNames(ts []api.ValueType) string {
	var s []string
	for _, t := range ts {
		s = append(s, api.ValueTypeName(t))
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// instantiate starts a new instance as a reactor (_initialize, when exported).
func (m *Module) instantiate(ctx context.Context) (*instance, error) {
	stderr := &capped{max: 4096}
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions("_initialize").WithStderr(stderr)
	cctx, cancel := m.rt.withDeadline(ctx)
	defer cancel()
	cctx = withFuel(cctx, m.rt.cfg.Fuel)
	mod, err := m.rt.rt.InstantiateModule(cctx, m.compiled, cfg)
	if err != nil {
		return nil, m.callError(&instance{stderr: stderr}, "_initialize", err)
	}
	in := &instance{
		mod: mod, mem: mod.Memory(), stderr: stderr,
		alloc:   mod.ExportedFunction(abiwasm.ExportAllocate),
		dealloc: mod.ExportedFunction(abiwasm.ExportDeallocate),
	}
	if m.entry != "" {
		in.entry = mod.ExportedFunction(m.entry)
	}
	if m.opa != nil {
		if err := m.instantiateOPA(cctx, in); err != nil {
			_ = mod.Close(ctx)
			return nil, err
		}
	}
	return in, nil
}

// callError classifies a failed call: the deadline, an exit, or a trap.
func (m *Module) callError(in *instance, fn string, err error) error {
	switch {
	case errors.Is(err, errNoFuel):
		return m.errf(ErrDeadline, "%s used all its fuel (%d units of work)", fn, m.rt.cfg.Fuel)
	case errors.Is(err, context.DeadlineExceeded) && m.rt.cfg.Timeout > 0:
		return m.errf(ErrDeadline, "%s ran past %s", fn, m.rt.cfg.Timeout)
	case errors.Is(err, context.DeadlineExceeded):
		return m.errf(ErrDeadline, "%s: the caller's deadline passed", fn)
	case errors.Is(err, context.Canceled):
		return m.errf(ErrDeadline, "%s: the caller gave up", fn)
	}
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return m.errf(ErrDeadline, "%s ran past %s", fn, m.rt.cfg.Timeout)
		case sys.ExitCodeContextCanceled:
			return m.errf(ErrDeadline, "%s: the caller gave up", fn)
		}
		return m.errf(ErrTrap, "%s exited with code %d%s", fn, exit.ExitCode(), in.stderr.suffix())
	}
	return m.errf(ErrTrap, "%s: %s%s", fn, err, in.stderr.suffix())
}

// acquire returns an idle instance, or a new one while under MaxInstances,
// or waits for one.
func (m *Module) acquire(ctx context.Context) (*instance, error) {
	select {
	case in := <-m.idle:
		return in, nil
	default:
	}
	select {
	case in := <-m.idle:
		return in, nil
	case m.slots <- struct{}{}:
		in, err := m.instantiate(ctx)
		if err != nil {
			<-m.slots
			return nil, err
		}
		return in, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("module %s: wait for an instance: %w", m.meta.Name, ctx.Err())
	}
}

// release returns a healthy instance to the pool, or closes a broken one.
func (m *Module) release(ctx context.Context, in *instance, broken bool) {
	if broken {
		_ = in.mod.Close(context.WithoutCancel(ctx))
		<-m.slots
		return
	}
	in.stderr.reset()
	m.idle <- in
}

// Call runs the module's entry point (policy_evaluate or routes_compile) on
// input and returns a copy of its output. Steps: allocate room, write input,
// call, read output, deallocate both. Any failure discards the instance, so
// the next call gets a fresh one. Errors wrap ErrTooLarge, ErrMemory,
// ErrDeadline, ErrTrap or ErrBadOutput.
func (m *Module) Call(ctx context.Context, input []byte) ([]byte, error) {
	if len(input) > m.rt.cfg.MaxInputBytes {
		return nil, m.errf(ErrTooLarge, "input of %d bytes is over the limit of %d", len(input), m.rt.cfg.MaxInputBytes)
	}
	in, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	// The fuel check reaches the host only once per FuelPerRefill units, so
	// a short call would not notice a caller that has already given up.
	if ctx.Err() != nil {
		m.release(ctx, in, false)
		return nil, m.callError(in, m.entry, ctx.Err())
	}
	cctx, cancel := m.rt.withDeadline(ctx)
	defer cancel()
	in.state = callState{fuel: int64(min(m.rt.cfg.Fuel, 1<<62)), m: m, in: in, logLeft: m.rt.cfg.LogLines}
	cctx = context.WithValue(cctx, callKey{}, &in.state)
	var out []byte
	if m.opa != nil {
		out, err = m.callOPA(cctx, in, input)
	} else {
		out, err = m.call(cctx, in, input)
	}
	m.release(ctx, in, err != nil)
	return out, err
}

func (m *Module) call(ctx context.Context, in *instance, input []byte) ([]byte, error) {
	size := uint64(len(input))
	st := in.stack[:]
	st[0] = size
	if err := in.alloc.CallWithStack(ctx, st); err != nil {
		return nil, m.callError(in, abiwasm.ExportAllocate, err)
	}
	ptr := uint32(st[0])
	if ptr == 0 {
		return nil, m.errf(ErrMemory, "allocate(%d) returned 0", size)
	}
	if !in.mem.Write(ptr, input) {
		return nil, m.errf(ErrBadOutput, "allocate(%d) returned %#x, outside memory of %d bytes", size, ptr, in.mem.Size())
	}
	st[0], st[1] = uint64(ptr), size
	if err := in.entry.CallWithStack(ctx, st); err != nil {
		return nil, m.callError(in, m.entry, err)
	}
	out, err := m.readOutput(ctx, in, st[0])
	if err != nil {
		return nil, err
	}
	st[0], st[1] = uint64(ptr), size
	if err := in.dealloc.CallWithStack(ctx, st); err != nil {
		return nil, m.callError(in, abiwasm.ExportDeallocate, err)
	}
	return out, nil
}

// readOutput copies the packed output and gives it back to the module.
func (m *Module) readOutput(ctx context.Context, in *instance, packed uint64) ([]byte, error) {
	ptr, n := abiwasm.Unpack(packed)
	if int(n) > m.rt.cfg.MaxOutputBytes {
		return nil, m.errf(ErrTooLarge, "output of %d bytes is over the limit of %d", n, m.rt.cfg.MaxOutputBytes)
	}
	raw, ok := in.mem.Read(ptr, n)
	if !ok {
		return nil, m.errf(ErrBadOutput, "output at %#x+%d lies outside memory of %d bytes", ptr, n, in.mem.Size())
	}
	out := bytes.Clone(raw)
	if ptr != 0 {
		st := in.stack[:]
		st[0], st[1] = uint64(ptr), uint64(n)
		if err := in.dealloc.CallWithStack(ctx, st); err != nil {
			return nil, m.callError(in, abiwasm.ExportDeallocate, err)
		}
	}
	return out, nil
}

// capped keeps the first max bytes written to it (a module's stderr).
type capped struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capped) reset() { c.mu.Lock(); c.buf = c.buf[:0]; c.mu.Unlock() }

// suffix is ": <stderr>" when the module wrote any, for error messages.
func (c *capped) suffix() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.TrimSpace(string(c.buf))
	if s == "" {
		return ""
	}
	if i := strings.IndexByte(s, '\n'); i > 0 {
		s = s[:i]
	}
	return " (stderr: " + s + ")"
}

// hostLog implements berth.log(level, ptr, len).
func (r *Runtime) hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	b, _ := ctx.Value(callKey{}).(*callState)
	if b == nil || b.m == nil { // during load or _initialize: no budget, nothing logged
		return
	}
	if b.logLeft <= 0 {
		b.dropped++
		return
	}
	b.logLeft--
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	if int(n) > r.cfg.LogLineBytes {
		n = uint32(r.cfg.LogLineBytes)
	}
	raw, ok := mod.Memory().Read(ptr, n)
	if !ok {
		return
	}
	lvl := slog.LevelInfo
	switch level {
	case abiwasm.LogDebug:
		lvl = slog.LevelDebug
	case abiwasm.LogWarn:
		lvl = slog.LevelWarn
	case abiwasm.LogError:
		lvl = slog.LevelError
	}
	r.log.Log(ctx, lvl, string(raw), "module", b.m.meta.Name, "digest", b.m.digest)
}

// InstantiateForBench creates one instance of m and closes it, for
// benchmarks of instantiation cost; it leaves the pool as it was.
func InstantiateForBench(ctx context.Context, m *Module) error {
	in, err := m.instantiate(ctx)
	if err != nil {
		return err
	}
	return in.mod.Close(ctx)
}
