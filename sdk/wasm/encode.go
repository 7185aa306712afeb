package wasm

import (
	"unicode/utf8"

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

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes it: \" \\ \b
// \f \n \r \t, other control bytes and the HTML-sensitive < > & as \u00XX,
// invalid UTF-8 as \ufffd, and U+2028 and U+2029 as escapes.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
