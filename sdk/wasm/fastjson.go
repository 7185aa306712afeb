package wasm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fastjson"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// The guest's fast path: encoding/json decodes by reflection, which is slow
// inside a GOOS=wasip1 guest, so the policy input and the service object,
// which every policy reads, are decoded with fastjson (no reflection). The
// result equals json.Unmarshal's for every field the types have (a test
// checks each field); unknown fields are ignored, as there.

// foldKey folds an object key the way encoding/json matches field names
// (case-insensitively, by Unicode simple folding): each rune becomes the
// smallest rune of its folding orbit, and ASCII letters lower case. A key
// already in lower-case ASCII comes back as it is, and any other ASCII key
// is folded into buf, so the decoders' switch on string(foldKey(...))
// allocates nothing for the keys the ABI's types have (the compiler does not
// copy a []byte converted only to be compared).
func foldKey(buf *[32]byte, k []byte) []byte {
	ascii, lower := true, true
	for _, c := range k {
		if c >= 0x80 {
			ascii = false
			break
		}
		if 'A' <= c && c <= 'Z' {
			lower = false
		}
	}
	switch {
	case ascii && lower:
		return k
	case ascii:
		var b []byte
		if len(k) <= len(buf) {
			b = buf[:len(k)]
		} else {
			b = make([]byte, len(k))
		}
		for i, c := range k {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b[i] = c
		}
		return b
	}
	var out []rune
	for _, r := range string(k) {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		if 'A' <= least && least <= 'Z' {
			least += 'a' - 'A'
		}
		out = append(out, least)
	}
	return []byte(string(out))
}

// parsers hold fastjson's parsers between calls: a parser keeps the values
// of its last parse and reuses them, where a new one would grow its value
// cache from nothing on every call (most of the fast path's time and
// allocation, measured). No decoded field refers to a parser's memory
// (strings are copied, raw values re-encoded), so a parser goes back to
// the pool as soon as its decoder returns.
var parsers fastjson.ParserPool

// decodePolicyInput is json.Unmarshal into an [abiwasm.PolicyInput].
func decodePolicyInput(input []byte) (abiwasm.PolicyInput, error) {
	p := parsers.Get()
	defer parsers.Put(p)
	in, _, err := decodePolicyInputTrees(p, input)
	return in, err
}

// inputTrees are the parsed values of a policy input's object and old
// object (nil when absent), which live in the parser that parsed them.
type inputTrees struct{ object, oldObject *fastjson.Value }

// decodePolicyInputTrees is decodePolicyInput with p, also returning the
// parsed object and old object, valid until p parses again.
func decodePolicyInputTrees(p *fastjson.Parser, input []byte) (abiwasm.PolicyInput, inputTrees, error) {
	var in abiwasm.PolicyInput
	var trees inputTrees
	v, err := p.ParseBytes(input)
	if err != nil {
		return in, trees, err
	}
	o, err := v.Object()
	if err != nil {
		return in, trees, fmt.Errorf("policy input: %w", err)
	}
	var ferr error
	var kb [32]byte
	// The raw values are copies of input's bytes (what json.Unmarshal
	// gives a RawMessage), found by spans, or, if the spans do not line
	// up with the parsed members, parts of input re-encoded: together
	// they take about its length.
	rawBuf := make([]byte, 0, len(input))
	var spansBuf [8][2]int
	spans, spansOK := memberSpans(input, spansBuf[:0])
	spansOK = spansOK && len(spans) == o.Len()
	member := -1
	raw := func(f *fastjson.Value) json.RawMessage {
		var r json.RawMessage
		if spansOK {
			sp := spans[member]
			start := len(rawBuf)
			rawBuf = append(rawBuf, input[sp[0]:sp[1]]...)
			r = rawBuf[start:len(rawBuf):len(rawBuf)]
		} else {
			r, rawBuf = reencode(f, rawBuf)
		}
		return r
	}
	o.Visit(func(key []byte, f *fastjson.Value) {
		member++
		if ferr != nil {
			return
		}
		switch string(foldKey(&kb, key)) {
		case "hook":
			var s string
			s, ferr = str(f, "hook")
			in.Hook = abiwasm.Hook(s)
		case "actor":
			in.Actor, ferr = decodeActor(f)
		case "project":
			if f.Type() != fastjson.TypeNull {
				in.Project, ferr = decodeProject(f)
			} else {
				in.Project = nil
			}
		case "object":
			in.Object = raw(f)
			trees.object = f
		case "old_object":
			in.OldObject = raw(f)
			trees.oldObject = f
		case "config":
			in.Config = raw(f)
		}
	})
	return in, trees, ferr
}

// rawKey names one raw value by where its bytes are, so that a decoder
// handed back the very slice a decode produced can find its parsed tree.
type rawKey struct {
	at *byte
	n  int
}

func keyOf(raw []byte) rawKey { return rawKey{unsafe.SliceData(raw), len(raw)} }

// parsedObjects maps the raw object and old object of every policy input
// being handled ([HandlePolicy], while its PolicyFunc runs) to their parsed
// trees, so [Object] decodes a service from the tree instead of parsing its
// bytes a second time (measured: the second parse was a third of the
// guest's decode time). Entries are removed before HandlePolicy returns;
// only slices it made are keys, so a look-up never finds another's tree.
var parsedObjects sync.Map // rawKey -> *fastjson.Value

// rememberTrees records in's raw objects and their trees in parsedObjects
// and returns the function that forgets them.
func rememberTrees(in abiwasm.PolicyInput, trees inputTrees) (forget func()) {
	var keys [2]rawKey
	n := 0
	for _, e := range [2]struct {
		raw  json.RawMessage
		tree *fastjson.Value
	}{{in.Object, trees.object}, {in.OldObject, trees.oldObject}} {
		if e.tree != nil && len(e.raw) > 0 {
			keys[n] = keyOf(e.raw)
			parsedObjects.Store(keys[n], e.tree)
			n++
		}
	}
	return func() {
		for _, k := range keys[:n] {
			parsedObjects.Delete(k)
		}
	}
}

// decodeServiceRaw is decodeService, from the parsed tree when raw is an
// object of the input being handled.
func decodeServiceRaw(raw []byte, s *abiwasm.Service) error {
	if v, ok := parsedObjects.Load(keyOf(raw)); ok {
		return decodeServiceValue(v.(*fastjson.Value), s)
	}
	return decodeService(raw, s)
}

// memberSpans returns, for the JSON object in data (which a parser has
// already accepted), the byte span of each member's value in order,
// appended to spans. It reports false when data does not read as it
// expects; the caller then re-encodes the parsed values instead.
func memberSpans(data []byte, spans [][2]int) ([][2]int, bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return spans, false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return spans, true
	}
	for i < len(data) {
		if data[i] != '"' {
			return spans, false
		}
		if i = skipString(data, i); i < 0 {
			return spans, false
		}
		if i = skipSpace(data, i); i >= len(data) || data[i] != ':' {
			return spans, false
		}
		start := skipSpace(data, i+1)
		end := skipValue(data, start)
		if end < 0 {
			return spans, false
		}
		spans = append(spans, [2]int{start, end})
		i = skipSpace(data, end)
		if i >= len(data) {
			return spans, false
		}
		switch data[i] {
		case '}':
			return spans, true
		case ',':
			i = skipSpace(data, i+1)
		default:
			return spans, false
		}
	}
	return spans, false
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at data[i] ('"'),
// or -1.
func skipString(data []byte, i int) int {
	for i++; ; {
		n := bytes.IndexByte(data[i:], '"')
		if n < 0 {
			return -1
		}
		i += n
		escapes := 0
		for j := i - 1; j >= 0 && data[j] == '\\'; j-- {
			escapes++
		}
		i++
		if escapes%2 == 0 {
			return i
		}
	}
}

// skipValue returns the index after the value starting at data[i], or -1.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				if i = skipString(data, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	for i < len(data) {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return -1
}

// reencode re-encodes v at the end of buf and returns the encoding (with no
// room to grow into what follows) and the extended buf. The raw values of
// one input share buf, one allocation instead of one per value and growth.
func reencode(v *fastjson.Value, buf []byte) (json.RawMessage, []byte) {
	start := len(buf)
	buf = v.MarshalTo(buf)
	return json.RawMessage(buf[start:len(buf):len(buf)]), buf
}

func str(v *fastjson.Value, field string) (string, error) {
	switch v.Type() {
	case fastjson.TypeNull:
		return "", nil
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		if !utf8.Valid(b) { // as encoding/json: one U+FFFD per invalid byte
			return string([]rune(string(b))), nil
		}
		return string(b), nil
	}
	return "", fmt.Errorf("field %s: %s is not a string", field, v.Type())
}

func integer(v *fastjson.Value, field string) (int64, error) {
	if v.Type() == fastjson.TypeNull {
		return 0, nil
	}
	n, err := v.Int64()
	if err != nil {
		return 0, fmt.Errorf("field %s: %w", field, err)
	}
	return n, nil
}

func strings1(v *fastjson.Value, field string) ([]string, error) {
	if v.Type() == fastjson.TypeNull {
		return nil, nil
	}
	a, err := v.Array()
	if err != nil {
		return nil, fmt.Errorf("field %s: %w", field, err)
	}
	out := make([]string, len(a))
	for i, e := range a {
		if out[i], err = str(e, field); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func stringMap(v *fastjson.Value, field string) (map[string]string, error) {
	if v.Type() == fastjson.TypeNull {
		return nil, nil
	}
	o, err := v.Object()
	if err != nil {
		return nil, fmt.Errorf("field %s: %w", field, err)
	}
	out := make(map[string]string, o.Len())
	o.Visit(func(k []byte, e *fastjson.Value) {
		if err != nil {
			return
		}
		var s string
		s, err = str(e, field)
		key := string(k)
		if !utf8.ValidString(key) {
			key = string([]rune(key))
		}
		out[key] = s
	})
	return out, err
}

func decodeActor(v *fastjson.Value) (abiwasm.Actor, error) {
	var a abiwasm.Actor
	if v.Type() == fastjson.TypeNull {
		return a, nil
	}
	o, err := v.Object()
	if err != nil {
		return a, fmt.Errorf("field actor: %w", err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		switch string(foldKey(&kb, k)) {
		case "kind":
			a.Kind, err = str(f, "actor.kind")
		case "id":
			a.ID, err = str(f, "actor.id")
		}
	})
	return a, err
}

func decodeProject(v *fastjson.Value) (*abiwasm.Project, error) {
	p := &abiwasm.Project{}
	o, err := v.Object()
	if err != nil {
		return nil, fmt.Errorf("field project: %w", err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		var n int64
		switch string(foldKey(&kb, k)) {
		case "name":
			p.Name, err = str(f, "project.name")
		case "services":
			n, err = integer(f, "project.services")
			p.Services = int(n)
		case "replicas":
			n, err = integer(f, "project.replicas")
			p.Replicas = int(n)
		case "capacity_units":
			n, err = integer(f, "project.capacity_units")
			p.CapacityUnits = int(n)
		}
	})
	return p, err
}

// decodeService is json.Unmarshal into an [abiwasm.Service].
func decodeService(data []byte, s *abiwasm.Service) error {
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(data)
	if err != nil {
		return err
	}
	return decodeServiceValue(v, s)
}

// decodeServiceValue is decodeService of a parsed value.
func decodeServiceValue(v *fastjson.Value, s *abiwasm.Service) error {
	o, err := v.Object()
	if err != nil {
		return fmt.Errorf("service: %w", err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		var n int64
		key := foldKey(&kb, k)
		if f.Type() == fastjson.TypeNull && !nullClears(key) {
			return // as encoding/json: null leaves a string or number as it was
		}
		switch string(key) {
		case "project":
			s.Project, err = str(f, "project")
		case "name":
			s.Name, err = str(f, "name")
		case "revision":
			s.Revision, err = integer(f, "revision")
		case "bundle":
			s.Bundle, err = str(f, "bundle")
		case "bundle_digest":
			s.BundleDigest, err = str(f, "bundle_digest")
		case "image":
			s.Image, err = str(f, "image")
		case "command":
			s.Command, err = strings1(f, "command")
		case "env":
			s.Env, err = mergeStringMap(f, "env", s.Env)
		case "port":
			n, err = integer(f, "port")
			s.Port = int(n)
		case "domains":
			s.Domains, err = strings1(f, "domains")
		case "replicas":
			n, err = integer(f, "replicas")
			s.Replicas = int(n)
		case "capacity_units":
			n, err = integer(f, "capacity_units")
			s.CapacityUnits = int(n)
		case "labels":
			s.Labels, err = mergeStringMap(f, "labels", s.Labels)
		case "health_check":
			err = decodeHealthCheck(f, &s.HealthCheck)
		case "placement_mode":
			s.PlacementMode, err = str(f, "placement_mode")
		case "lease":
			s.Lease, err = decodeLease(f, s.Lease)
		case "runtime":
			s.Runtime, err = str(f, "runtime")
		case "user":
			s.User, err = str(f, "user")
		case "memory_mb":
			s.MemoryMB, err = integer(f, "memory_mb")
		case "cpu_millis":
			s.CPUMillis, err = integer(f, "cpu_millis")
		}
	})
	return err
}

// decodeHealthCheck is json.Unmarshal of v into h: null leaves h as it is.
func decodeHealthCheck(v *fastjson.Value, h *abiwasm.HealthCheck) error {
	if v.Type() == fastjson.TypeNull {
		return nil
	}
	o, err := v.Object()
	if err != nil {
		return fmt.Errorf("field health_check: %w", err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		var n int64
		switch string(foldKey(&kb, k)) {
		case "path":
			h.Path, err = str(f, "health_check.path")
		case "interval_s":
			n, err = integer(f, "health_check.interval_s")
			h.IntervalS = int(n)
		case "timeout_s":
			n, err = integer(f, "health_check.timeout_s")
			h.TimeoutS = int(n)
		case "failures":
			n, err = integer(f, "health_check.failures")
			h.Failures = int(n)
		}
	})
	return err
}

// decodeLease is json.Unmarshal of v into a *Lease holding cur: null is nil,
// an object fills cur (a new Lease when cur is nil).
func decodeLease(v *fastjson.Value, cur *abiwasm.Lease) (*abiwasm.Lease, error) {
	if v.Type() == fastjson.TypeNull {
		return nil, nil
	}
	o, err := v.Object()
	if err != nil {
		return cur, fmt.Errorf("field lease: %w", err)
	}
	if cur == nil {
		cur = &abiwasm.Lease{}
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		switch string(foldKey(&kb, k)) {
		case "mode":
			cur.Mode, err = str(f, "lease.mode")
		case "duration_ms":
			cur.DurationMS, err = integer(f, "lease.duration_ms")
		}
	})
	return cur, err
}

// decodeNodeRaw is json.Unmarshal into an [abiwasm.Node], from the parsed
// tree when raw is an object of the input being handled.
func decodeNodeRaw(raw []byte, n *abiwasm.Node) error {
	if v, ok := parsedObjects.Load(keyOf(raw)); ok {
		return decodeNodeValue(v.(*fastjson.Value), n, "")
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(raw)
	if err != nil {
		return err
	}
	return decodeNodeValue(v, n, "")
}

// decodeNodeValue is json.Unmarshal of v into n; at names the field in
// errors ("node." inside a placement).
func decodeNodeValue(v *fastjson.Value, n *abiwasm.Node, at string) error {
	if at != "" && v.Type() == fastjson.TypeNull {
		return nil
	}
	o, err := v.Object()
	if err != nil {
		return fmt.Errorf("%snode: %w", at, err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		var i int64
		key := foldKey(&kb, k)
		if f.Type() == fastjson.TypeNull && !nullClears(key) {
			return
		}
		switch string(key) {
		case "id":
			n.ID, err = str(f, at+"id")
		case "hostname":
			n.Hostname, err = str(f, at+"hostname")
		case "region":
			n.Region, err = str(f, at+"region")
		case "labels":
			n.Labels, err = mergeStringMap(f, at+"labels", n.Labels)
		case "address":
			n.Address, err = str(f, at+"address")
		case "cpus":
			i, err = integer(f, at+"cpus")
			n.CPUs = int(i)
		case "memory_mb":
			n.MemoryMB, err = integer(f, at+"memory_mb")
		}
	})
	return err
}

// decodePlacementRaw is json.Unmarshal into an [abiwasm.Placement], from the
// parsed tree when raw is an object of the input being handled.
func decodePlacementRaw(raw []byte, pl *abiwasm.Placement) error {
	if v, ok := parsedObjects.Load(keyOf(raw)); ok {
		return decodePlacementValue(v.(*fastjson.Value), pl)
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(raw)
	if err != nil {
		return err
	}
	return decodePlacementValue(v, pl)
}

// decodePlacementValue is json.Unmarshal of v into pl. As there, a member
// met twice decodes into what the first one filled.
func decodePlacementValue(v *fastjson.Value, pl *abiwasm.Placement) error {
	o, err := v.Object()
	if err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	var kb [32]byte
	o.Visit(func(k []byte, f *fastjson.Value) {
		if err != nil {
			return
		}
		var i int64
		switch string(foldKey(&kb, k)) {
		case "service":
			if f.Type() != fastjson.TypeNull {
				err = decodeServiceValue(f, &pl.Service)
			}
		case "slot":
			if f.Type() != fastjson.TypeNull {
				i, err = integer(f, "slot")
				pl.Slot = int(i)
			}
		case "node":
			err = decodeNodeValue(f, &pl.Node, "node.")
		}
	})
	return err
}

// mergeStringMap is json.Unmarshal of v into the map cur: null makes it nil,
// an object adds its members to cur (a new map when cur is nil).
func mergeStringMap(v *fastjson.Value, field string, cur map[string]string) (map[string]string, error) {
	m, err := stringMap(v, field)
	if err != nil || m == nil || cur == nil {
		return m, err
	}
	for k, s := range m {
		cur[k] = s
	}
	return cur, nil
}

// nullClears reports whether a JSON null sets the field of this folded key
// to nil (a slice, map or pointer: command, env, domains, labels, lease), as
// encoding/json does; for any other field null changes nothing.
func nullClears(key []byte) bool {
	switch string(key) {
	case "command", "env", "domains", "labels", "lease":
		return true
	}
	return false
}
