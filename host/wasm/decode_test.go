package wasm

import (
	"encoding/json"
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
