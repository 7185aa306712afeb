package policies

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// asGuest loads the AssemblyScript example (built by `make modules`).
func asGuest(t testing.TB) *hostwasm.Module {
	t.Helper()
	ctx := context.Background()
	wasm, err := os.ReadFile("require-digest-as/policy.wasm")
	if err != nil {
		t.Fatalf("the AssemblyScript example is built by `make modules` (needs Node.js and npm): %v", err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	m, err := rt.Load(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// requireDigestRef is the service.apply rule of require-digest-as over any
// bytes, decoded by encoding/json: what the guest must answer.
func requireDigestRef(raw []byte) (abiwasm.PolicyOutput, string) {
	if !json.Valid(raw) {
		return abiwasm.PolicyOutput{}, abiwasm.ErrCodeBadInput
	}
	if depth(raw) > 64 {
		return abiwasm.PolicyOutput{}, abiwasm.ErrCodeBadInput // the guest's limit of nesting
	}
	var in map[string]any
	if json.Unmarshal(raw, &in) != nil {
		return abiwasm.PolicyOutput{}, abiwasm.ErrCodeBadInput // valid JSON, not an object
	}
	if hook, _ := in["hook"].(string); hook != "service.apply" {
		return abiwasm.PolicyOutput{}, abiwasm.ErrCodeUnsupported
	}
	obj, ok := in["object"].(map[string]any)
	if !ok {
		return abiwasm.PolicyOutput{}, abiwasm.ErrCodeBadInput
	}
	bundle, _ := obj["bundle"].(string)
	image, _ := obj["image"].(string)
	out := abiwasm.PolicyOutput{Decision: abiwasm.Allow}
	if bundle != "" && !strings.HasPrefix(bundle, "sha256:") {
		out.Decision = abiwasm.Deny
		out.Reasons = append(out.Reasons, "bundle "+bundle+" is not named by digest; use sha256:<hex>")
	}
	if image != "" && !strings.Contains(image, "@sha256:") {
		out.Decision = abiwasm.Deny
		out.Reasons = append(out.Reasons, "image "+image+" is not pinned by digest; use name@sha256:<hex>")
	}
	return out, ""
}

// depth is the deepest nesting of objects and arrays in the JSON raw.
func depth(raw []byte) int {
	d := json.NewDecoder(bytes.NewReader(raw))
	n, deepest := 0, 0
	for {
		tok, err := d.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			n++
			deepest = max(deepest, n)
		case json.Delim('}'), json.Delim(']'):
			n--
		}
	}
}

// checkAgainstRef evaluates raw with the guest and compares with the
// reference; it describes any difference.
func checkAgainstRef(ctx context.Context, m *hostwasm.Module, raw []byte) error {
	want, wantCode := requireDigestRef(raw)
	got, err := m.EvaluateJSON(ctx, raw)
	var ge *abiwasm.GuestError
	switch {
	case wantCode != "" && errors.As(err, &ge) && ge.Code == wantCode:
		return nil
	case wantCode != "":
		return fmt.Errorf("input %q: got %+v, %v; want the error %s", raw, got, err, wantCode)
	case err != nil:
		return fmt.Errorf("input %q: got %v; want %+v", raw, err, want)
	case got.Decision != want.Decision || !slices.Equal(got.Reasons, want.Reasons):
		return fmt.Errorf("input %q: got %+v; want %+v", raw, got, want)
	}
	return nil
}

// TestAssemblyScriptGuestScansLikeEncodingJSON: the guest's in-place scan
// (eight bytes at a time through strings) agrees with encoding/json on
// which inputs are JSON and on the strings the rule reads. Each special
// byte (quote, backslash, control byte, bytes of 0x80 and above) stands
// at every offset of an eight-byte word of a string, then seeded random
// mutations of real inputs break the JSON in every other way.
func TestAssemblyScriptGuestScansLikeEncodingJSON(t *testing.T) {
	ctx := context.Background()
	m := asGuest(t)
	var inputs [][]byte
	pieces := []string{`\"`, `\\`, `\/`, `\n`, `\u0041`, `\ud83d\ude00`, `\u00e9`, "\x01", "\x1f", "\x7f", "é", "\xff", `"`, `\`, `\x`, `\u12`, "@sha256:", "sha256:"}
	for _, piece := range pieces {
		for pre := 0; pre <= 17; pre++ {
			for _, key := range []string{"bundle", "image"} {
				s := strings.Repeat("a", pre) + piece + strings.Repeat("b", pre%9)
				inputs = append(inputs, []byte(`{"hook":"service.apply","object":{"name":"x","`+key+`":"`+s+`","replicas":2}}`))
				inputs = append(inputs, []byte(`{"hook":"service.apply","object":{"`+s+`":1,"`+key+`":"`+s+`"}}`))
			}
		}
	}
	base := []string{
		`{"hook":"service.apply","object":{"project":"default","name":"hello","bundle":"hello","replicas":2,"env":{"A":"1"},"ports":[8080,-1.5e3,0]},"old_object":null,"actor":{"kind":"token"}}`,
		`{"hook":"service.apply","object":{"image":"nginx:1.27","labels":{"a":"b"},"ok":true,"no":false,"n":null}}`,
		` { "hook" : "service.apply" , "object" : { "bundle" : "sha256:abc" , "image" : "x@sha256:1" } } `,
		`{"hook":"service.apply","object":{"bundle":"a","bundle":"sha256:b"},"hook":"service.apply"}`,
		`{"hook":"service.apply","object":[1,2,3]}`,
		`{"hook":"service.apply","object":{"deep":[[[[{"x":[{}]}]]]],"image":"r/x:1"}}`,
	}
	for _, b := range base {
		inputs = append(inputs, []byte(b))
	}
	for _, n := range []int{62, 63, 64, 65} { // the guest nests 64 deep, the input object counting
		inputs = append(inputs, []byte(`{"hook":"service.apply","object":{"bundle":"b"},"x":`+strings.Repeat("[", n)+strings.Repeat("]", n)+`}`))
	}
	rng := rand.New(rand.NewPCG(21, 8))
	specials := []byte{'"', '\\', 0x01, 0x1f, 0x7f, 0x80, 0xff, '{', '}', '[', ']', ',', ':', 'u', ' ', '\n', '0', '-', 'e', '.'}
	for range 4000 {
		raw := []byte(base[rng.IntN(len(base))])
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(raw))
			switch rng.IntN(4) {
			case 0:
				raw[i] = specials[rng.IntN(len(specials))]
			case 1:
				raw = slices.Delete(raw, i, i+1)
			case 2:
				raw = slices.Insert(raw, i, specials[rng.IntN(len(specials))])
			case 3:
				raw = raw[:i]
			}
			if len(raw) == 0 {
				raw = []byte("{")
			}
		}
		inputs = append(inputs, raw)
	}
	valid := 0
	for _, raw := range inputs {
		if json.Valid(raw) {
			valid++
		}
		if err := checkAgainstRef(ctx, m, raw); err != nil {
			t.Error(err)
		}
	}
	// The mutations must exercise both branches, or the test proves little.
	if valid < len(inputs)/10 || valid > len(inputs)*9/10 {
		t.Fatalf("%d of %d inputs are JSON; the generator is off", valid, len(inputs))
	}
}

// FuzzAssemblyScriptGuest checks the same agreement on inputs from the
// fuzzer (go test -fuzz FuzzAssemblyScriptGuest ./examples/policies/).
func FuzzAssemblyScriptGuest(f *testing.F) {
	f.Add([]byte(`{"hook":"service.apply","object":{"bundle":"hello"}}`))
	f.Add([]byte(`{"hook":"service.apply","object":{"image":"a\"b\\c\u0041@sha256:x"}}`))
	f.Add([]byte(`{"hook":"service.apply","object":{"bundle":"12345678\"9"}}`))
	m := asGuest(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if err := checkAgainstRef(context.Background(), m, raw); err != nil {
			t.Error(err)
		}
	})
}
