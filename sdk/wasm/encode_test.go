package wasm

import (
	"bytes"
	"encoding/json"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// TestEncodePolicyOutputIsJSONMarshal: the hand encoder gives json.Marshal's
// bytes for the answers policies give, and for the strings that need
// escaping.
func TestEncodePolicyOutputIsJSONMarshal(t *testing.T) {
	for _, out := range []abiwasm.PolicyOutput{
		{},
		Allow(),
		Allow("a warning", ""),
		Deny(),
		Deny("bundle cart is not named by digest; use sha256:<hex>", "x & y"),
		Fail("bad_input", "decode: %q", "\x00\x1f\b\f\n\r\t\\\"é\u2028\u2029\xff\xfe<>&\x7f"),
		{Decision: "maybe", Reasons: []string{}, Warnings: []string{"w"}, Error: &abiwasm.GuestError{}},
	} {
		want, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := encodePolicyOutput(out); !bytes.Equal(got, want) {
			t.Errorf("encode %+v\n got %s\nwant %s", out, got, want)
		}
	}
}

// FuzzEncodePolicyOutput: on any strings, the hand encoder and json.Marshal
// give the same bytes.
func FuzzEncodePolicyOutput(f *testing.F) {
	f.Add("deny", "bundle <x> & \"y\"", "", true, "code\n", "msg\xff\u2028")
	f.Add("", "", "w", false, "", "")
	f.Fuzz(func(t *testing.T, decision, reason, warning string, withErr bool, code, msg string) {
		out := abiwasm.PolicyOutput{Decision: abiwasm.Decision(decision)}
		if reason != "" {
			out.Reasons = []string{reason, decision + reason}
		}
		if warning != "" {
			out.Warnings = []string{warning}
		}
		if withErr {
			out.Error = &abiwasm.GuestError{Code: code, Message: msg}
		}
		want, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := encodePolicyOutput(out); !bytes.Equal(got, want) {
			t.Fatalf("encode %+q\n got %s\nwant %s", out, got, want)
		}
	})
}
