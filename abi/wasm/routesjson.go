package wasm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/berthhq/berth/abi/routes"
)

// The JSON of routes_compile without reflection (docs/wasm-abi.md section
// 6.5). encoding/json decodes and encodes by reflection, which inside a
// GOOS=wasip1 guest cost most of a compilation (for 1,000 services, the
// guest's decode alone took longer than the compilation does now), and on
// the host several times the native compiler's time. So the guest SDK and
// the host read and write RoutesInput and RoutesOutput with the scanner and
// encoders below.
//
// They agree with encoding/json exactly (FuzzRoutesJSON and
// TestRoutesJSONCoversEveryField check it): the decoders accept what
// json.Unmarshal accepts, refuse what it refuses, and give the same value
// (keys matched case-insensitively as encoding/json folds them, null
// leaving a string, number, bool or element as it was, invalid UTF-8 and
// lone surrogates read as U+FFFD, a repeated key decoding over the earlier
// value); the encoders give json.Marshal's bytes, so the SHA-256 of a
// table's encoding is the one [routes.Table.Digest] computes.

// ErrRoutesJSON is the error of [DecodeRoutesInput] and [DecodeRoutesOutput]
// for input that encoding/json would refuse: malformed JSON, or a value of
// the wrong type.
var ErrRoutesJSON = errors.New("berth: not the JSON of a routes_compile input or output")

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

// DecodeRoutesInput is json.Unmarshal of input into a zero [RoutesInput],
// without reflection: the same value for every input encoding/json accepts,
// and an error wrapping [ErrRoutesJSON] for every input it refuses.
func DecodeRoutesInput(input []byte) (RoutesInput, error) {
	var in RoutesInput
	if err := decodeTop(input, "RoutesInput", func(d *routesDecoder) error { return d.routesInput(&in) }); err != nil {
		return RoutesInput{}, err
	}
	return in, nil
}

// DecodeRoutesOutput is json.Unmarshal of output into a zero
// [RoutesOutput], without reflection, with the guarantees of
// [DecodeRoutesInput].
func DecodeRoutesOutput(output []byte) (RoutesOutput, error) {
	var out RoutesOutput
	if err := decodeTop(output, "RoutesOutput", func(d *routesDecoder) error { return d.routesOutput(&out) }); err != nil {
		return RoutesOutput{}, err
	}
	return out, nil
}

// decodeTop decodes one top-level value: an object with obj, null as
// nothing, and nothing but white space after it.
func decodeTop(input []byte, typ string, obj func(*routesDecoder) error) error {
	d := &routesDecoder{s: string(input)}
	d.ws()
	var err error
	switch {
	case d.peek() == '{':
		err = obj(d)
	case d.literal("null"):
	default:
		err = d.typeError(typ)
	}
	if err != nil {
		return err
	}
	d.ws()
	if d.i != len(d.s) {
		return d.errorf("data after the top-level value")
	}
	return nil
}

// The field names of each type, for keys that match only after folding;
// service and workload use the indexes of serviceFields and workloadFields.
var (
	routesInputFields = []string{"services", "workloads"}
	serviceFields     = []string{"id", "project", "name", "domains", "tls_mode", "allow_sources"}
	workloadFields    = []string{"id", "service_id", "node_id", "node_address", "port", "address", "observed_status", "health"}
	outputFields      = []string{"routes", "sha256", "error"}
	routeFields       = []string{"hostname", "project", "service", "upstreams", "tls_mode", "allow_sources", "timeouts", "stream", "https_redirect", "hsts_max_age_s", "path_prefix", "strip_prefix", "headers"}
	headerMatchFields = []string{"name", "value"}
	upstreamFields    = []string{"workload_id", "address", "healthy"}
	timeoutsFields    = []string{"connect_ms", "response_header_ms", "idle_ms"}
	guestErrorFields  = []string{"code", "message"}
)

func (d *routesDecoder) routesInput(in *RoutesInput) error {
	more, err := d.beginObject()
	for more && err == nil {
		var key string
		if key, err = d.key(routesInputFields); err != nil {
			return err
		}
		switch key {
		case "services":
			err = decodeSlice(d, &in.Services, d.service)
		case "workloads":
			err = decodeSlice(d, &in.Workloads, d.workload)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) service(s *RouteService) error {
	more, err := d.beginStruct("RouteService")
	for more && err == nil {
		if f, val, ok := d.plainMember(serviceFields); ok {
			switch f { // the index in serviceFields
			case 0:
				s.ID = val
			case 1:
				s.Project = val
			case 2:
				s.Name = val
			case 4:
				s.TLSMode = val
			default: // domains, allow_sources
				return d.errorf("field %s is not an array", serviceFields[f])
			}
			if more, ok = d.comma(); ok {
				continue
			}
			more, err = d.more()
			continue
		}
		var key string
		if key, err = d.key(serviceFields); err != nil {
			return err
		}
		switch key {
		case "id":
			err = d.stringInto(&s.ID)
		case "project":
			err = d.stringInto(&s.Project)
		case "name":
			err = d.stringInto(&s.Name)
		case "domains":
			err = decodeSlice(d, &s.Domains, d.stringInto)
		case "tls_mode":
			err = d.stringInto(&s.TLSMode)
		case "allow_sources":
			err = decodeSlice(d, &s.AllowSources, d.stringInto)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) workload(w *RouteWorkload) error {
	more, err := d.beginStruct("RouteWorkload")
	for more && err == nil {
		if f, val, ok := d.plainMember(workloadFields); ok {
			switch f { // the index in workloadFields
			case 0:
				w.ID = val
			case 1:
				w.ServiceID = val
			case 2:
				w.NodeID = val
			case 3:
				w.NodeAddress = val
			case 5:
				w.Address = val
			case 6:
				w.ObservedStatus = val
			case 7:
				w.Health = val
			default: // port
				return d.errorf("field %s is not a number", workloadFields[f])
			}
			if more, ok = d.comma(); ok {
				continue
			}
			more, err = d.more()
			continue
		}
		var key string
		if key, err = d.key(workloadFields); err != nil {
			return err
		}
		switch key {
		case "id":
			err = d.stringInto(&w.ID)
		case "service_id":
			err = d.stringInto(&w.ServiceID)
		case "node_id":
			err = d.stringInto(&w.NodeID)
		case "node_address":
			err = d.stringInto(&w.NodeAddress)
		case "port":
			err = d.intInto(&w.Port)
		case "address":
			err = d.stringInto(&w.Address)
		case "observed_status":
			err = d.stringInto(&w.ObservedStatus)
		case "health":
			err = d.stringInto(&w.Health)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) routesOutput(o *RoutesOutput) error {
	more, err := d.beginObject()
	for more && err == nil {
		var key string
		if key, err = d.key(outputFields); err != nil {
			return err
		}
		switch key {
		case "routes":
			err = decodeSlice(d, &o.Routes, d.route)
		case "sha256":
			err = d.stringInto(&o.SHA256)
		case "error":
			if d.literal("null") {
				o.Error = nil
				break
			}
			if o.Error == nil {
				o.Error = &GuestError{}
			}
			err = d.guestError(o.Error)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) guestError(e *GuestError) error {
	more, err := d.beginStruct("GuestError")
	for more && err == nil {
		var key string
		if key, err = d.key(guestErrorFields); err != nil {
			return err
		}
		switch key {
		case "code":
			err = d.stringInto(&e.Code)
		case "message":
			err = d.stringInto(&e.Message)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) route(r *routes.Route) error {
	more, err := d.beginStruct("Route")
	for more && err == nil {
		var key string
		if key, err = d.key(routeFields); err != nil {
			return err
		}
		switch key {
		case "hostname":
			err = d.stringInto(&r.Hostname)
		case "project":
			err = d.stringInto(&r.Project)
		case "service":
			err = d.stringInto(&r.Service)
		case "upstreams":
			err = decodeSlice(d, &r.Upstreams, d.upstream)
		case "tls_mode":
			err = d.stringInto(&r.TLSMode)
		case "allow_sources":
			err = decodeSlice(d, &r.AllowSources, d.stringInto)
		case "timeouts":
			err = d.timeouts(&r.Timeouts)
		case "stream":
			err = d.boolInto(&r.Stream)
		case "https_redirect":
			err = d.boolInto(&r.HTTPSRedirect)
		case "hsts_max_age_s":
			err = d.int64Into(&r.HSTSMaxAgeS)
		case "path_prefix":
			err = d.stringInto(&r.PathPrefix)
		case "strip_prefix":
			err = d.boolInto(&r.StripPrefix)
		case "headers":
			err = decodeSlice(d, &r.Headers, d.headerMatch)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) upstream(u *routes.Upstream) error {
	more, err := d.beginStruct("Upstream")
	for more && err == nil {
		var key string
		if key, err = d.key(upstreamFields); err != nil {
			return err
		}
		switch key {
		case "workload_id":
			err = d.stringInto(&u.WorkloadID)
		case "address":
			err = d.stringInto(&u.Address)
		case "healthy":
			err = d.boolInto(&u.Healthy)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) headerMatch(h *routes.HeaderMatch) error {
	more, err := d.beginStruct("HeaderMatch")
	for more && err == nil {
		var key string
		if key, err = d.key(headerMatchFields); err != nil {
			return err
		}
		switch key {
		case "name":
			err = d.stringInto(&h.Name)
		case "value":
			err = d.stringInto(&h.Value)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

func (d *routesDecoder) timeouts(t *routes.Timeouts) error {
	more, err := d.beginStruct("Timeouts")
	for more && err == nil {
		var key string
		if key, err = d.key(timeoutsFields); err != nil {
			return err
		}
		switch key {
		case "connect_ms":
			err = d.int64Into(&t.ConnectMS)
		case "response_header_ms":
			err = d.int64Into(&t.ResponseHeaderMS)
		case "idle_ms":
			err = d.int64Into(&t.IdleMS)
		default:
			err = d.skip()
		}
		if err == nil {
			more, err = d.more()
		}
	}
	return err
}

// boolInto reads true or false into dst; null leaves dst as it is.
func (d *routesDecoder) boolInto(dst *bool) error {
	switch {
	case d.literal("true"):
		*dst = true
	case d.literal("false"):
		*dst = false
	case d.literal("null"):
	default:
		return d.typeError("bool")
	}
	return nil
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
	return fmt.Errorf("%w: offset %d: %s", ErrRoutesJSON, d.i, fmt.Sprintf(format, args...))
}

// typeError refuses a value of the wrong type (after checking its syntax,
// so that the offset names the value).
func (d *routesDecoder) typeError(want string) error {
	at := d.i
	if err := d.skip(); err != nil {
		return err
	}
	return fmt.Errorf("%w: offset %d: value is not a %s", ErrRoutesJSON, at, want)
}

// literal consumes lit when the input continues with it.
func (d *routesDecoder) literal(lit string) bool {
	if len(d.s)-d.i >= len(lit) && d.s[d.i:d.i+len(lit)] == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// beginObject consumes the '{' of an object and reports whether a member
// follows. A caller then reads each member with key, the value, and more.
func (d *routesDecoder) beginObject() (bool, error) {
	if d.depth++; d.depth > maxRoutesDepth {
		return false, d.errorf("nested too deeply")
	}
	d.i++ // '{'
	d.ws()
	if d.peek() == '}' {
		d.i++
		d.depth--
		return false, nil
	}
	return true, nil
}

// beginStruct is beginObject for a value decoded into a struct: null
// leaves the struct as it is (no members), any other type is refused.
func (d *routesDecoder) beginStruct(typ string) (bool, error) {
	switch {
	case d.peek() == '{':
		return d.beginObject()
	case d.literal("null"):
		return false, nil
	}
	return false, d.typeError(typ)
}

// key reads a member's key and its ':' and returns the field of names it
// selects (or the key itself when it selects none), with the scanner at
// the value.
func (d *routesDecoder) key(names []string) (string, error) {
	if d.peek() != '"' {
		return "", d.errorf("object key is not a string")
	}
	// The fast path: a plain key, the name of a field, then ':' at once.
	if n := strings.IndexByte(d.s[d.i+1:], '"'); n >= 0 && d.i+n+2 < len(d.s) && d.s[d.i+n+2] == ':' {
		key := d.s[d.i+1 : d.i+1+n]
		for _, name := range names {
			if key == name {
				d.i += n + 3
				d.ws()
				return name, nil
			}
		}
	}
	key, err := d.str()
	if err != nil {
		return "", err
	}
	d.ws()
	if d.peek() != ':' {
		return "", d.errorf("missing ':' after object key")
	}
	d.i++
	d.ws()
	return matchField(key, names), nil
}

// plainMember reads a member "key":"value" written without white space,
// whose key is exactly one of names and whose value is a plain string
// (printable ASCII without escapes), and returns the key's index in names
// and the value; otherwise it
// leaves the scanner where it was and returns ok false, and the caller
// takes the general path. Most members of a routes input are such, and
// one call per member instead of several is what makes the difference
// inside a guest, where calls are dear.
func (d *routesDecoder) plainMember(names []string) (field int, val string, ok bool) {
	s, i := d.s, d.i
	if i >= len(s) || s[i] != '"' {
		return 0, "", false
	}
	n := strings.IndexByte(s[i+1:], '"')
	if n < 0 {
		return 0, "", false
	}
	k, j := s[i+1:i+1+n], i+n+2
	if j+1 >= len(s) || s[j] != ':' || s[j+1] != '"' {
		return 0, "", false
	}
	m := strings.IndexByte(s[j+2:], '"')
	if m < 0 {
		return 0, "", false
	}
	v := s[j+2 : j+2+m]
	for q := 0; q < len(v); q++ {
		if c := v[q]; c < 0x20 || c == '\\' || c >= utf8.RuneSelf {
			return 0, "", false
		}
	}
	for f, name := range names {
		if k == name {
			d.i = j + 3 + m
			return f, v, true
		}
	}
	return 0, "", false
}

// comma consumes a ',' right after a member's value and reports whether it
// did (another member follows); otherwise the caller calls more.
func (d *routesDecoder) comma() (more, ok bool) {
	if d.i < len(d.s) && d.s[d.i] == ',' {
		d.i++
		d.ws()
		return true, true
	}
	return false, false
}

// more consumes what follows a member's value and reports whether another
// member follows.
func (d *routesDecoder) more() (bool, error) {
	d.ws()
	switch d.peek() {
	case ',':
		d.i++
		d.ws()
		return true, nil
	case '}':
		d.i++
		d.depth--
		return false, nil
	}
	return false, d.errorf("missing ',' or '}' in object")
}

// matchField returns the name of names that key selects the way
// encoding/json selects a field: exactly, or equal after folding case.
func matchField(key string, names []string) string {
	if len(names) == 0 { // an object skipped: no field to select
		return key
	}
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
		if n := strings.IndexByte(d.s[d.i+1:], '"'); n >= 0 && plainString(d.s[d.i+1:d.i+1+n]) {
			*dst = d.s[d.i+1 : d.i+1+n]
			d.i += n + 2
			return nil
		}
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
	at := d.i
	n := int64(*dst)
	if err := d.int64Into(&n); err != nil {
		return err
	}
	if int64(int(n)) != n {
		return fmt.Errorf("%w: offset %d: number %d is not an int", ErrRoutesJSON, at, n)
	}
	*dst = int(n)
	return nil
}

// int64Into is intInto for an int64.
func (d *routesDecoder) int64Into(dst *int64) error {
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
	if err != nil {
		return fmt.Errorf("%w: offset %d: number %s is not an integer in range", ErrRoutesJSON, at, num)
	}
	*dst = n
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
		more, err := d.beginObject()
		for more && err == nil {
			if _, err = d.key(nil); err == nil {
				if err = d.skip(); err == nil {
					more, err = d.more()
				}
			}
		}
		return err
	case c == '[':
		var a []struct{}
		return decodeSlice(d, &a, d.skipElem)
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

// skipElem is skip for decodeSlice's elements.
func (d *routesDecoder) skipElem(*struct{}) error { return d.skip() }

// str scans a string and returns its value as encoding/json unquotes it.
func (d *routesDecoder) str() (string, error) {
	start := d.i + 1
	i := start
	// The fast path: up to the next quote, printable ASCII without escapes.
	if n := strings.IndexByte(d.s[start:], '"'); n >= 0 {
		seg := d.s[start : start+n]
		if plainString(seg) {
			d.i = start + n + 1
			return seg, nil
		}
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

// plainString reports whether s is printable ASCII without a backslash: a
// string's contents that mean themselves.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
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

// AppendRoutesInput appends json.Marshal(in) to out, without reflection.
func AppendRoutesInput(out []byte, in RoutesInput) []byte {
	out = append(out, `{"services":`...)
	if in.Services == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i := range in.Services {
			if i > 0 {
				out = append(out, ',')
			}
			s := &in.Services[i]
			out = append(out, `{"id":`...)
			out = AppendJSONString(out, s.ID)
			out = append(out, `,"project":`...)
			out = AppendJSONString(out, s.Project)
			out = append(out, `,"name":`...)
			out = AppendJSONString(out, s.Name)
			out = append(out, `,"domains":`...)
			out = appendStrings(out, s.Domains)
			if s.TLSMode != "" {
				out = append(out, `,"tls_mode":`...)
				out = AppendJSONString(out, s.TLSMode)
			}
			if len(s.AllowSources) > 0 {
				out = append(out, `,"allow_sources":`...)
				out = appendStrings(out, s.AllowSources)
			}
			out = append(out, '}')
		}
		out = append(out, ']')
	}
	out = append(out, `,"workloads":`...)
	if in.Workloads == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, '[')
		for i := range in.Workloads {
			if i > 0 {
				out = append(out, ',')
			}
			w := &in.Workloads[i]
			out = append(out, `{"id":`...)
			out = AppendJSONString(out, w.ID)
			out = append(out, `,"service_id":`...)
			out = AppendJSONString(out, w.ServiceID)
			out = append(out, `,"node_id":`...)
			out = AppendJSONString(out, w.NodeID)
			out = append(out, `,"node_address":`...)
			out = AppendJSONString(out, w.NodeAddress)
			out = append(out, `,"port":`...)
			out = strconv.AppendInt(out, int64(w.Port), 10)
			out = append(out, `,"address":`...)
			out = AppendJSONString(out, w.Address)
			out = append(out, `,"observed_status":`...)
			out = AppendJSONString(out, w.ObservedStatus)
			out = append(out, `,"health":`...)
			out = AppendJSONString(out, w.Health)
			out = append(out, '}')
		}
		out = append(out, ']')
	}
	return append(out, '}')
}

// appendStrings appends json.Marshal(ss): null for a nil slice.
func appendStrings(out []byte, ss []string) []byte {
	if ss == nil {
		return append(out, "null"...)
	}
	out = append(out, '[')
	for i, s := range ss {
		if i > 0 {
			out = append(out, ',')
		}
		out = AppendJSONString(out, s)
	}
	return append(out, ']')
}

// AppendRoutes appends json.Marshal(rs) to out, without reflection; a nil
// rs is written as [] (json.Marshal writes null). SHA-256 over its output
// for a normalized, non-empty table is [routes.Table.Digest].
func AppendRoutes(out []byte, rs []routes.Route) []byte {
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
func appendRoute(out []byte, r *routes.Route) []byte {
	out = append(out, `{"hostname":`...)
	out = AppendJSONString(out, r.Hostname)
	out = append(out, `,"project":`...)
	out = AppendJSONString(out, r.Project)
	out = append(out, `,"service":`...)
	out = AppendJSONString(out, r.Service)
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
			out = AppendJSONString(out, u.WorkloadID)
			out = append(out, `,"address":`...)
			out = AppendJSONString(out, u.Address)
			out = append(out, `,"healthy":`...)
			out = strconv.AppendBool(out, u.Healthy)
			out = append(out, '}')
		}
		out = append(out, ']')
	}
	if r.TLSMode != "" {
		out = append(out, `,"tls_mode":`...)
		out = AppendJSONString(out, r.TLSMode)
	}
	if len(r.AllowSources) > 0 {
		out = append(out, `,"allow_sources":[`...)
		for i, s := range r.AllowSources {
			if i > 0 {
				out = append(out, ',')
			}
			out = AppendJSONString(out, s)
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
	if r.PathPrefix != "" {
		out = append(out, `,"path_prefix":`...)
		out = AppendJSONString(out, r.PathPrefix)
	}
	if r.StripPrefix {
		out = append(out, `,"strip_prefix":true`...)
	}
	if len(r.Headers) > 0 {
		out = append(out, `,"headers":[`...)
		for i, h := range r.Headers {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, `{"name":`...)
			out = AppendJSONString(out, h.Name)
			out = append(out, `,"value":`...)
			out = AppendJSONString(out, h.Value)
			out = append(out, '}')
		}
		out = append(out, ']')
	}
	return append(out, '}')
}

// AppendJSONString appends s quoted exactly as encoding/json's Marshal
// quotes it: \" \\ \b \f \n \r \t, other control bytes and the
// HTML-sensitive < > & as \u00XX, U+2028 and U+2029 escaped, each invalid
// UTF-8 byte as \ufffd. Guests (sdk/wasm) and the host share it.
func AppendJSONString(out []byte, s string) []byte {
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
