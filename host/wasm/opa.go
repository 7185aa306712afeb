package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero/api"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
)

// OPA's WebAssembly ABI 1.x (docs/wasm-abi.md section 11): the module
// imports its memory and these functions from "env", and exports opa_eval
// (ABI 1.2) with the value and heap helpers below.
const (
	opaEnv     = "env"
	opaAbort   = "opa_abort"
	opaPrintln = "opa_println"
	opaBuiltin = "opa_builtin" // opa_builtin0 .. opa_builtin4
)

// OPAConfigSection names the custom section that holds an [OPAConfig].
const OPAConfigSection = "berth.opa"

// OPAConfig is the optional custom section "berth.opa" of an OPA-compiled
// module, which `berth module push --kind opa` writes from the bundle: the
// module's name and version, which entrypoint decides, and the bundle's data
// document (docs/wasm-abi.md section 11.2).
type OPAConfig struct {
	Name       string          `json:"name,omitempty"`
	Version    string          `json:"version,omitempty"`
	Entrypoint string          `json:"entrypoint,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
}

// opaModule is what a loaded OPA-compiled module shares between instances.
type opaModule struct {
	cfg        OPAConfig
	entry      uint32            // id of the deciding entrypoint
	denyStyle  bool              // the entrypoint is a deny set: undefined or empty allows
	builtinIDs map[uint32]string // builtin id -> name, from the module's builtins()
}

// opaInstance is one instance's state: its data document and the heap
// pointer after it, where every evaluation starts again.
type opaInstance struct {
	eval, malloc, jsonParse, jsonDump api.Function
	data, heap                        uint32
}

var opaExports = []string{"opa_eval", "opa_malloc", "opa_json_parse", "opa_json_dump", "opa_heap_ptr_get", "builtins", "entrypoints"}

// isOPA reports whether wasm is an OPA-compiled module: it imports
// env.opa_abort.
func isOPA(wasm []byte) bool {
	imports, err := interrupt.Imports(wasm)
	if err != nil {
		return false
	}
	for _, imp := range imports {
		if imp[0] == opaEnv && imp[1] == opaAbort {
			return true
		}
	}
	return false
}

// instantiateOPA sets up a fresh OPA instance: its data document and the
// heap pointer after it.
func (m *Module) instantiateOPA(ctx context.Context, in *instance) error {
	o := &opaInstance{
		eval: in.mod.ExportedFunction("opa_eval"), malloc: in.mod.ExportedFunction("opa_malloc"),
		jsonParse: in.mod.ExportedFunction("opa_json_parse"), jsonDump: in.mod.ExportedFunction("opa_json_dump"),
	}
	data := []byte(m.opa.cfg.Data)
	if len(data) == 0 {
		data = []byte("{}")
	}
	addr, err := o.parse(ctx, in.mem, data)
	if err != nil {
		return m.errf(ErrBadModule, "load the data document: %s", err)
	}
	o.data = addr
	res, err := in.mod.ExportedFunction("opa_heap_ptr_get").Call(ctx)
	if err != nil {
		return m.callError(in, "opa_heap_ptr_get", err)
	}
	o.heap = uint32(res[0])
	in.opa = o
	return nil
}

// parse copies JSON into the instance and returns the address of its value.
func (o *opaInstance) parse(ctx context.Context, mem api.Memory, raw []byte) (uint32, error) {
	res, err := o.malloc.Call(ctx, uint64(len(raw)))
	if err != nil {
		return 0, err
	}
	ptr := uint32(res[0])
	if !mem.Write(ptr, raw) {
		return 0, fmt.Errorf("opa_malloc(%d) returned %#x, outside memory", len(raw), ptr)
	}
	res, err = o.jsonParse.Call(ctx, uint64(ptr), uint64(len(raw)))
	if err != nil {
		return 0, err
	}
	if res[0] == 0 {
		return 0, fmt.Errorf("opa_json_parse refused the JSON")
	}
	return uint32(res[0]), nil
}

// dump returns the JSON of the value at addr.
func (o *opaInstance) dump(ctx context.Context, mem api.Memory, addr uint32, limit int) ([]byte, error) {
	res, err := o.jsonDump.Call(ctx, uint64(addr))
	if err != nil {
		return nil, err
	}
	return cString(mem, uint32(res[0]), limit)
}

// cString reads the NUL-terminated string at ptr, at most limit bytes.
func cString(mem api.Memory, ptr uint32, limit int) ([]byte, error) {
	size := mem.Size()
	if ptr >= size {
		return nil, fmt.Errorf("string at %#x lies outside memory of %d bytes", ptr, size)
	}
	n := min(uint64(size-ptr), uint64(limit)+1)
	raw, _ := mem.Read(ptr, uint32(n))
	i := bytes.IndexByte(raw, 0)
	if i < 0 {
		return nil, fmt.Errorf("string at %#x is longer than %d bytes or not terminated", ptr, limit)
	}
	return bytes.Clone(raw[:i]), nil
}

// checkOPA verifies an OPA-compiled module and reads its builtins and
// entrypoints from the first instance.
func (m *Module) checkOPA(ctx context.Context, raw []byte) error {
	for _, imp := range m.compiled.ImportedFunctions() {
		mod, name, _ := imp.Import()
		switch {
		case mod == interrupt.ImportModule && name == interrupt.ImportName:
		case mod == opaEnv && (name == opaAbort || name == opaPrintln):
		case mod == opaEnv && strings.HasPrefix(name, opaBuiltin) && len(name) == len(opaBuiltin)+1 && name[len(opaBuiltin)] >= '0' && name[len(opaBuiltin)] <= '4':
		default:
			return m.errf(ErrBadModule, "OPA module imports %s.%s, which the host does not provide (docs/wasm-abi.md section 11)", mod, name)
		}
	}
	exports := m.compiled.ExportedFunctions()
	for _, name := range opaExports {
		if _, ok := exports[name]; !ok {
			return m.errf(ErrBadModule, "OPA module does not export %s (OPA wasm ABI 1.2 or later is needed)", name)
		}
	}
	if _, ok := m.compiled.ExportedMemories()[abiwasm.ExportMemory]; !ok {
		return m.errf(ErrBadModule, "OPA module exports no memory named %q", abiwasm.ExportMemory)
	}
	cfg := OPAConfig{}
	if sec, ok := interrupt.CustomSection(raw, OPAConfigSection); ok {
		if err := json.Unmarshal(sec, &cfg); err != nil {
			return m.errf(ErrBadModule, "custom section %s is not JSON: %s", OPAConfigSection, err)
		}
		if len(cfg.Data) > 0 && (!json.Valid(cfg.Data) || cfg.Data[0] != '{') {
			return m.errf(ErrBadModule, "custom section %s: data is not a JSON object", OPAConfigSection)
		}
	}
	m.opa = &opaModule{cfg: cfg}

	cctx, cancel := m.rt.withDeadline(ctx)
	defer cancel()
	cctx = withFuel(cctx, m.rt.cfg.Fuel)
	in, err := m.instantiate(cctx)
	if err != nil {
		return err
	}
	fail := func(err error) error { _ = in.mod.Close(ctx); return err }
	builtins, err := m.opaObject(cctx, in, "builtins")
	if err != nil {
		return fail(err)
	}
	m.opa.builtinIDs = map[uint32]string{}
	var missing []string
	for name, id := range builtins {
		if _, ok := opaBuiltins[name]; !ok {
			missing = append(missing, name)
		}
		m.opa.builtinIDs[id] = name
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fail(m.errf(ErrBadModule, "OPA module needs builtin %s, which the host does not implement (docs/wasm-abi.md section 11.3)", strings.Join(missing, ", ")))
	}
	entries, err := m.opaObject(cctx, in, "entrypoints")
	if err != nil {
		return fail(err)
	}
	name, err := chooseEntrypoint(cfg.Entrypoint, entries)
	if err != nil {
		return fail(m.errf(ErrBadModule, "%s", err))
	}
	m.opa.entry = entries[name]
	m.opa.denyStyle = name == "deny" || strings.HasSuffix(name, "/deny")
	m.meta = abiwasm.Metadata{ABIMajor: abiwasm.Major, ABIMinor: abiwasm.Minor, Kind: abiwasm.KindPolicy, Name: cfg.Name, Version: cfg.Version}
	if m.meta.Name == "" {
		m.meta.Name = "opa:" + name
	}
	if m.meta.Version == "" {
		m.meta.Version = "0.0.0"
	}
	m.entry = "opa_eval"
	m.slots <- struct{}{}
	m.idle <- in
	return nil
}

// opaObject calls export fn () -> value and decodes the value as an object of
// ids.
func (m *Module) opaObject(ctx context.Context, in *instance, fn string) (map[string]uint32, error) {
	res, err := in.mod.ExportedFunction(fn).Call(ctx)
	if err != nil {
		return nil, m.callError(in, fn, err)
	}
	raw, err := in.opa.dump(ctx, in.mem, uint32(res[0]), m.rt.cfg.MaxOutputBytes)
	if err != nil {
		return nil, m.errf(ErrBadModule, "%s: %s", fn, err)
	}
	var out map[string]uint32
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, m.errf(ErrBadModule, "%s is not an object of ids: %s", fn, err)
	}
	return out, nil
}

// chooseEntrypoint picks the deciding entrypoint: the configured one, else
// the one named deny (or ending in /deny), else allow, else the only one.
func chooseEntrypoint(want string, entries map[string]uint32) (string, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	if want != "" {
		if _, ok := entries[want]; !ok {
			return "", fmt.Errorf("OPA module has no entrypoint %q (it has %s)", want, strings.Join(names, ", "))
		}
		return want, nil
	}
	for _, suffix := range []string{"deny", "allow"} {
		for _, n := range names {
			if n == suffix || strings.HasSuffix(n, "/"+suffix) {
				return n, nil
			}
		}
	}
	if len(names) == 1 {
		return names[0], nil
	}
	return "", fmt.Errorf("OPA module has entrypoints %s and none named deny or allow; name one with --entrypoint", strings.Join(names, ", "))
}

// callOPA evaluates input with opa_eval: the input goes at the heap pointer
// after the data document, so every evaluation starts from the same heap.
//
// OPA's opa_eval reads input that is not JSON as no input at all, so the
// host checks it first and answers as a Berth module would: ErrGuest
// wrapping the guest error bad_input (docs/wasm-abi.md section 4).
func (m *Module) callOPA(ctx context.Context, in *instance, input []byte) ([]byte, error) {
	if !validJSON(input) {
		ge := &abiwasm.GuestError{Code: abiwasm.ErrCodeBadInput, Message: "the input is not JSON"}
		return nil, fmt.Errorf("module %s (%s): %w: %w", m.meta.Name, m.digest, ErrGuest, ge)
	}
	o := in.opa
	end := uint64(o.heap) + uint64(len(input))
	if size := uint64(in.mem.Size()); end+64<<10 > size {
		pages := (end + 64<<10 - size + 65535) / 65536
		if _, ok := in.mem.Grow(uint32(pages)); !ok {
			return nil, m.errf(ErrMemory, "no room for an input of %d bytes", len(input))
		}
	}
	if !in.mem.Write(o.heap, input) {
		return nil, m.errf(ErrMemory, "no room for an input of %d bytes", len(input))
	}
	st := in.stack[:]
	st[0], st[1], st[2], st[3], st[4], st[5], st[6] = 0, uint64(m.opa.entry), uint64(o.data), uint64(o.heap), uint64(len(input)), end, 0
	if err := o.eval.CallWithStack(ctx, st); err != nil {
		return nil, m.callError(in, "opa_eval", err)
	}
	if st[0] == 0 {
		return nil, m.errf(ErrBadOutput, "opa_eval returned no result")
	}
	out, err := cString(in.mem, uint32(st[0]), m.rt.cfg.MaxOutputBytes)
	if err != nil {
		return nil, m.errf(ErrTooLarge, "opa_eval result: %s", err)
	}
	return out, nil
}

// opaDecision reads an OPA result set as a Berth decision (docs/wasm-abi.md
// section 11.4):
//   - a deny entrypoint (a set of messages): allow when undefined or empty,
//     else deny with the messages as reasons;
//   - a boolean (allow style): allow when true, deny when false or undefined;
//   - an object with "allow" (boolean), "deny" and "warn" (sets of
//     messages): deny when allow is false or deny is not empty.
func (m *Module) opaDecision(raw []byte) (abiwasm.PolicyOutput, error) {
	allow := abiwasm.PolicyOutput{Decision: abiwasm.Allow}
	p := m.rt.parsers.Get()
	r, ok := fastOPAResult(p, raw)
	m.rt.parsers.Put(p)
	switch {
	case !ok: // not a common shape: encoding/json below
	case r.undefined && m.opa.denyStyle:
		return allow, nil
	case r.undefined:
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: []string{"policy " + m.meta.Name + " is undefined for this input"}}, nil
	case r.isBool && r.b, !r.isBool && len(r.messages) == 0:
		return allow, nil
	case r.isBool:
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny}, nil
	default:
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: r.messages}, nil
	}
	var set []struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return abiwasm.PolicyOutput{}, m.errf(ErrBadOutput, "OPA result set is not JSON: %s", err)
	}
	if len(set) == 0 || len(set[0].Result) == 0 {
		if m.opa.denyStyle {
			return allow, nil
		}
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: []string{"policy " + m.meta.Name + " is undefined for this input"}}, nil
	}
	res := set[0].Result
	var b bool
	if json.Unmarshal(res, &b) == nil {
		if b {
			return allow, nil
		}
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny}, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(res, &list) == nil {
		if len(list) == 0 {
			return allow, nil
		}
		return abiwasm.PolicyOutput{Decision: abiwasm.Deny, Reasons: messages(list)}, nil
	}
	var obj struct {
		Allow *bool             `json:"allow"`
		Deny  []json.RawMessage `json:"deny"`
		Warn  []json.RawMessage `json:"warn"`
	}
	if err := json.Unmarshal(res, &obj); err != nil || (obj.Allow == nil && obj.Deny == nil) {
		return abiwasm.PolicyOutput{}, m.errf(ErrBadOutput, "OPA result %s is neither a boolean, a set of messages nor an object with allow or deny", clip(res))
	}
	out := abiwasm.PolicyOutput{Decision: abiwasm.Allow, Warnings: messages(obj.Warn)}
	if len(obj.Deny) > 0 || (obj.Allow != nil && !*obj.Allow) {
		out.Decision, out.Reasons = abiwasm.Deny, messages(obj.Deny)
	}
	return out, nil
}

// messages turns a set of values into reasons: strings as they are, other
// values as JSON, sorted as OPA sorts sets.
func messages(vals []json.RawMessage) []string {
	var out []string
	for _, v := range vals {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out = append(out, s)
		} else {
			out = append(out, string(v))
		}
	}
	return out
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// opaAbortFn implements env.opa_abort(addr): the module gave up; the call
// traps with its message.
func opaAbortFn(ctx context.Context, mod api.Module, stack []uint64) {
	msg, err := cString(mod.Memory(), uint32(stack[0]), 1024)
	if err != nil {
		msg = []byte("(unreadable message)")
	}
	panic(fmt.Errorf("opa_abort: %s", msg))
}

// opaPrintlnFn implements env.opa_println(addr) as one bounded log line.
func (r *Runtime) opaPrintlnFn(ctx context.Context, mod api.Module, stack []uint64) {
	b, _ := ctx.Value(callKey{}).(*callState)
	if b == nil || b.m == nil || b.logLeft <= 0 {
		if b != nil {
			b.dropped++
		}
		return
	}
	b.logLeft--
	msg, err := cString(mod.Memory(), uint32(stack[0]), r.cfg.LogLineBytes)
	if err != nil {
		return
	}
	r.log.Log(ctx, slog.LevelInfo, string(msg), "module", b.m.meta.Name, "digest", b.m.digest)
}

// opaBuiltinFn implements env.opa_builtinN(id, ctx, args...): it dumps the
// arguments as JSON, runs the host's implementation of the builtin and
// parses its result back into the module. An error makes the expression
// undefined (address 0), as in OPA without strict builtin errors.
func opaBuiltinFn(nargs int) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		b, _ := ctx.Value(callKey{}).(*callState)
		if b == nil || b.m.opa == nil || b.in == nil {
			panic(fmt.Errorf("opa builtin called outside an evaluation"))
		}
		m, in := b.m, b.in
		name := m.opa.builtinIDs[uint32(stack[0])]
		impl := opaBuiltins[name]
		if impl == nil {
			panic(fmt.Errorf("opa builtin %d is unknown", stack[0]))
		}
		args := make([]any, nargs)
		for i := range nargs {
			raw, err := in.opa.dump(ctx, mod.Memory(), uint32(stack[2+i]), m.rt.cfg.MaxInputBytes)
			if err != nil {
				panic(fmt.Errorf("opa builtin %s: read argument %d: %w", name, i+1, err))
			}
			d := json.NewDecoder(bytes.NewReader(raw))
			d.UseNumber()
			if err := d.Decode(&args[i]); err != nil {
				panic(fmt.Errorf("opa builtin %s: argument %d is not JSON: %w", name, i+1, err))
			}
		}
		res, err := impl(args)
		if err != nil {
			stack[0] = 0
			return
		}
		raw, err := json.Marshal(res)
		if err != nil {
			stack[0] = 0
			return
		}
		addr, err := in.opa.parse(ctx, mod.Memory(), raw)
		if err != nil {
			panic(fmt.Errorf("opa builtin %s: return the result: %w", name, err))
		}
		stack[0] = uint64(addr)
	}
}
