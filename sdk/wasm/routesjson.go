package wasm

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// The route compiler's fast path. encoding/json decodes and encodes by
// reflection, which inside a GOOS=wasip1 guest costs most of a compilation
// (measured: about 85% of it for 1,000 services, docs/wasm-abi.md section
// 6.4), so [HandleRoutes] reads a [abiwasm.RoutesInput] and writes the
// table with the hand-written scanner and encoder below.
//
// Both agree with encoding/json exactly (FuzzRoutesJSON and
// TestRoutesJSONCoversEveryField check it): the decoder accepts what
// json.Unmarshal accepts, refuses what it refuses, and gives the same value
// (keys matched case-insensitively as encoding/json folds them, null
// leaving a string or an element as it was, invalid UTF-8 and lone
// surrogates read as U+FFFD, a repeated key decoding over the earlier
// value); the encoder gives json.Marshal's bytes, so the table's SHA-256 is
// the one [routes.Table.Digest] computes.

// errRoutesJSON marks every refusal of the routes decoder.
var errRoutesJSON = errors.New("routes input is not a RoutesInput")

// maxRoutesDepth is encoding/json's limit on nesting.
const maxRoutesDepth = 10000

// routesDecoder scans one JSON document. s is the input as one string, so
// that a string value without escapes is a substring of it and costs no
// allocation.
type routesDecoder struct {
	s     string
	i     int
	depth int
}

// decodeRoutesInput is json.Unmarshal of input into a zero
// [abiwasm.RoutesInput], without reflection.
func decodeRoutesInput(input []byte) (abiwasm.RoutesInput, error) {
	var in abiwasm.RoutesInput
	d := &routesDecoder{s: string(input)}
	d.ws()
	var err error
	switch {
	case d.peek() == '{':
		err = d.object(func(key string) error {
			switch key {
			case "services":
				return decodeSlice(d, &in.Services, d.service)
			case "workloads":
				return decodeSlice(d, &in.Workloads, d.workload)
			}
			return d.skip()
		}, routesInputFields)
	case d.literal("null"):
	default:
		err = d.typeError("RoutesInput")
	}
	if err != nil {
		return abiwasm.RoutesInput{}, err
	}
	d.ws()
	if d.i != len(d.s) {
		return abiwasm.RoutesInput{}, d.errorf("data after the top-level value")
	}
	return in, nil
}

// The field names of each type, for keys that match only after folding.
var (
	routesInputFields = []string{"services", "workloads"}
	serviceFields     = []string{"id", "project", "name", "domains", "tls_mode", "allow_sources"}
	workloadFields    = []string{"id", "service_id", "node_id", "node_address", "port", "address", "observed_status", "health"}
)

func (d *routesDecoder) service(s *abiwasm.RouteService) error {
	return d.structValue("RouteService", func(key string) error {
		switch key {
		case "id":
			return d.stringInto(&s.ID)
		case "project":
			return d.stringInto(&s.Project)
		case "name":
			return d.stringInto(&s.Name)
		case "domains":
			return decodeSlice(d, &s.Domains, d.stringInto)
		case "tls_mode":
			return d.stringInto(&s.TLSMode)
		case "allow_sources":
			return decodeSlice(d, &s.AllowSources, d.stringInto)
		}
		return d.skip()
	}, serviceFields)
}

func (d *routesDecoder) workload(w *abiwasm.RouteWorkload) error {
	return d.structValue("RouteWorkload", func(key string) error {
		switch key {
		case "id":
			return d.stringInto(&w.ID)
		case "service_id":
			return d.stringInto(&w.ServiceID)
		case "node_id":
			return d.stringInto(&w.NodeID)
		case "node_address":
			return d.stringInto(&w.NodeAddress)
		case "port":
			return d.intInto(&w.Port)
		case "address":
			return d.stringInto(&w.Address)
		case "observed_status":
			return d.stringInto(&w.ObservedStatus)
		case "health":
			return d.stringInto(&w.Health)
		}
		return d.skip()
	}, workloadFields)
}

func (d *routesDecoder) peek() byte {
	if d.i < len(d.s) {
		return d.s[d.i]
	}
	return 0
}

func (d *routesDecoder) ws() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *routesDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", errRoutesJSON, d.i, fmt.Sprintf(format, args...))
}

// typeError refuses a value of the wrong type (after checking its syntax,
// so that the offset names the value).
func (d *routesDecoder) typeError(want string) error {
	at := d.i
	if err := d.skip(); err != nil {
		return err
	}
	return fmt.Errorf("%w: offset %d: value is not a %s", errRoutesJSON, at, want)
}

// literal consumes lit when the input continues with it.
func (d *routesDecoder) literal(lit string) bool {
	if len(d.s)-d.i >= len(lit) && d.s[d.i:d.i+len(lit)] == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// object reads an object, calling field with each key as the field name it
// matches (one of names, or the key itself when it matches none) with the
// scanner at the value. field must consume the value.
func (d *routesDecoder) object(field func(key string) error, names []string) error {
	if d.depth++; d.depth > maxRoutesDepth {
		return d.errorf("nested too deeply")
	}
	d.i++ // '{'
	d.ws()
	if d.peek() == '}' {
		d.i++
		d.depth--
		return nil
	}
	for {
		if d.peek() != '"' {
			return d.errorf("object key is not a string")
		}
		key, err := d.str()
		if err != nil {
			return err
		}
		d.ws()
		if d.peek() != ':' {
			return d.errorf("missing ':' after object key")
		}
		d.i++
		d.ws()
		if err := field(matchField(key, names)); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
			d.ws()
		case '}':
			d.i++
			d.depth--
			return nil
		default:
			return d.errorf("missing ',' or '}' in object")
		}
	}
}

// structValue reads a value into a struct: null leaves it as it is, an
// object sets the fields it names.
func (d *routesDecoder) structValue(typ string, field func(key string) error, names []string) error {
	switch {
	case d.peek() == '{':
		return d.object(field, names)
	case d.literal("null"):
		return nil
	}
	return d.typeError(typ)
}

// matchField returns the name of names that key selects the way
// encoding/json selects a field: exactly, or equal after folding case.
func matchField(key string, names []string) string {
	for _, n := range names {
		if key == n {
			return n
		}
	}
	folded := string(foldName(key))
	for _, n := range names {
		if folded == string(foldName(n)) {
			return n
		}
	}
	return key
}

// foldName folds a key as encoding/json does: ASCII letters upper case,
// any other rune to unicode.SimpleFold of its upper case.
func foldName(in string) []byte {
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		if c := in[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(in[i:])
		out = utf8.AppendRune(out, unicode.SimpleFold(unicode.ToUpper(r)))
		i += n
	}
	return out
}

// decodeSlice reads a value into a slice as encoding/json does: null makes
// it nil, [] a new empty slice, and an array decodes its elements over the
// slice's backing array (a repeated key merges into the earlier elements).
func decodeSlice[T any](d *routesDecoder, dst *[]T, elem func(*T) error) error {
	if d.literal("null") {
		*dst = nil
		return nil
	}
	if d.peek() != '[' {
		return d.typeError("array")
	}
	if d.depth++; d.depth > maxRoutesDepth {
		return d.errorf("nested too deeply")
	}
	d.i++
	d.ws()
	if d.peek() == ']' {
		d.i++
		d.depth--
		*dst = []T{}
		return nil
	}
	s, n := *dst, 0
	for {
		if n == cap(s) {
			var zero T
			s = append(s[:n], zero)
		} else {
			s = s[:n+1]
		}
		if err := elem(&s[n]); err != nil {
			return err
		}
		n++
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
			d.ws()
		case ']':
			d.i++
			d.depth--
			*dst = s[:n]
			return nil
		default:
			return d.errorf("missing ',' or ']' in array")
		}
	}
}

// stringInto reads a string into dst; null leaves dst as it is.
func (d *routesDecoder) stringInto(dst *string) error {
	switch d.peek() {
	case '"':
		s, err := d.str()
		if err != nil {
			return err
		}
		*dst = s
		return nil
	case 'n':
		if d.literal("null") {
			return nil
		}
	}
	return d.typeError("string")
}

// intInto reads an integer into dst as encoding/json reads a number into an
// int (no fraction, no exponent, in range); null leaves dst as it is.
func (d *routesDecoder) intInto(dst *int) error {
	if d.literal("null") {
		return nil
	}
	c := d.peek()
	if c != '-' && (c < '0' || c > '9') {
		return d.typeError("number")
	}
	at := d.i
	num, err := d.number()
	if err != nil {
		return err
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || int64(int(n)) != n {
		return fmt.Errorf("%w: offset %d: number %s is not an int", errRoutesJSON, at, num)
	}
	*dst = int(n)
	return nil
}

// number scans a JSON number and returns its text.
func (d *routesDecoder) number() (string, error) {
	start := d.i
	digits := func() int {
		n := 0
		for d.i < len(d.s) && '0' <= d.s[d.i] && d.s[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.peek() == '-' {
		d.i++
	}
	switch c := d.peek(); {
	case c == '0':
		d.i++
	case '1' <= c && c <= '9':
		digits()
	default:
		return "", d.errorf("malformed number")
	}
	if d.peek() == '.' {
		d.i++
		if digits() == 0 {
			return "", d.errorf("malformed number")
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.i++
		if c := d.peek(); c == '+' || c == '-' {
			d.i++
		}
		if digits() == 0 {
			return "", d.errorf("malformed number")
		}
	}
	return d.s[start:d.i], nil
}

// skip scans any value, checking its syntax.
func (d *routesDecoder) skip() error {
	switch c := d.peek(); {
	case c == '{':
		return d.object(func(string) error { return d.skip() }, nil)
	case c == '[':
		var a []struct{}
		return decodeSlice(d, &a, func(*struct{}) error { return d.skip() })
	case c == '"':
		_, err := d.str()
		return err
	case c == '-' || '0' <= c && c <= '9':
		_, err := d.number()
		return err
	case d.literal("true"), d.literal("false"), d.literal("null"):
		return nil
	}
	return d.errorf("unexpected character %q", d.peek())
}

// str scans a string and returns its value as encoding/json unquotes it.
func (d *routesDecoder) str() (string, error) {
	start := d.i + 1
	i := start
	for i < len(d.s) { // the fast path: no escapes, valid UTF-8
		c := d.s[i]
		if c == '"' {
			d.i = i + 1
			return d.s[start:i], nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(d.s[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	b := []byte(d.s[start:i])
	for {
		if i >= len(d.s) {
			d.i = i
			return "", d.errorf("unterminated string")
		}
		c := d.s[i]
		switch {
		case c == '"':
			d.i = i + 1
			return string(b), nil
		case c < 0x20:
			d.i = i
			return "", d.errorf("control character in string")
		case c == '\\':
			if i+1 >= len(d.s) {
				d.i = i
				return "", d.errorf("unterminated string")
			}
			switch e := d.s[i+1]; e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r := hex4(d.s, i+2)
				if r < 0 {
					d.i = i
					return "", d.errorf("malformed \\u escape")
				}
				if utf16.IsSurrogate(r) {
					if i+7 < len(d.s) && d.s[i+6] == '\\' && d.s[i+7] == 'u' {
						if dec := utf16.DecodeRune(r, hex4(d.s, i+8)); dec != unicode.ReplacementChar {
							b = utf8.AppendRune(b, dec)
							i += 12
							continue
						}
					}
					r = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, r)
				i += 6
				continue
			default:
				d.i = i
				return "", d.errorf("unknown escape \\%c", e)
			}
			i += 2
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, n := utf8.DecodeRuneInString(d.s[i:])
			if r == utf8.RuneError && n == 1 {
				b = utf8.AppendRune(b, unicode.ReplacementChar)
			} else {
				b = append(b, d.s[i:i+n]...)
			}
			i += n
		}
	}
}

// hex4 reads four hex digits at s[i:], or returns -1.
func hex4(s string, i int) rune {
	if i+4 > len(s) {
		return -1
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// encodeRoutesOutput is json.Marshal of the [abiwasm.RoutesOutput] of the
// normalized routes rs with their SHA-256 ([routes.Table.Digest]): the
// routes are encoded once, hashed and written out. rs must already be
// normalized (sorted by hostname, upstreams by workload id).
func encodeRoutesOutput(rs []Route) []byte {
	out := make([]byte, 0, 64+160*len(rs))
	out = append(out, `{"routes":`...)
	body := len(out)
	out = appendRoutes(out, rs)
	var sum [sha256.Size]byte
	if len(rs) == 0 {
		sum = sha256.Sum256([]byte("null")) // Digest hashes a nil slice
	} else {
		sum = sha256.Sum256(out[body:])
	}
	out = append(out, `,"sha256":"`...)
	out = hex.AppendEncode(out, sum[:])
	return append(out, `"}`...)
}

// normalizeRoutes is [routes.Table.Normalize] for a table of routes alone,
// without reflection: routes by hostname, each route's upstreams by workload
// id. Stable, so that equal keys keep fn's order, as the host's sort of an
// already sorted table does.
func normalizeRoutes(rs []Route) {
	slices.SortStableFunc(rs, func(a, b Route) int { return cmp.Compare(a.Hostname, b.Hostname) })
	for i := range rs {
		slices.SortStableFunc(rs[i].Upstreams, func(a, b Upstream) int { return cmp.Compare(a.WorkloadID, b.WorkloadID) })
	}
}

// appendRoutes appends json.Marshal(rs) of a non-empty or empty (not nil)
// slice; a nil rs is written as [] too.
func appendRoutes(out []byte, rs []Route) []byte {
	out = append(out, '[')
	for i := range rs {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendRoute(out, &rs[i])
	}
	return append(out, ']')
}

// appendRoute appends json.Marshal(*r): the fields in declaration order,
// with their omitempty and omitzero rules.
func appendRoute(out []byte, r *Route) []byte {
	out = append(out, `{"hostname":`...)
	out = appendJSONString(out, r.Hostname)
	out = append(out, `,"project":`...)
	out = appendJSONString(out, r.Project)
	out = append(out, `,"service":`...)
	out = appendJSONString(out, r.Service)
	out = append(out, `,"upstreams":`...)
	if r.Upstreams == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i, u := range r.Upstreams {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, `{"workload_id":`...)
			out = appendJSONString(out, u.WorkloadID)
			out = append(out, `,"address":`...)
			out = appendJSONString(out, u.Address)
			out = append(out, `,"healthy":`...)
			out = strconv.AppendBool(out, u.Healthy)
			out = append(out, '}')
		}
		out = append(out, ']')
	}
	if r.TLSMode != "" {
		out = append(out, `,"tls_mode":`...)
		out = appendJSONString(out, r.TLSMode)
	}
	if len(r.AllowSources) > 0 {
		out = append(out, `,"allow_sources":[`...)
		for i, s := range r.AllowSources {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendJSONString(out, s)
		}
		out = append(out, ']')
	}
	if t := r.Timeouts; t != (routes.Timeouts{}) {
		out = append(out, `,"timeouts":{`...)
		sep := ""
		for _, f := range []struct {
			name string
			v    int64
		}{{"connect_ms", t.ConnectMS}, {"response_header_ms", t.ResponseHeaderMS}, {"idle_ms", t.IdleMS}} {
			if f.v != 0 {
				out = append(out, sep...)
				out = append(out, '"')
				out = append(out, f.name...)
				out = append(out, `":`...)
				out = strconv.AppendInt(out, f.v, 10)
				sep = ","
			}
		}
		out = append(out, '}')
	}
	if r.Stream {
		out = append(out, `,"stream":true`...)
	}
	if r.HTTPSRedirect {
		out = append(out, `,"https_redirect":true`...)
	}
	if r.HSTSMaxAgeS != 0 {
		out = append(out, `,"hsts_max_age_s":`...)
		out = strconv.AppendInt(out, r.HSTSMaxAgeS, 10)
	}
	return append(out, '}')
}

// appendJSONString appends s quoted as json.Marshal quotes it: HTML
// characters, control characters, U+2028 and U+2029 escaped, each invalid
// UTF-8 byte as \ufffd.
func appendJSONString(out []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			out = append(out, s[start:i]...)
			switch c {
			case '\\', '"':
				out = append(out, '\\', c)
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			default:
				out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			out = append(out, s[start:i]...)
			out = append(out, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			out = append(out, s[start:i]...)
			out = append(out, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += n
			start = i
			continue
		}
		i += n
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
