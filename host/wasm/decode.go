package wasm

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"

	"github.com/valyala/fastjson"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// Fast decoders for the answers every evaluation reads (a policy output, an
// OPA result set). encoding/json's reflection cost a module's answer about as
// much as the module took to compute it; these read the common shapes with
// fastjson and give up on anything else, which then goes through
// encoding/json as before. So they never decide differently from it: they
// take only plain answers (no escapes, no control bytes, valid UTF-8, keys
// spelled exactly), where both read the same strings.

// plain reports whether raw has no backslash, no byte below 0x20 and is
// valid UTF-8: JSON whose strings read the same in every decoder.
func plain(raw []byte) bool {
	for _, c := range raw {
		if c < 0x20 || c == '\\' {
			return false
		}
	}
	return utf8.Valid(raw)
}

// stringItems returns v's items when v is an array of strings.
func stringItems(v *fastjson.Value) ([]string, bool) {
	items, err := v.Array()
	if err != nil {
		return nil, false
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		s, err := it.StringBytes()
		if err != nil {
			return nil, false
		}
		out = append(out, string(s))
	}
	return out, true
}

// fastPolicyOutput decodes a policy output made only of decision, reasons
// and warnings; ok is false for anything else (errors, other keys, null).
// It reads every value, so fastjson's lenient scalars never decide.
func fastPolicyOutput(p *fastjson.Parser, raw []byte) (out abiwasm.PolicyOutput, ok bool) {
	if !plain(raw) {
		return out, false
	}
	if out, ok := exactPolicyOutput(raw); ok {
		return out, true
	}
	v, err := p.ParseBytes(raw)
	if err != nil {
		return out, false
	}
	o, err := v.Object()
	if err != nil {
		return out, false
	}
	ok = true
	o.Visit(func(k []byte, v *fastjson.Value) {
		if !ok {
			return
		}
		switch string(k) {
		case "decision":
			s, err := v.StringBytes()
			ok = err == nil
			out.Decision = abiwasm.Decision(s)
		case "reasons":
			out.Reasons, ok = stringItems(v)
		case "warnings":
			out.Warnings, ok = stringItems(v)
		default:
			ok = false
		}
	})
	return out, ok
}

// exactPolicyOutput reads, without a parser, the one layout guests
// write most: {"decision":"D"} with ,"reasons":[...] and ,"warnings":[...]
// after it when present, in that order and without whitespace, their items
// plain strings. raw must be plain, so no string holds a quote or an
// escape: whatever this takes is JSON and reads so in encoding/json. Any
// other layout is left to the parser (ok false).
func exactPolicyOutput(raw []byte) (out abiwasm.PolicyOutput, ok bool) {
	rest, ok := bytes.CutPrefix(raw, []byte(`{"decision":"`))
	if !ok {
		return out, false
	}
	i := bytes.IndexByte(rest, '"')
	if i < 0 {
		return out, false
	}
	out.Decision, rest = abiwasm.Decision(rest[:i]), rest[i+1:]
	if r, found := bytes.CutPrefix(rest, []byte(`,"reasons":`)); found {
		if out.Reasons, rest, ok = exactStrings(r); !ok {
			return out, false
		}
	}
	if r, found := bytes.CutPrefix(rest, []byte(`,"warnings":`)); found {
		if out.Warnings, rest, ok = exactStrings(r); !ok {
			return out, false
		}
	}
	return out, string(rest) == "}"
}

// exactOPAResult reads, without a parser, the result sets OPA's
// opa_json_dump writes for the common shapes: [], [{}], [{"result":true}],
// [{"result":false}] and [{"result":[...]}] with plain strings as items.
// raw must be plain, as for exactPolicyOutput.
func exactOPAResult(raw []byte) (r opaResult, ok bool) {
	switch string(raw) {
	case `[]`, `[{}]`:
		return opaResult{undefined: true}, true
	case `[{"result":true}]`:
		return opaResult{isBool: true, b: true}, true
	case `[{"result":false}]`:
		return opaResult{isBool: true}, true
	}
	rest, ok := bytes.CutPrefix(raw, []byte(`[{"result":`))
	if !ok {
		return r, false
	}
	if r.messages, rest, ok = exactStrings(rest); !ok {
		return r, false
	}
	return r, string(rest) == "}]"
}

// exactStrings reads a JSON array of plain strings without whitespace at
// the start of b and returns its items and what follows it; ok is false
// for anything else. An empty array gives an empty, not nil, slice, as
// encoding/json does.
func exactStrings(b []byte) (items []string, rest []byte, ok bool) {
	b, ok = bytes.CutPrefix(b, []byte("["))
	if !ok {
		return nil, nil, false
	}
	items = []string{}
	if r, found := bytes.CutPrefix(b, []byte("]")); found {
		return items, r, true
	}
	for {
		if len(b) == 0 || b[0] != '"' {
			return nil, nil, false
		}
		i := bytes.IndexByte(b[1:], '"')
		if i < 0 {
			return nil, nil, false
		}
		items, b = append(items, string(b[1:1+i])), b[2+i:]
		if len(b) == 0 {
			return nil, nil, false
		}
		switch b[0] {
		case ']':
			return items, b[1:], true
		case ',':
			b = b[1:]
		default:
			return nil, nil, false
		}
	}
}

// opaResult is the first result of an OPA result set in its common shapes.
type opaResult struct {
	undefined bool     // no result
	isBool    bool     // a boolean, in b
	b         bool     //
	messages  []string // else a set of strings
}

// fastOPAResult reads a result set whose first result is absent, a boolean
// or a set of strings; ok is false for anything else.
func fastOPAResult(p *fastjson.Parser, raw []byte) (r opaResult, ok bool) {
	if !plain(raw) {
		return r, false
	}
	if r, ok := exactOPAResult(raw); ok {
		return r, true
	}
	v, err := p.ParseBytes(raw)
	if err != nil {
		return r, false
	}
	set, err := v.Array()
	if err != nil {
		return r, false
	}
	// Every value is read below, so fastjson's lenient scalars (it does
	// not check numbers) never decide: one result, its only key "result".
	if len(set) == 0 {
		return opaResult{undefined: true}, true
	}
	if len(set) > 1 {
		return r, false
	}
	o, err := set[0].Object()
	if err != nil {
		return r, false
	}
	var res *fastjson.Value
	ok = true
	o.Visit(func(k []byte, v *fastjson.Value) {
		if string(k) == "result" {
			res = v // the last one, as encoding/json reads it
		} else {
			ok = false
		}
	})
	if !ok {
		return r, false
	}
	if res == nil {
		return opaResult{undefined: true}, true
	}
	switch res.Type() {
	case fastjson.TypeTrue, fastjson.TypeFalse:
		return opaResult{isBool: true, b: res.Type() == fastjson.TypeTrue}, true
	case fastjson.TypeArray:
		msgs, ok := stringItems(res)
		return opaResult{messages: msgs}, ok
	}
	return r, false
}

// maxJSONDepth is encoding/json's limit on nesting: one more level is not
// JSON to it.
const maxJSONDepth = 10000

// validJSON reports whether b is exactly one JSON value with optional
// whitespace around it, as json.Valid does (the same limit of nesting, and
// invalid UTF-8 inside strings accepted), without recursion or
// allocation below 64 levels. It reads strings a 64-bit word at a time and
// is what an OPA module's input costs the host (docs/wasm-abi.md section
// 11.4): fastjson's validator took about a tenth of an evaluation.
func validJSON(b []byte) bool {
	var buf [64]bool // open containers: true for an object
	open := buf[:0]
	n := len(b)
	i := 0
	for {
		// A value starts at i.
		i = skipSpace(b, i)
		if i >= n {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			if len(open) >= maxJSONDepth {
				return false
			}
			closer := byte(']')
			if c == '{' {
				closer = '}'
			}
			j := skipSpace(b, i+1)
			if j < n && b[j] == closer {
				i = j + 1
				break
			}
			open = append(open, c == '{')
			i = j
			if c == '{' {
				if i = skipKey(b, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = skipString(b, i)
		case 't':
			i = skipLiteral(b, i, "true")
		case 'f':
			i = skipLiteral(b, i, "false")
		case 'n':
			i = skipLiteral(b, i, "null")
		default:
			i = skipNumber(b, i)
		}
		if i < 0 {
			return false
		}
		// The value ends at i: close what it ends and find the next one.
	next:
		for {
			i = skipSpace(b, i)
			if len(open) == 0 {
				return i == n
			}
			if i >= n {
				return false
			}
			obj := open[len(open)-1]
			switch b[i] {
			case ',':
				i++
				if obj {
					if i = skipKey(b, i); i < 0 {
						return false
					}
				}
				break next
			case '}':
				if !obj {
					return false
				}
			case ']':
				if obj {
					return false
				}
			default:
				return false
			}
			open = open[:len(open)-1]
			i++
		}
	}
}

// skipSpace moves past whitespace; the first test, small enough to be
// inlined, is all that compact JSON needs.
func skipSpace(b []byte, i int) int {
	if i < len(b) && b[i] > ' ' {
		return i
	}
	return skipSpaceLoop(b, i)
}

func skipSpaceLoop(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipKey moves past `"key" :` and the space around it; -1 when that is
// not there.
func skipKey(b []byte, i int) int {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = skipString(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return i + 1
}

func skipLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// skipNumber moves past -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?;
// -1 when there is none.
func skipNumber(b []byte, i int) int {
	n := len(b)
	if i < n && b[i] == '-' {
		i++
	}
	switch {
	case i >= n:
		return -1
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return -1
	}
	if i < n && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < n && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < n && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// Masks of the word-at-a-time string scan.
const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// skipString moves past the string whose opening quote is at i; -1 when
// it is not valid. Eight bytes at a time, it jumps to the first quote,
// backslash or control byte: a byte that becomes zero in w^quote,
// w^backslash or (for bytes below 0x20) w-0x20 borrows into its top bit,
// borrows only reach the bytes above it, and ^w drops bytes of 0x80 and
// above, so the lowest mark is always such a byte.
func skipString(b []byte, i int) int {
	n := len(b)
	i++
	for {
		for i+8 <= n {
			w := binary.LittleEndian.Uint64(b[i:])
			q, s := w^('"'*lowBits), w^('\\'*lowBits)
			m := ((q - lowBits) &^ q) | ((s - lowBits) &^ s) | ((w - 0x20*lowBits) &^ w)
			if m &= highBits; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= n {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= n {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > n || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			i++
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
