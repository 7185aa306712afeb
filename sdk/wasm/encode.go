package wasm

import (
	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// The guest's fast path out: encoding/json marshals by reflection, which in
// a GOOS=wasip1 guest costs more than many rules take, so a policy's answer
// is encoded by hand. encodePolicyOutput gives exactly json.Marshal's bytes
// for every abiwasm.PolicyOutput (a fuzz test compares them), HTML escaping
// and the replacement of invalid UTF-8 included.

// encodePolicyOutput is json.Marshal(out) for an [abiwasm.PolicyOutput]
// (docs/wasm-abi.md section 4): fields in declaration order, empty ones left
// out as omitempty does.
func encodePolicyOutput(out abiwasm.PolicyOutput) []byte {
	n := 2 + len(out.Decision) + 16
	for _, s := range out.Reasons {
		n += len(s) + 3
	}
	for _, s := range out.Warnings {
		n += len(s) + 3
	}
	if out.Error != nil {
		n += len(out.Error.Code) + len(out.Error.Message) + 32
	}
	b := make([]byte, 0, n+32)
	b = append(b, '{')
	sep := false
	if out.Decision != "" {
		b = append(b, `"decision":`...)
		b = appendJSONString(b, string(out.Decision))
		sep = true
	}
	if len(out.Reasons) > 0 {
		if sep {
			b = append(b, ',')
		}
		b = appendJSONStrings(append(b, `"reasons":`...), out.Reasons)
		sep = true
	}
	if len(out.Warnings) > 0 {
		if sep {
			b = append(b, ',')
		}
		b = appendJSONStrings(append(b, `"warnings":`...), out.Warnings)
		sep = true
	}
	if out.Error != nil {
		if sep {
			b = append(b, ',')
		}
		b = append(b, `"error":{"code":`...)
		b = appendJSONString(b, out.Error.Code)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, out.Error.Message)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendJSONStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendJSONString appends s quoted as encoding/json quotes it
// ([abiwasm.AppendJSONString]).
func appendJSONString(b []byte, s string) []byte { return abiwasm.AppendJSONString(b, s) }
