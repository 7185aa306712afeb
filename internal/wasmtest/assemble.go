package wasmtest

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// Value types and instructions used by the hand-assembled modules.
const (
	I32 byte = 0x7f
	I64 byte = 0x7e
)

// Func is one exported function of an assembled module. Body is the code
// without the final end.
type Func struct {
	Name    string
	Params  []byte
	Results []byte
	Body    []byte
}

// Module is a minimal module: one memory of Pages pages exported as
// "memory", functions, and data at fixed offsets.
type Module struct {
	Pages uint32
	Funcs []Func
	Data  map[uint32][]byte
}

// Assemble encodes m as a WebAssembly binary.
func Assemble(m Module) []byte {
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	var types, funcs, exports, code []byte
	types = uleb(types, uint64(len(m.Funcs)))
	funcs = uleb(funcs, uint64(len(m.Funcs)))
	code = uleb(code, uint64(len(m.Funcs)))
	exports = uleb(exports, uint64(len(m.Funcs)+1))
	for i, f := range m.Funcs {
		types = append(types, 0x60)
		types = vec(types, f.Params)
		types = vec(types, f.Results)
		funcs = uleb(funcs, uint64(i))
		exports = vec(exports, []byte(f.Name))
		exports = append(exports, 0x00)
		exports = uleb(exports, uint64(i))
		body := append([]byte{0x00}, f.Body...) // no locals
		body = append(body, 0x0b)
		code = vec(code, body)
	}
	exports = vec(exports, []byte("memory"))
	exports = append(exports, 0x02, 0x00)
	mem := uleb([]byte{0x01, 0x00}, uint64(m.Pages))
	var data []byte
	data = uleb(data, uint64(len(m.Data)))
	// Segments in offset order: the same module must give the same bytes.
	for _, off := range slices.Sorted(maps.Keys(m.Data)) {
		b := m.Data[off]
		data = append(data, 0x00, 0x41)
		data = sleb(data, int64(off))
		data = append(data, 0x0b)
		data = vec(data, b)
	}
	out = section(out, 1, types)
	out = section(out, 3, funcs)
	out = section(out, 5, mem)
	out = section(out, 7, exports)
	out = section(out, 10, code)
	out = section(out, 11, data)
	return out
}

func section(out []byte, id byte, body []byte) []byte { return vec(append(out, id), body) }
func vec(out, b []byte) []byte                        { return append(uleb(out, uint64(len(b))), b...) }
func uleb(out []byte, v uint64) []byte                { return binary.AppendUvarint(out, v) }

func sleb(out []byte, v int64) []byte {
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

// I32Const and I64Const encode constant instructions.
func I32Const(v int32) []byte { return sleb([]byte{0x41}, int64(v)) }

// I64Const encodes i64.const v.
func I64Const(v int64) []byte { return sleb([]byte{0x42}, v) }

// Cat concatenates instructions.
func Cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Loop is an endless loop: loop br 0 end, unreachable.
var Loop = []byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x00}

// Unreachable traps.
var Unreachable = []byte{0x00}

// Layout of Policy's memory.
const (
	metaAt   = 64
	answerAt = 512
	inputAt  = 1024
)

// PolicyOptions bend a hand-assembled policy module away from the ABI.
type PolicyOptions struct {
	Name       string // metadata name; default "asm-policy"
	ABIVersion uint32 // berth_abi_version's answer; zero means 1.0
	Evaluate   []byte // body of policy_evaluate; nil answers Answer
	Answer     string // policy output; default {"decision":"allow"}
	Counter    bool   // the answer's first reason ends in a digit that changes on every call
	NoDealloc  bool   // leave out deallocate
	Pages      uint32 // memory pages; default 2
	// Kind is the module's kind; default policy. With abiwasm.KindRoutes the
	// module is a route compiler: Evaluate and Answer make routes_compile.
	Kind abiwasm.Kind
}

// Routes assembles a route compiler whose routes_compile answers answer,
// whatever its input.
func Routes(name, answer string) []byte {
	return Policy(PolicyOptions{Name: name, Answer: answer, Kind: abiwasm.KindRoutes})
}

// Policy assembles a policy module that obeys the ABI unless opts say
// otherwise. allocate hands out the memory from offset 1024 and fails (0)
// for more than fits.
func Policy(opts PolicyOptions) []byte {
	if opts.Name == "" {
		opts.Name = "asm-policy"
	}
	if opts.ABIVersion == 0 {
		opts.ABIVersion = abiwasm.Version(1, 0)
	}
	if opts.Answer == "" {
		opts.Answer = `{"decision":"allow"}`
	}
	if opts.Counter {
		opts.Answer = `{"decision":"deny","reasons":["call 0"]}`
	}
	if opts.Pages == 0 {
		opts.Pages = 2
	}
	if opts.Kind == "" {
		opts.Kind = abiwasm.KindPolicy
	}
	meta := fmt.Sprintf(`{"kind":%q,"abi_major":%d,"abi_minor":%d,"name":%q,"version":"0"}`, opts.Kind, opts.ABIVersion>>16, opts.ABIVersion&0xffff, opts.Name)
	room := int32(opts.Pages*65536 - inputAt)
	allocate := Cat(
		// if size > room { return 0 } return inputAt
		[]byte{0x20, 0x00}, I32Const(room), []byte{0x4b /* i32.gt_u */, 0x04, 0x7f /* if (result i32) */},
		I32Const(0), []byte{0x05 /* else */}, I32Const(inputAt), []byte{0x0b},
	)
	eval := opts.Evaluate
	if eval == nil {
		eval = I64Const(int64(answerAt)<<32 | int64(len(opts.Answer)))
		if opts.Counter {
			digit := int32(answerAt + len(opts.Answer) - 4) // the 0 of "call 0"
			// mem[digit] = '0' + (mem[digit]-'0'+1)%10
			eval = Cat(I32Const(digit), I32Const(digit), []byte{0x2d, 0x00, 0x00}, // i32.load8_u
				I32Const(1), []byte{0x6a}, // i32.add
				[]byte{0x3a, 0x00, 0x00}, // i32.store8
				eval)
		}
	}
	funcs := []Func{
		{Name: abiwasm.ExportABIVersion, Results: []byte{I32}, Body: I32Const(int32(opts.ABIVersion))},
		{Name: abiwasm.ExportMetadata, Results: []byte{I64}, Body: I64Const(int64(metaAt)<<32 | int64(len(meta)))},
		{Name: abiwasm.ExportAllocate, Params: []byte{I32}, Results: []byte{I32}, Body: allocate},
		{Name: opts.Kind.EntryPoint(), Params: []byte{I32, I32}, Results: []byte{I64}, Body: eval},
	}
	if !opts.NoDealloc {
		funcs = append(funcs, Func{Name: abiwasm.ExportDeallocate, Params: []byte{I32, I32}})
	}
	return Assemble(Module{Pages: opts.Pages, Funcs: funcs, Data: map[uint32][]byte{metaAt: []byte(meta), answerAt: []byte(opts.Answer)}})
}
