package wasm

import (
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
