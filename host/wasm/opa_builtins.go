package wasm

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// opaBuiltinImpl is the host's implementation of one OPA builtin over JSON
// values (decoded with UseNumber). An error makes the call undefined.
type opaBuiltinImpl func(args []any) (any, error)

// fixedNow is what time.now_ns answers: modules see no clock
// (docs/wasm-abi.md section 3.2), so an evaluation depends on its input only.
var fixedNow = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

var errBuiltinArg = errors.New("berth: bad builtin argument")

// opaBuiltins are the builtins an OPA-compiled module may ask the host for
// (docs/wasm-abi.md section 11.3). OPA compiles most builtins into the
// module itself; these are the ones it leaves to the host, among them the
// string, regex, glob, time, json, units, semver and net families.
var opaBuiltins = map[string]opaBuiltinImpl{
	"sprintf":                opaSprintf,
	"time.now_ns":            func([]any) (any, error) { return fixedNow.UnixNano(), nil },
	"time.parse_rfc3339_ns":  func(a []any) (any, error) { return parseTime(time.RFC3339Nano, a, 0) },
	"time.parse_ns":          func(a []any) (any, error) { return parseTime("", a, 0) },
	"time.parse_duration_ns": opaParseDuration,
	"time.date":              func(a []any) (any, error) { return timeParts(a, "date") },
	"time.clock":             func(a []any) (any, error) { return timeParts(a, "clock") },
	"time.weekday":           func(a []any) (any, error) { return timeParts(a, "weekday") },
	"time.add_date":          opaAddDate,
	"semver.compare":         opaSemverCompare,
	"semver.is_valid":        func(a []any) (any, error) { s, ok := a[0].(string); return ok && parseSemver(s) != nil, nil },
	"units.parse_bytes":      func(a []any) (any, error) { return parseUnits(a, true) },
	"units.parse":            func(a []any) (any, error) { return parseUnits(a, false) },
	"json.marshal":           func(a []any) (any, error) { b, err := json.Marshal(a[0]); return string(b), err },
	"json.unmarshal":         opaJSONUnmarshal,
	"json.is_valid":          func(a []any) (any, error) { s, ok := a[0].(string); return ok && json.Valid([]byte(s)), nil },
	"regex.match":            opaRegexMatch,
	"regex.is_valid": func(a []any) (any, error) {
		s, ok := a[0].(string)
		_, err := regexp.Compile(s)
		return ok && err == nil, nil
	},
	"regex.find_n":        opaRegexFindN,
	"regex.split":         opaRegexSplit,
	"regex.replace":       opaRegexReplace,
	"glob.match":          opaGlobMatch,
	"net.cidr_contains":   opaCIDRContains,
	"net.cidr_intersects": opaCIDRIntersects,
	"strings.replace_n":   opaReplaceN,
	"concat":              opaConcat,
	"contains":            strPair(func(a, b string) any { return strings.Contains(a, b) }),
	"startswith":          strPair(func(a, b string) any { return strings.HasPrefix(a, b) }),
	"endswith":            strPair(func(a, b string) any { return strings.HasSuffix(a, b) }),
	"split":               strPair(func(a, b string) any { return strings.Split(a, b) }),
	"indexof":             strPair(func(a, b string) any { return strings.Index(a, b) }),
	"trim":                strPair(func(a, b string) any { return strings.Trim(a, b) }),
	"trim_prefix":         strPair(func(a, b string) any { return strings.TrimPrefix(a, b) }),
	"trim_suffix":         strPair(func(a, b string) any { return strings.TrimSuffix(a, b) }),
	"trim_space":          str1(strings.TrimSpace),
	"lower":               str1(strings.ToLower),
	"upper":               str1(strings.ToUpper),
	"replace": func(a []any) (any, error) {
		s, ok1 := a[0].(string)
		o, ok2 := a[1].(string)
		n, ok3 := a[2].(string)
		if !ok1 || !ok2 || !ok3 {
			return nil, errBuiltinArg
		}
		return strings.ReplaceAll(s, o, n), nil
	},
}

func str1(f func(string) string) opaBuiltinImpl {
	return func(a []any) (any, error) {
		s, ok := a[0].(string)
		if !ok {
			return nil, errBuiltinArg
		}
		return f(s), nil
	}
}

func strPair(f func(a, b string) any) opaBuiltinImpl {
	return func(a []any) (any, error) {
		x, ok1 := a[0].(string)
		y, ok2 := a[1].(string)
		if !ok1 || !ok2 {
			return nil, errBuiltinArg
		}
		return f(x, y), nil
	}
}

func strings2(a []any) ([]string, error) {
	var out []string
	for _, v := range a {
		s, ok := v.(string)
		if !ok {
			return nil, errBuiltinArg
		}
		out = append(out, s)
	}
	return out, nil
}

func opaConcat(a []any) (any, error) {
	sep, ok := a[0].(string)
	list, ok2 := a[1].([]any)
	if !ok || !ok2 {
		return nil, errBuiltinArg
	}
	parts, err := strings2(list)
	if err != nil {
		return nil, err
	}
	return strings.Join(parts, sep), nil
}

// opaSprintf formats like OPA: Go's verbs over the decoded values, numbers
// as integers when they are whole.
func opaSprintf(a []any) (any, error) {
	format, ok := a[0].(string)
	list, ok2 := a[1].([]any)
	if !ok || !ok2 {
		return nil, errBuiltinArg
	}
	vals := make([]any, len(list))
	for i, v := range list {
		vals[i] = goValue(v)
	}
	return fmt.Sprintf(format, vals...), nil
}

// goValue turns json.Number into int64, *big.Int or float64, recursively
// for %v of arrays and objects.
func goValue(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if b, ok := new(big.Int).SetString(string(x), 10); ok {
			return b
		}
		f, _ := x.Float64()
		return f
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = goValue(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = goValue(e)
		}
		return out
	}
	return v
}

func number(v any) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, errBuiltinArg
	}
	if i, err := n.Int64(); err == nil {
		return i, nil
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) {
		return 0, errBuiltinArg
	}
	return int64(f), nil
}

// parseTime implements time.parse_rfc3339_ns (layout given) and
// time.parse_ns(layout, value).
func parseTime(layout string, a []any, _ int) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	value := args[0]
	if layout == "" {
		layout, value = args[0], args[1]
	}
	t, err := time.Parse(layout, value)
	if err != nil {
		return nil, err
	}
	return t.UnixNano(), nil
}

func opaParseDuration(a []any) (any, error) {
	s, ok := a[0].(string)
	if !ok {
		return nil, errBuiltinArg
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, err
	}
	return int64(d), nil
}

// timeOf reads ns or [ns, tz].
func timeOf(v any) (time.Time, error) {
	tz := "UTC"
	if pair, ok := v.([]any); ok && len(pair) == 2 {
		v = pair[0]
		if s, ok := pair[1].(string); ok && s != "" {
			tz = s
		}
	}
	ns, err := number(v)
	if err != nil {
		return time.Time{}, err
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns).In(loc), nil
}

func timeParts(a []any, what string) (any, error) {
	t, err := timeOf(a[0])
	if err != nil {
		return nil, err
	}
	switch what {
	case "date":
		return []any{t.Year(), int(t.Month()), t.Day()}, nil
	case "clock":
		return []any{t.Hour(), t.Minute(), t.Second()}, nil
	}
	return t.Weekday().String(), nil
}

func opaAddDate(a []any) (any, error) {
	ns, err := number(a[0])
	if err != nil {
		return nil, err
	}
	var d [3]int64
	for i := range d {
		if d[i], err = number(a[i+1]); err != nil {
			return nil, err
		}
	}
	return time.Unix(0, ns).UTC().AddDate(int(d[0]), int(d[1]), int(d[2])).UnixNano(), nil
}

// semver is a parsed semantic version (semver.org 2.0.0).
type semver struct {
	core [3]uint64
	pre  []string
}

func parseSemver(s string) *semver {
	s, _, _ = strings.Cut(s, "+")
	core, pre, hasPre := strings.Cut(s, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return nil
	}
	var v semver
	for i, p := range parts {
		if p == "" || (len(p) > 1 && p[0] == '0') {
			return nil
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil
		}
		v.core[i] = n
	}
	if hasPre {
		v.pre = strings.Split(pre, ".")
		for _, id := range v.pre {
			if id == "" {
				return nil
			}
		}
	}
	return &v
}

func opaSemverCompare(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	x, y := parseSemver(args[0]), parseSemver(args[1])
	if x == nil || y == nil {
		return nil, errBuiltinArg
	}
	for i := range x.core {
		if x.core[i] != y.core[i] {
			return cmpSign(x.core[i] < y.core[i]), nil
		}
	}
	switch {
	case len(x.pre) == 0 && len(y.pre) == 0:
		return 0, nil
	case len(x.pre) == 0:
		return 1, nil
	case len(y.pre) == 0:
		return -1, nil
	}
	for i := 0; i < len(x.pre) && i < len(y.pre); i++ {
		p, q := x.pre[i], y.pre[i]
		if p == q {
			continue
		}
		pn, perr := strconv.ParseUint(p, 10, 64)
		qn, qerr := strconv.ParseUint(q, 10, 64)
		switch {
		case perr == nil && qerr == nil:
			return cmpSign(pn < qn), nil
		case perr == nil:
			return -1, nil
		case qerr == nil:
			return 1, nil
		}
		return cmpSign(p < q), nil
	}
	if len(x.pre) == len(y.pre) {
		return 0, nil
	}
	return cmpSign(len(x.pre) < len(y.pre)), nil
}

func cmpSign(less bool) int {
	if less {
		return -1
	}
	return 1
}

var unitFactors = map[string]float64{
	"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18,
	"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40, "pi": 1 << 50, "ei": 1 << 60,
}

// parseUnits implements units.parse_bytes ("10KiB", "1.5GB") and
// units.parse ("10k", "1.5Gi", "250m" = milli).
func parseUnits(a []any, bytesUnit bool) (any, error) {
	s, ok := a[0].(string)
	if !ok {
		return nil, errBuiltinArg
	}
	s = strings.ReplaceAll(strings.TrimSpace(s), "\"", "")
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return nil, err
	}
	if bytesUnit {
		unit = strings.TrimSuffix(strings.ToLower(unit), "b")
	} else if unit == "m" {
		return f / 1000, nil
	} else {
		unit = strings.ToLower(unit)
	}
	factor, ok := unitFactors[unit]
	if !ok {
		return nil, fmt.Errorf("%w: unknown unit %q", errBuiltinArg, unit)
	}
	v := f * factor
	if bytesUnit {
		return int64(v), nil
	}
	if v == math.Trunc(v) && math.Abs(v) < 1<<62 {
		return int64(v), nil
	}
	return v, nil
}

func opaJSONUnmarshal(a []any) (any, error) {
	s, ok := a[0].(string)
	if !ok {
		return nil, errBuiltinArg
	}
	var v any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func opaRegexMatch(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile(args[0])
	if err != nil {
		return nil, err
	}
	return re.MatchString(args[1]), nil
}

func opaRegexFindN(a []any) (any, error) {
	pattern, ok1 := a[0].(string)
	s, ok2 := a[1].(string)
	n, err := number(a[2])
	if !ok1 || !ok2 || err != nil {
		return nil, errBuiltinArg
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	out := re.FindAllString(s, int(n))
	if out == nil {
		out = []string{}
	}
	return out, nil
}

func opaRegexSplit(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile(args[0])
	if err != nil {
		return nil, err
	}
	return re.Split(args[1], -1), nil
}

func opaRegexReplace(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile(args[1])
	if err != nil {
		return nil, err
	}
	return re.ReplaceAllString(args[0], args[2]), nil
}

// opaGlobMatch implements glob.match(pattern, delimiters, match): * and ?
// stop at a delimiter (default "."), ** crosses them, [...] and {a,b} as in
// shells.
func opaGlobMatch(a []any) (any, error) {
	pattern, ok1 := a[0].(string)
	s, ok3 := a[2].(string)
	if !ok1 || !ok3 {
		return nil, errBuiltinArg
	}
	delims := []string{"."}
	if list, ok := a[1].([]any); ok && len(list) > 0 {
		var err error
		if delims, err = strings2(list); err != nil {
			return nil, err
		}
	}
	not := "[^" + regexp.QuoteMeta(strings.Join(delims, "")) + "]"
	var re strings.Builder
	re.WriteString("^")
	depth := 0
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case c == '*' && i+1 < len(pattern) && pattern[i+1] == '*':
			re.WriteString(".*")
			i++
		case c == '*':
			re.WriteString(not + "*")
		case c == '?':
			re.WriteString(not)
		case c == '[':
			j := strings.IndexByte(pattern[i:], ']')
			if j < 0 {
				return nil, errBuiltinArg
			}
			class := pattern[i+1 : i+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			re.WriteString("[" + class + "]")
			i += j
		case c == '{':
			depth++
			re.WriteString("(?:")
		case c == '}' && depth > 0:
			depth--
			re.WriteString(")")
		case c == ',' && depth > 0:
			re.WriteString("|")
		case c == '\\' && i+1 < len(pattern):
			i++
			re.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		default:
			re.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	re.WriteString("$")
	r, err := regexp.Compile(re.String())
	if err != nil {
		return nil, err
	}
	return r.MatchString(s), nil
}

func prefixOf(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func opaCIDRContains(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	outer, err := netip.ParsePrefix(args[0])
	if err != nil {
		return nil, err
	}
	inner, err := prefixOf(args[1])
	if err != nil {
		return nil, err
	}
	return inner.Bits() >= outer.Bits() && outer.Masked().Contains(inner.Addr()), nil
}

func opaCIDRIntersects(a []any) (any, error) {
	args, err := strings2(a)
	if err != nil {
		return nil, err
	}
	x, err := netip.ParsePrefix(args[0])
	if err != nil {
		return nil, err
	}
	y, err := netip.ParsePrefix(args[1])
	if err != nil {
		return nil, err
	}
	return x.Overlaps(y), nil
}

func opaReplaceN(a []any) (any, error) {
	pairs, ok := a[0].(map[string]any)
	s, ok2 := a[1].(string)
	if !ok || !ok2 {
		return nil, errBuiltinArg
	}
	keys := make([]string, 0, len(pairs))
	for k := range pairs {
		keys = append(keys, k)
	}
	sort.Strings(keys) // one order for one input: evaluations are deterministic
	var oldnew []string
	for _, k := range keys {
		vs, ok := pairs[k].(string)
		if !ok {
			return nil, errBuiltinArg
		}
		oldnew = append(oldnew, k, vs)
	}
	return strings.NewReplacer(oldnew...).Replace(s), nil
}
