// Package interrupt rewrites a WebAssembly binary so the host can stop a
// running call cheaply: a fuel counter, decremented at every function entry
// and loop header, calls back into the host only when it runs out.
//
// Why a pass of our own: wazero's WithCloseOnContextDone makes compiled code
// leave for Go at every loop iteration to ask whether the module was closed
// (wazero issue 2466), which made loop-heavy guests several times slower.
// Without it, compiled code never returns to Go inside a loop, so neither a
// deadline nor the Go scheduler (garbage collection stops the world) could
// interrupt it. No maintained Go library rewrites WebAssembly code bodies
// (wazero's decoder is internal; the Rust and C toolchains that meter code do
// not build into a Go host), and the rewrite needed is small: walk every
// instruction only to find loops and function references, insert a few bytes
// per site, and renumber functions by one for the added import.
//
// The instrumented module imports one function, [ImportModule].[ImportName]
// of type () -> i32, placed after the module's own imports, and gets one
// private mutable i32 global, the fuel, starting at zero. Every loop (or,
// in the dispatch loops Go's compiler emits, every branch that can repeat
// a block: see dispatch.go), and every function body that could otherwise
// take part in a long or endless run of calls (see entryChecks), starts
// with
//
//	global.get $fuel
//	i32.const 1
//	i32.sub
//	global.set $fuel
//	global.get $fuel      ;; the value just stored: the compiler reuses it
//	i32.const 0
//	i32.lt_s
//	if                    ;; it was empty: this site's unit comes from a refill
//	  call $refill        ;; the host: trap if the call must stop, else new fuel
//	  i32.const 1
//	  i32.sub
//	  global.set $fuel
//	end
//
// The unit is taken first and the test reads what was just stored, so the
// path taken at almost every site is one load, one store and one branch.
// (Testing first and decrementing after the "if", as the pass once did,
// makes wazero's compiler load the global again after the branches merge;
// measured over 15 interleaved runs on a loaded machine: the pass cost 15.0
// against 16.8 percent of OPA's bare module, 6.1 against 6.6 percent of an
// AssemblyScript guest's, a gain about as large as the spread between two
// runs of the same shape.) Each refill still
// pays for exactly as many sites as the units it returns, which must be
// positive as a signed i32 (1 to 2^31-1): the fuel never goes below zero
// between two sites, so a module's instance carries what is left of it
// from one call to the next, as before.
//
// A small body that is on no cycle of calls and calls nothing indirectly
// runs a bounded number of instructions (its loops are counted at their
// headers) and returns, so it needs no check at entry: whoever called it
// was counted. Leaving the check out of such functions (getters, small
// helpers, most of what OPA's and AssemblyScript's compilers emit) saves
// its cost on every call without letting any endless loop or recursion
// escape the counter.
//
// So the host runs once every refill's worth of loop iterations and calls:
// often enough to end a call at its deadline within microseconds and to let
// the Go runtime stop the goroutine, rarely enough to cost nothing measurable.
// The guest cannot name the global, so the fuel is the host's alone.
package interrupt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The function an instrumented module imports: refill() -> i32 returns the
// fuel for the next stretch (positive as a signed i32: 1 to 2^31-1, one unit
// per site), or traps to stop the call.
const (
	ImportModule = "berth"
	ImportName   = "fuel"
)

// ErrMalformed is returned by [Instrument] for a binary it cannot read: not
// WebAssembly, truncated, an unknown opcode or section, or already importing
// [ImportModule].[ImportName].
var ErrMalformed = errors.New("berth: malformed WebAssembly module")

// Section ids of the binary format.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
	secTag       = 13
)

// order gives each known section its position in a module (tag sits between
// memory and global).
var order = map[byte]int{secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5, secTag: 6,
	secGlobal: 7, secExport: 8, secStart: 9, secElement: 10, secDataCount: 11, secCode: 12, secData: 13}

type section struct {
	id   byte
	body []byte
}

// rewriter holds what the rewrite of one module needs.
type rewriter struct {
	importedFuncs uint32 // functions imported by the original module
	refill        uint32 // function index of the added import
	fuel          uint32 // global index of the fuel
	check         []byte // the code inserted at every site
	checked       []bool // by function body: starts with the check (entryChecks)
}

// fn maps an original function index to the instrumented one.
func (w *rewriter) fn(i uint32) uint32 {
	if i >= w.importedFuncs {
		return i + 1
	}
	return i
}

// Instrument returns a copy of wasm with the fuel check at the start of every
// loop (before the repeating branches of a Go dispatch loop instead) and of
// every function body that needs one (entryChecks), the refill import, the fuel global, and every
// function index renumbered for the import. The "name" custom section is
// dropped (its indices would be stale); other custom sections are kept. It
// validates nothing beyond what it reads: wazero still compiles and
// validates the result. Errors wrap [ErrMalformed]. Instrument is
// deterministic and does not retain wasm.
func Instrument(wasm []byte) ([]byte, error) { return InstrumentWith(wasm, Options{}) }

// Options change what [InstrumentWith] does besides the fuel check.
type Options struct {
	// DefineImportedMemory turns the module's one imported memory into a
	// memory of its own with the same limits, for modules (OPA's) that
	// expect the host to provide their memory: wazero's host modules cannot
	// export one. The module must not also define a memory.
	DefineImportedMemory bool
	// NoFuel leaves the code as it is (no check, no import, no global):
	// benchmarks use it to measure a module without the check. A host
	// must not run untrusted code so: nothing could stop it.
	NoFuel bool
}

// InstrumentWith is [Instrument] with options.
func InstrumentWith(wasm []byte, opts Options) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, fmt.Errorf("%w: no WebAssembly header", ErrMalformed)
	}
	if v := binary.LittleEndian.Uint32(wasm[4:8]); v != 1 {
		return nil, fmt.Errorf("%w: binary format version %d, want 1", ErrMalformed, v)
	}
	r := &reader{b: wasm, off: 8}
	var secs []section
	last := 0
	for r.off < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		body, err := r.bytes(int(n))
		if err != nil {
			return nil, err
		}
		if id != secCustom {
			pos, ok := order[id]
			if !ok {
				return nil, fmt.Errorf("%w: unknown section id %d", ErrMalformed, id)
			}
			if pos <= last {
				return nil, fmt.Errorf("%w: section %d out of order", ErrMalformed, id)
			}
			last = pos
		}
		secs = append(secs, section{id: id, body: body})
	}

	var w rewriter
	var importedGlobals, definedGlobals, types uint32
	for _, s := range secs {
		var err error
		switch s.id {
		case secType:
			types, err = (&reader{b: s.body}).u32()
		case secImport:
			w.importedFuncs, importedGlobals, err = countImports(s.body)
		case secGlobal:
			definedGlobals, err = (&reader{b: s.body}).u32()
		}
		if err != nil {
			return nil, err
		}
	}
	if uint64(importedGlobals)+uint64(definedGlobals) >= math.MaxUint32 || w.importedFuncs == math.MaxUint32 || types == math.MaxUint32 {
		return nil, fmt.Errorf("%w: too many globals, functions or types", ErrMalformed)
	}
	w.refill = w.importedFuncs
	w.fuel = importedGlobals + definedGlobals
	// The check of the package doc: one read of the fuel, whose new value
	// the compiler keeps for the test; the refill stays off the hot path.
	w.check = cat([]byte{0x23}, uleb(w.fuel), []byte{0x41, 0x01, 0x6b, 0x24}, uleb(w.fuel), // fuel -= 1
		[]byte{0x23}, uleb(w.fuel), []byte{0x41, 0x00, 0x48, 0x04, 0x40}, // if fuel < 0
		[]byte{0x10}, uleb(w.refill), []byte{0x41, 0x01, 0x6b, 0x24}, uleb(w.fuel), []byte{0x0b}) // fuel = refill() - 1

	out := bytes.NewBuffer(make([]byte, 0, len(wasm)+len(wasm)/4))
	out.Write(wasm[:8])
	emit := func(id byte, body []byte) {
		out.WriteByte(id)
		out.Write(uleb(uint32(len(body))))
		out.Write(body)
	}
	var memory []byte // limits of the imported memory, when it becomes the module's own
	if opts.DefineImportedMemory {
		for _, s := range secs {
			switch s.id {
			case secMemory:
				return nil, fmt.Errorf("%w: the module both imports and defines memory", ErrMalformed)
			}
		}
	}
	// The type, import and global sections are written even when the module
	// has none, each where it belongs, and so is the memory section when the
	// imported memory became the module's own.
	if opts.NoFuel {
		return defineMemoryOnly(wasm, secs, opts)
	}
	have := map[byte]bool{}
	addMissing := func(next int) {
		if memory != nil && !have[secMemory] && next > order[secMemory] {
			have[secMemory] = true
			emit(secMemory, cat(uleb(1), memory))
		}
		for _, id := range []byte{secType, secImport, secGlobal} {
			if !have[id] && next > order[id] {
				have[id] = true
				var body []byte
				switch id {
				case secType:
					body = appendType(nil, 0)
				case secImport:
					body = appendImport(nil, 0, types)
				case secGlobal:
					body = appendGlobal(nil, 0)
				}
				emit(id, body)
			}
		}
	}
	for _, s := range secs {
		if s.id == secCustom {
			if isNameSection(s.body) {
				continue
			}
			emit(s.id, s.body)
			continue
		}
		addMissing(order[s.id])
		have[s.id] = true
		var body []byte
		var err error
		switch s.id {
		case secType:
			body, err = withCount(s.body, func(rest []byte, n uint32) ([]byte, error) { return appendType(rest, n), nil })
		case secImport:
			src := s.body
			if opts.DefineImportedMemory {
				if src, memory, err = takeMemoryImport(src); err != nil {
					return nil, err
				}
			}
			if err = checkImportFree(src); err == nil {
				body, err = withCount(src, func(rest []byte, n uint32) ([]byte, error) { return appendImport(rest, n, types), nil })
			}
		case secGlobal:
			body, err = w.rewriteGlobals(s.body)
		case secExport:
			body, err = w.rewriteExports(s.body)
		case secStart:
			var i uint32
			i, err = (&reader{b: s.body}).u32()
			body = uleb(w.fn(i))
		case secElement:
			body, err = w.rewriteElements(s.body)
		case secCode:
			body, err = w.rewriteCode(s.body)
		default:
			body = s.body
		}
		if err != nil {
			return nil, err
		}
		emit(s.id, body)
	}
	addMissing(math.MaxInt)
	return out.Bytes(), nil
}

func isNameSection(body []byte) bool {
	name, err := (&reader{b: body}).name()
	return err == nil && name == "name"
}

// withCount splits a vector section into its count and entries and hands
// them to add, which returns the new body.
func withCount(body []byte, add func(entries []byte, n uint32) ([]byte, error)) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	if n == math.MaxUint32 {
		return nil, fmt.Errorf("%w: vector too long", ErrMalformed)
	}
	return add(body[r.off:], n)
}

// appendType appends the type () -> i32 to n type entries.
func appendType(entries []byte, n uint32) []byte {
	return cat(uleb(n+1), entries, []byte{0x60, 0x00, 0x01, 0x7f})
}

// appendImport appends the refill import of type index typ to n entries.
func appendImport(entries []byte, n uint32, typ uint32) []byte {
	return cat(uleb(n+1), entries, uleb(uint32(len(ImportModule))), []byte(ImportModule),
		uleb(uint32(len(ImportName))), []byte(ImportName), []byte{0x00}, uleb(typ))
}

// appendGlobal appends the fuel (i32, mutable, i32.const 0) to n entries.
func appendGlobal(entries []byte, n uint32) []byte {
	return cat(uleb(n+1), entries, []byte{0x7f, 0x01, 0x41, 0x00, 0x0b})
}

func (w *rewriter) rewriteGlobals(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var out []byte
	for i := uint32(0); i < n; i++ {
		start := r.off
		if err := r.valType(); err != nil {
			return nil, err
		}
		if _, err := r.byte(); err != nil {
			return nil, err
		}
		out = append(out, body[start:r.off]...)
		if out, err = w.rewriteExpr(out, r); err != nil {
			return nil, err
		}
	}
	if r.off != len(body) {
		return nil, fmt.Errorf("%w: trailing bytes in the global section", ErrMalformed)
	}
	return appendGlobal(out, n), nil
}

func (w *rewriter) rewriteExports(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := uleb(n)
	for i := uint32(0); i < n; i++ {
		start := r.off
		if _, err := r.name(); err != nil {
			return nil, err
		}
		kind, err := r.byte()
		if err != nil {
			return nil, err
		}
		out = append(out, body[start:r.off]...)
		idx, err := r.u32()
		if err != nil {
			return nil, err
		}
		if kind == 0x00 {
			idx = w.fn(idx)
		}
		out = append(out, uleb(idx)...)
	}
	return out, nil
}

// rewriteElements renumbers the functions of every element segment (the
// eight encodings of the binary format, section 5.5.12).
func (w *rewriter) rewriteElements(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := uleb(n)
	for i := uint32(0); i < n; i++ {
		flags, err := r.u32()
		if err != nil {
			return nil, err
		}
		if flags > 7 {
			return nil, fmt.Errorf("%w: element segment flags %d", ErrMalformed, flags)
		}
		out = append(out, uleb(flags)...)
		if flags&3 == 2 { // explicit table index
			t, err := r.u32()
			if err != nil {
				return nil, err
			}
			out = append(out, uleb(t)...)
		}
		if flags&1 == 0 { // active: offset expression
			if out, err = w.rewriteExpr(out, r); err != nil {
				return nil, err
			}
		}
		if flags&3 != 0 { // element kind or reference type
			start := r.off
			if flags&4 == 0 {
				_, err = r.byte()
			} else {
				err = r.valType()
			}
			if err != nil {
				return nil, err
			}
			out = append(out, body[start:r.off]...)
		}
		count, err := r.u32()
		if err != nil {
			return nil, err
		}
		out = append(out, uleb(count)...)
		for j := uint32(0); j < count; j++ {
			if flags&4 == 0 {
				f, err := r.u32()
				if err != nil {
					return nil, err
				}
				out = append(out, uleb(w.fn(f))...)
			} else if out, err = w.rewriteExpr(out, r); err != nil {
				return nil, err
			}
		}
	}
	if r.off != len(body) {
		return nil, fmt.Errorf("%w: trailing bytes in the element section", ErrMalformed)
	}
	return out, nil
}

// rewriteExpr copies one constant expression up to and including its end,
// renumbering ref.func.
func (w *rewriter) rewriteExpr(out []byte, r *reader) ([]byte, error) {
	for i := 0; ; i++ {
		if i > 1<<16 {
			return nil, fmt.Errorf("%w: constant expression too long", ErrMalformed)
		}
		op, err := r.byte()
		if err != nil {
			return nil, err
		}
		if op == 0x0b {
			return append(out, op), nil
		}
		if op == 0xd2 {
			f, err := r.u32()
			if err != nil {
				return nil, err
			}
			out = append(out, op)
			out = append(out, uleb(w.fn(f))...)
			continue
		}
		start := r.off - 1
		if err := r.skipImmediates(op); err != nil {
			return nil, err
		}
		out = append(out, r.b[start:r.off]...)
	}
}

// takeMemoryImport removes the one memory import from an import section and
// returns the section without it and the memory's limits.
func takeMemoryImport(body []byte) (rest, limits []byte, err error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, nil, err
	}
	var entries []byte
	kept := uint32(0)
	for i := uint32(0); i < n; i++ {
		start := r.off
		if _, err := r.name(); err != nil {
			return nil, nil, err
		}
		if _, err := r.name(); err != nil {
			return nil, nil, err
		}
		kindAt := r.off
		if err := r.importDesc(nil, nil); err != nil {
			return nil, nil, err
		}
		if body[kindAt] == 0x02 {
			if limits != nil {
				return nil, nil, fmt.Errorf("%w: the module imports more than one memory", ErrMalformed)
			}
			limits = body[kindAt+1 : r.off]
			continue
		}
		kept++
		entries = append(entries, body[start:r.off]...)
	}
	if limits == nil {
		return nil, nil, fmt.Errorf("%w: the module imports no memory", ErrMalformed)
	}
	return cat(uleb(kept), entries), limits, nil
}

func checkImportFree(body []byte) error {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		mod, err := r.name()
		if err != nil {
			return err
		}
		name, err := r.name()
		if err != nil {
			return err
		}
		if mod == ImportModule && name == ImportName {
			return fmt.Errorf("%w: the module already imports %s.%s", ErrMalformed, ImportModule, ImportName)
		}
		if err := r.importDesc(nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// countImports returns how many functions and globals the import section
// imports.
func countImports(body []byte) (funcs, globals uint32, err error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return 0, 0, err
	}
	for i := uint32(0); i < n; i++ {
		if _, err := r.name(); err != nil {
			return 0, 0, err
		}
		if _, err := r.name(); err != nil {
			return 0, 0, err
		}
		if err := r.importDesc(&funcs, &globals); err != nil {
			return 0, 0, err
		}
	}
	return funcs, globals, nil
}

// importDesc skips one import description, counting functions and globals
// when asked.
func (r *reader) importDesc(funcs, globals *uint32) error {
	kind, err := r.byte()
	if err != nil {
		return err
	}
	switch kind {
	case 0x00: // function: type index
		if funcs != nil {
			*funcs++
		}
		_, err = r.u32()
	case 0x01: // table: reftype, limits
		if err = r.valType(); err == nil {
			err = r.limits()
		}
	case 0x02: // memory: limits
		err = r.limits()
	case 0x03: // global: valtype, mutability
		if globals != nil {
			*globals++
		}
		if err = r.valType(); err == nil {
			_, err = r.byte()
		}
	case 0x04: // tag: attribute, type index
		if _, err = r.byte(); err == nil {
			_, err = r.u32()
		}
	default:
		err = fmt.Errorf("%w: unknown import kind %#x", ErrMalformed, kind)
	}
	return err
}

// rewriteCode rewrites the code section: each body gets the check after its
// locals and after every loop's block type, and its function references
// renumbered.
func (w *rewriter) rewriteCode(body []byte) ([]byte, error) {
	checked, err := entryChecks(body, w.importedFuncs)
	if err != nil {
		return nil, err
	}
	w.checked = checked
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(body)/4)
	out = append(out, uleb(n)...)
	var fn []byte
	for i := uint32(0); i < n; i++ {
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		code, err := r.bytes(int(size))
		if err != nil {
			return nil, err
		}
		fn, err = w.rewriteFunc(fn[:0], code, w.checked[i])
		if err != nil {
			return nil, fmt.Errorf("function body %d: %w", i, err)
		}
		out = append(out, uleb(uint32(len(fn)))...)
		out = append(out, fn...)
	}
	if r.off != len(r.b) {
		return nil, fmt.Errorf("%w: %d bytes after the last function body", ErrMalformed, len(r.b)-r.off)
	}
	return out, nil
}

func (w *rewriter) rewriteFunc(out, code []byte, checked bool) ([]byte, error) {
	r := &reader{b: code}
	groups, err := r.u32()
	if err != nil {
		return nil, err
	}
	for j := uint32(0); j < groups; j++ {
		if _, err := r.u32(); err != nil {
			return nil, err
		}
		if err := r.valType(); err != nil {
			return nil, err
		}
	}
	out = append(out, code[:r.off]...)
	if checked {
		out = append(out, w.check...)
	}
	// Control frames and the last two instructions are followed only to
	// find Go's dispatch loops (dispatch.go); without plain control every
	// loop keeps the check at its header.
	track := plainControl(code[r.off:])
	type frame struct{ loop, of *dispatch } // loop: a dispatch loop; of: one of its blocks
	var ctl []frame
	frameAt := func(depth uint32) frame {
		if uint64(depth) >= uint64(len(ctl)) {
			return frame{} // the function's own label
		}
		return ctl[len(ctl)-1-int(depth)]
	}
	var pending *dispatch // the dispatch loop whose blocks come next
	pendingBlocks := 0
	lastConst, lastSet := false, false // the previous instruction: i32.const K, or local.set X right after one
	var constK, setK, setX uint32
	start := r.off
	for r.off < len(r.b) {
		at := r.off
		op, err := r.byte()
		if err != nil {
			return nil, err
		}
		imm := r.off
		if track {
			switch op {
			case 0x0c, 0x0d: // br, br_if
				depth, err := (&reader{b: code, off: imm}).u32()
				if err != nil {
					return nil, err
				}
				if d := frameAt(depth).loop; d != nil {
					free := op == 0x0c && lastSet && setX == d.pc && d.segmentOf(setK) > d.seg
					if !free {
						out = append(out, code[start:at]...)
						out = append(out, w.check...)
						start = at
					}
				}
			case 0x0e: // br_table: checked when any label is a dispatch loop
				lr := &reader{b: code, off: imm}
				n, err := lr.u32()
				if err != nil {
					return nil, err
				}
				for i := uint32(0); i <= n; i++ {
					depth, err := lr.u32()
					if err != nil {
						return nil, err
					}
					if frameAt(depth).loop != nil {
						out = append(out, code[start:at]...)
						out = append(out, w.check...)
						start = at
						break
					}
				}
			}
		}
		switch op {
		case 0x10, 0x12, 0xd2: // call, return_call, ref.func
			out = append(out, code[start:r.off]...)
			f, err := r.u32()
			if err != nil {
				return nil, err
			}
			out = append(out, uleb(w.fn(f))...)
			start = r.off
		default:
			if err := r.skipImmediates(op); err != nil {
				return nil, err
			}
		}
		wasConst := lastConst
		lastConst, lastSet = false, false
		switch op {
		case 0x41: // i32.const
			v, err := (&reader{b: code, off: imm}).sleb(32)
			if err != nil {
				return nil, err
			}
			lastConst, constK = true, uint32(int32(v))
		case 0x21: // local.set
			if wasConst {
				x, err := (&reader{b: code, off: imm}).u32()
				if err != nil {
					return nil, err
				}
				lastSet, setX, setK = true, x, constK
			}
		case 0x02, 0x04: // block, if
			f := frame{}
			if op == 0x02 && pendingBlocks > 0 {
				f.of = pending
				pendingBlocks--
			}
			ctl = append(ctl, f)
		case 0x03: // loop: the check follows its block type, unless it dispatches
			if track {
				if d, m, ok := dispatchAt(code, imm); ok {
					ctl = append(ctl, frame{loop: d})
					pending, pendingBlocks = d, m
					break
				}
				ctl = append(ctl, frame{})
			}
			out = append(out, code[start:r.off]...)
			out = append(out, w.check...)
			start = r.off
		case 0x0b: // end
			if n := len(ctl); n > 0 {
				if f := ctl[n-1]; f.of != nil {
					f.of.seg++
				}
				ctl = ctl[:n-1]
			}
		}
	}
	return append(out, code[start:]...), nil
}

// MaxUncheckedCost bounds, in bytes of code, what a function without an
// entry check may run before it returns: its own body plus, at every call
// site, the cost of a callee that has no check either (see entryChecks).
const MaxUncheckedCost = 4096

// entryChecks decides, for each function body in the code section body,
// whether it starts with the fuel check. Loops always have their own
// check, so what a check at entry adds is a count of calls: it is needed
// only where calls alone could run without end or for long.
//
// A body needs it when it calls indirectly (call_indirect, call_ref and
// their tail forms: any function could be the callee), when it is the
// target of a back edge of a depth-first walk of the direct calls (every
// cycle of calls, so every recursion, has one, and so passes a check), or
// when its cost is over MaxUncheckedCost, where its cost is its length
// plus the cost of every callee without a check, per call site. Without
// that bound a chain of small functions each calling the next twice would
// run 2^n calls between two checks. Calls to imports cost nothing here:
// the host bounds its own functions.
func entryChecks(body []byte, imported uint32) ([]bool, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	if uint64(n) > uint64(len(body)) {
		return nil, fmt.Errorf("%w: %d function bodies in %d bytes", ErrMalformed, n, len(body))
	}
	size := make([]int, n)
	indirect := make([]bool, n)
	callees := make([][]uint32, n) // defined functions, by body index, once per call site
	for i := uint32(0); i < n; i++ {
		sz, err := r.u32()
		if err != nil {
			return nil, err
		}
		code, err := r.bytes(int(sz))
		if err != nil {
			return nil, err
		}
		size[i] = len(code)
		fr := &reader{b: code}
		groups, err := fr.u32()
		if err != nil {
			return nil, err
		}
		for j := uint32(0); j < groups; j++ {
			if _, err := fr.u32(); err != nil {
				return nil, err
			}
			if err := fr.valType(); err != nil {
				return nil, err
			}
		}
		for fr.off < len(fr.b) {
			op, err := fr.byte()
			if err != nil {
				return nil, err
			}
			switch op {
			case 0x11, 0x13, 0x14, 0x15: // call_indirect, return_call_indirect, call_ref, return_call_ref
				indirect[i] = true
			case 0x10, 0x12: // call, return_call
				f, err := fr.u32()
				if err != nil {
					return nil, err
				}
				if f >= imported && f-imported < n {
					callees[i] = append(callees[i], f-imported)
				}
				continue
			}
			if err := fr.skipImmediates(op); err != nil {
				return nil, err
			}
		}
	}

	const (
		unseen = iota
		walking
		done
	)
	state := make([]byte, n)
	checked := make([]bool, n)
	cost := make([]int, n)
	// The walk is iterative: a chain of calls as long as the module has
	// functions must not grow the Go stack without bound.
	type frame struct {
		f    uint32
		next int // index into callees[f]
	}
	for root := uint32(0); root < n; root++ {
		if state[root] != unseen {
			continue
		}
		stack := []frame{{f: root}}
		state[root] = walking
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next < len(callees[top.f]) {
				c := callees[top.f][top.next]
				top.next++
				switch state[c] {
				case unseen:
					state[c] = walking
					stack = append(stack, frame{f: c})
				case walking: // a back edge: c is on a cycle of calls
					checked[c] = true
				}
				continue
			}
			f := top.f
			stack = stack[:len(stack)-1]
			c := size[f]
			for _, callee := range callees[f] {
				if !checked[callee] {
					c += cost[callee]
				}
				if c > MaxUncheckedCost {
					break
				}
			}
			cost[f] = c
			if indirect[f] || c > MaxUncheckedCost {
				checked[f] = true
			}
			state[f] = done
		}
	}
	return checked, nil
}

func cat(parts ...[]byte) []byte {
	var n int
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// skipImmediates moves past the immediates of op, whose byte was just read.
func (r *reader) skipImmediates(op byte) error {
	var err error
	switch {
	case op == 0x02 || op == 0x03 || op == 0x04 || op == 0x06: // block loop if try
		err = r.blockType()
	case op == 0x07 || op == 0x08 || op == 0x09 || op == 0x18: // catch throw rethrow delegate
		_, err = r.u32()
	case op == 0x0c || op == 0x0d || op == 0xd5 || op == 0xd6: // br br_if br_on_null br_on_non_null
		_, err = r.u32()
	case op == 0x0e: // br_table
		var n uint32
		if n, err = r.u32(); err == nil {
			for i := uint32(0); i <= n && err == nil; i++ {
				_, err = r.u32()
			}
		}
	case op == 0x10 || op == 0x12 || op == 0x14 || op == 0x15 || op == 0xd2: // call return_call call_ref return_call_ref ref.func
		_, err = r.u32()
	case op == 0x11 || op == 0x13: // call_indirect return_call_indirect
		if _, err = r.u32(); err == nil {
			_, err = r.u32()
		}
	case op == 0x1c: // select t*
		var n uint32
		if n, err = r.u32(); err == nil {
			for i := uint32(0); i < n && err == nil; i++ {
				err = r.valType()
			}
		}
	case op == 0x1f: // try_table
		if err = r.blockType(); err != nil {
			return err
		}
		var n uint32
		if n, err = r.u32(); err == nil {
			for i := uint32(0); i < n && err == nil; i++ {
				var kind byte
				if kind, err = r.byte(); err != nil {
					break
				}
				if kind > 3 {
					return fmt.Errorf("%w: catch kind %#x", ErrMalformed, kind)
				}
				if kind <= 1 {
					if _, err = r.u32(); err != nil {
						break
					}
				}
				_, err = r.u32()
			}
		}
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		_, err = r.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores
		err = r.memArg()
	case op == 0x3f || op == 0x40: // memory.size memory.grow
		_, err = r.u32()
	case op == 0x41:
		_, err = r.sleb(32)
	case op == 0x42:
		_, err = r.sleb(64)
	case op == 0x43:
		_, err = r.bytes(4)
	case op == 0x44:
		_, err = r.bytes(8)
	case op == 0xd0: // ref.null heaptype
		err = r.heapType()
	case op == 0xfc:
		err = r.skipFC()
	case op == 0xfd:
		err = r.skipSIMD()
	case op == 0xfe:
		err = r.skipAtomic()
	case op <= 0x01, op == 0x05, op == 0x0a, op == 0x0b, op == 0x0f, op == 0x19, op == 0x1a, op == 0x1b,
		op >= 0x45 && op <= 0xc4, op == 0xd1, op == 0xd3, op == 0xd4:
		// no immediates
	default:
		return fmt.Errorf("%w: unknown opcode %#x at offset %d", ErrMalformed, op, r.off-1)
	}
	return err
}

func (r *reader) skipFC() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 7: // saturating truncations
		return nil
	case sub == 8: // memory.init data mem
		if _, err := r.u32(); err != nil {
			return err
		}
		_, err = r.u32()
	case sub == 9 || sub == 13 || sub == 15 || sub == 16 || sub == 17 || sub == 11: // data.drop elem.drop table.grow table.size table.fill memory.fill
		_, err = r.u32()
	case sub == 10 || sub == 12 || sub == 14: // memory.copy table.init table.copy
		if _, err := r.u32(); err != nil {
			return err
		}
		_, err = r.u32()
	default:
		return fmt.Errorf("%w: unknown 0xfc opcode %d", ErrMalformed, sub)
	}
	return err
}

func (r *reader) skipSIMD() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 11 || sub == 92 || sub == 93: // loads, store, load32/64_zero
		return r.memArg()
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		_, err = r.bytes(16)
	case sub >= 21 && sub <= 34: // extract and replace lane
		_, err = r.byte()
	case sub >= 84 && sub <= 91: // load and store lane
		if err = r.memArg(); err == nil {
			_, err = r.byte()
		}
	case sub <= 0x113:
		// no immediates (arithmetic, comparisons, conversions, relaxed SIMD)
	default:
		return fmt.Errorf("%w: unknown SIMD opcode %d", ErrMalformed, sub)
	}
	return err
}

func (r *reader) skipAtomic() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	if sub == 3 { // atomic.fence
		_, err = r.byte()
		return err
	}
	if sub > 0x4e {
		return fmt.Errorf("%w: unknown atomic opcode %d", ErrMalformed, sub)
	}
	return r.memArg()
}

// reader decodes the binary format's primitives, every one bounds-checked.
type reader struct {
	b   []byte
	off int
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, fmt.Errorf("%w: unexpected end at offset %d", ErrMalformed, r.off)
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) bytes(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, fmt.Errorf("%w: %d bytes wanted at offset %d, %d left", ErrMalformed, n, r.off, len(r.b)-r.off)
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b, nil
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (r *reader) u32() (uint32, error) {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			if v > math.MaxUint32 {
				return 0, fmt.Errorf("%w: u32 overflows at offset %d", ErrMalformed, r.off)
			}
			return uint32(v), nil
		}
	}
	return 0, fmt.Errorf("%w: u32 too long at offset %d", ErrMalformed, r.off)
}

// sleb reads a signed LEB128 of at most ceil(bits/7) bytes.
func (r *reader) sleb(bits int) (int64, error) {
	var v int64
	for shift := 0; shift < bits+7; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= int64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: signed integer too long at offset %d", ErrMalformed, r.off)
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(int(n))
	return string(b), err
}

func (r *reader) limits() error {
	flags, err := r.byte()
	if err != nil {
		return err
	}
	if flags > 7 {
		return fmt.Errorf("%w: limits flags %#x", ErrMalformed, flags)
	}
	if _, err := r.u32(); err != nil { // memory64 limits are wider; u32 covers 32-bit memories
		return err
	}
	if flags&1 != 0 {
		_, err = r.u32()
	}
	return err
}

func (r *reader) memArg() error {
	align, err := r.u32()
	if err != nil {
		return err
	}
	if align&0x40 != 0 { // multi-memory: a memory index follows
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	_, err = r.u32()
	return err
}

// valType reads a value type: a number, vector or short reference type, or
// (ref null? heaptype).
func (r *reader) valType() error {
	c, err := r.byte()
	if err != nil {
		return err
	}
	switch c {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f, 0x69, 0x6e, 0x6d, 0x6c, 0x6b, 0x6a, 0x71, 0x72, 0x73:
		return nil
	case 0x63, 0x64:
		return r.heapType()
	}
	return fmt.Errorf("%w: unknown value type %#x at offset %d", ErrMalformed, c, r.off-1)
}

func (r *reader) refType() error { return r.valType() }

// heapType reads an s33: an abstract heap type byte or a type index.
func (r *reader) heapType() error {
	_, err := r.sleb(33)
	return err
}

// blockType reads 0x40, a value type, or an s33 type index.
func (r *reader) blockType() error {
	if r.off >= len(r.b) {
		return fmt.Errorf("%w: unexpected end at offset %d", ErrMalformed, r.off)
	}
	c := r.b[r.off]
	if c == 0x40 {
		r.off++
		return nil
	}
	if c == 0x63 || c == 0x64 {
		r.off++
		return r.heapType()
	}
	if c&0xc0 == 0x40 { // a one-byte negative s33: a value type
		r.off++
		return nil
	}
	v, err := r.sleb(33)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("%w: block type %d", ErrMalformed, v)
	}
	return nil
}

func uleb(v uint32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// Imports returns the module and name of every import of wasm, in order.
// Errors wrap [ErrMalformed].
func Imports(wasm []byte) ([][2]string, error) {
	secs, err := sections(wasm)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, s := range secs {
		if s.id != secImport {
			continue
		}
		r := &reader{b: s.body}
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		for i := uint32(0); i < n; i++ {
			mod, err := r.name()
			if err != nil {
				return nil, err
			}
			name, err := r.name()
			if err != nil {
				return nil, err
			}
			if err := r.importDesc(nil, nil); err != nil {
				return nil, err
			}
			out = append(out, [2]string{mod, name})
		}
	}
	return out, nil
}

// CustomSection returns the payload of the first custom section of wasm
// named name, and whether there is one.
func CustomSection(wasm []byte, name string) ([]byte, bool) {
	secs, err := sections(wasm)
	if err != nil {
		return nil, false
	}
	for _, s := range secs {
		if s.id != secCustom {
			continue
		}
		r := &reader{b: s.body}
		if n, err := r.name(); err == nil && n == name {
			return s.body[r.off:], true
		}
	}
	return nil, false
}

// AppendCustomSection returns wasm with a custom section name holding
// payload appended (custom sections may come anywhere).
func AppendCustomSection(wasm []byte, name string, payload []byte) []byte {
	body := cat(uleb(uint32(len(name))), []byte(name), payload)
	return cat(wasm, []byte{secCustom}, uleb(uint32(len(body))), body)
}

// sections splits wasm into its sections without looking inside them.
func sections(wasm []byte) ([]section, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, fmt.Errorf("%w: no WebAssembly header", ErrMalformed)
	}
	r := &reader{b: wasm, off: 8}
	var secs []section
	for r.off < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		body, err := r.bytes(int(n))
		if err != nil {
			return nil, err
		}
		secs = append(secs, section{id: id, body: body})
	}
	return secs, nil
}

// defineMemoryOnly is InstrumentWith for NoFuel: only the imported memory
// becomes the module's own, when asked.
func defineMemoryOnly(wasm []byte, secs []section, opts Options) ([]byte, error) {
	out := bytes.NewBuffer(make([]byte, 0, len(wasm)))
	out.Write(wasm[:8])
	emit := func(id byte, body []byte) {
		out.WriteByte(id)
		out.Write(uleb(uint32(len(body))))
		out.Write(body)
	}
	var memory []byte
	done := false
	for _, s := range secs {
		if memory != nil && !done && s.id != secCustom && order[s.id] > order[secMemory] {
			emit(secMemory, cat(uleb(1), memory))
			done = true
		}
		if s.id == secImport && opts.DefineImportedMemory {
			rest, limits, err := takeMemoryImport(s.body)
			if err != nil {
				return nil, err
			}
			memory = limits
			emit(s.id, rest)
			continue
		}
		emit(s.id, s.body)
	}
	if memory != nil && !done {
		emit(secMemory, cat(uleb(1), memory))
	}
	return out.Bytes(), nil
}
