package wasm

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fastjson"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

var answers = []string{
	`{"decision":"allow"}`,
	`{"decision":"deny","reasons":["bundle hello is not named by digest"]}`,
	`{"decision":"deny","reasons":[],"warnings":["w"]}`,
	`{"decision":"allow","decision":"deny"}`,
	`{"Decision":"deny"}`,
	`{"decision":"deny","reasons":null}`,
	`{"decision":"deny","reasons":["a\"b"]}`,
	`{"decision":"deny","reasons":["a` + "\t" + `b"]}`,
	`{"decision":"deny","reasons":["\xff"]}`,
	`{"error":{"code":"bad_input","message":"no"}}`,
	`{"decision":7}`,
	`{"decision":"allow"} x`,
	`[]`, `[{}]`, `[{"result":true}]`, `[{"result":false}]`, `[{"result":null}]`,
	`[{"result":["a","b"]}]`, `[{"result":[]}]`, `[{"result":[1,"a"]}]`, `[{"Result":true}]`,
	`[{"result":true,"result":false}]`, `[{"result":{"allow":false}}]`, `[1]`, `{}`, ``,
	`{"decision":"deny","reasons":["a","b"],"warnings":["w"]}`, `{"decision":"deny","warnings":["w"],"reasons":["a"]}`,
	`{"decision":"deny","reasons":["a"]}x`, `{"decision":"deny","reasons":["a",]}`, `{"decision":"deny","reasons":[1]}`,
	`{"decision":"deny","reasons":["a"],"reasons":["b"]}`, `{"decision":"deny","reasons":["a""b"]}`, `{"decision":"deny","reasons":[""]}`,
	`{"decision":"allow","warnings":[]}`, `{"decision":"allow"`, `{"decision":"allow}`, `{"decision":"allow"} `,
	`[{"result":["a","b"]}]x`, `[{"result":["a"]},{"result":true}]`, `[{"result":["a"]`, `[{"result":[]}]`, `[{"result":true}] `,
}

// TestFastDecodersAgreeWithEncodingJSON: whatever the fast decoders take,
// encoding/json reads the same; the rest they leave to it.
func TestFastDecodersAgreeWithEncodingJSON(t *testing.T) {
	taken := 0
	for _, a := range answers {
		taken += checkFastDecoders(t, []byte(a))
	}
	if taken < 10 {
		t.Fatalf("the fast decoders took %d of %d answers; the common shapes should be theirs", taken, len(answers))
	}
}

func FuzzFastDecodersAgreeWithEncodingJSON(f *testing.F) {
	for _, a := range answers {
		f.Add([]byte(a))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkFastDecoders(t, raw) })
}

// checkFastDecoders returns how many of the two fast decoders took raw.
func checkFastDecoders(t *testing.T, raw []byte) int {
	t.Helper()
	var p fastjson.Parser
	taken := 0
	if fast, ok := fastPolicyOutput(&p, raw); ok {
		taken++
		var slow abiwasm.PolicyOutput
		if err := json.Unmarshal(raw, &slow); err != nil {
			t.Fatalf("%q: fast took it, encoding/json refused: %v", raw, err)
		}
		if d := cmp.Diff(slow, fast); d != "" {
			t.Fatalf("%q: fast and encoding/json differ (-slow +fast):\n%s", raw, d)
		}
	}
	if r, ok := fastOPAResult(&p, raw); ok {
		taken++
		var set []struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(raw, &set); err != nil {
			t.Fatalf("%q: fast took it, encoding/json refused: %v", raw, err)
		}
		if undefined := len(set) == 0 || len(set[0].Result) == 0; undefined != r.undefined {
			t.Fatalf("%q: undefined %v, encoding/json says %v", raw, r.undefined, undefined)
		}
		if r.undefined {
			return taken
		}
		var b bool
		if isBool := json.Unmarshal(set[0].Result, &b) == nil; isBool != r.isBool || b != r.b {
			t.Fatalf("%q: boolean %v/%v, encoding/json says %v/%v", raw, r.isBool, r.b, isBool, b)
		}
		if !r.isBool {
			var msgs []string
			if err := json.Unmarshal(set[0].Result, &msgs); err != nil {
				t.Fatalf("%q: fast read messages, encoding/json refused: %v", raw, err)
			}
			if d := cmp.Diff(msgs, r.messages, cmpEmpty); d != "" {
				t.Fatalf("%q: messages differ (-slow +fast):\n%s", raw, d)
			}
		}
	}
	return taken
}

var cmpEmpty = cmp.Transformer("empty", func(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
})

var jsonTexts = []string{
	``, ` `, `{}`, `[]`, `""`, `0`, `-0`, `1.5e+3`, `-1E-2`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `- 1`,
	`true`, `false`, `null`, `tru`, `nul`, `True`, `truex`, `[true false]`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`,
	`{"a"}`, `{"a":}`, `{1:2}`, `{"a" : [ 1 , { "b" : null } ] }`, " \t\r\n{}\n ", `{} {}`, `{}x`, `[}`, `{]`,
	`"\u00e9\uD83D\uDE00\n\t\"\\\/\b\f\r"`, `"\u00G0"`, `"\u12"`, `"\x"`, `"\`, `"abc`, "\"a\x01b\"", "\"a\x7fb\"",
	"\"\xff\xfe\"", `"12345678\"9"`, `"1234567\\"`, `["a","b",["c",{"d":"e"}]]`, `[[[[[[[[[[]]]]]]]]]]`, `[[[[[[[[[[]]]]]]]]]`,
	`{"a":"` + strings.Repeat("x", 100) + `"}`, `{"object":{"bundle":"hello","env":{"A":"1"},"n":[1,-2.5,3e9]}}`,
}

// TestValidJSONAgreesWithEncodingJSON: validJSON, which guards what an
// OPA module reads as its input, takes exactly what json.Valid takes:
// the table above, every special byte at each offset of a word, nesting
// at encoding/json's limit and one past it, and 20,000 seeded mutations.
func TestValidJSONAgreesWithEncodingJSON(t *testing.T) {
	var texts [][]byte
	for _, s := range jsonTexts {
		texts = append(texts, []byte(s))
	}
	for _, piece := range []string{`"`, `\"`, `\\`, `\u0041`, `\u004`, `\q`, "\x00", "\x1f", " ", "\x80", "\xff", `\`} {
		for pre := range 18 {
			texts = append(texts, []byte(`{"k`+strings.Repeat("a", pre)+piece+strings.Repeat("b", pre%9)+`":0}`))
		}
	}
	for _, depth := range []int{maxJSONDepth - 1, maxJSONDepth, maxJSONDepth + 1} {
		texts = append(texts, []byte(strings.Repeat("[", depth)+strings.Repeat("]", depth)))
		texts = append(texts, []byte(strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth)))
	}
	rng := rand.New(rand.NewPCG(11, 4))
	base := []byte(`{"hook":"service.apply","object":{"name":"x","env":{"A":"1"},"n":[1,-2.5,3e9,true,false,null],"s":"a\"\u00e9b"}}`)
	specials := []byte(`"\{}[],: 0-+.eEu` + "\x01\xff")
	for range 20000 {
		raw := bytes.Clone(base)
		for range 1 + rng.IntN(2) {
			i := rng.IntN(len(raw))
			switch rng.IntN(3) {
			case 0:
				raw[i] = specials[rng.IntN(len(specials))]
			case 1:
				raw = slices.Delete(raw, i, i+1)
			case 2:
				raw = slices.Insert(raw, i, specials[rng.IntN(len(specials))])
			}
		}
		texts = append(texts, raw)
	}
	valid := 0
	for _, raw := range texts {
		want := json.Valid(raw)
		if got := validJSON(raw); got != want {
			t.Errorf("validJSON(%.200q) = %v, json.Valid says %v", raw, got, want)
		}
		if want {
			valid++
		}
	}
	if valid < len(texts)/20 || valid > len(texts)*19/20 {
		t.Fatalf("%d of %d texts are JSON; the generator is off", valid, len(texts))
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, s := range jsonTexts {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if got, want := validJSON(raw), json.Valid(raw); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", raw, got, want)
		}
	})
}
