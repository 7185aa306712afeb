package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// regoSuite is a policy in deny[msg] style that leans on the builtins the
// host implements for OPA modules.
const regoSuite = `package berth

import rego.v1

svc := input.object

deny contains msg if {
	svc.image != ""
	not contains(svc.image, "@sha256:")
	msg := sprintf("image %s is not pinned by digest", [svc.image])
}

deny contains msg if {
	some d in svc.domains
	not glob.match("*.example.com", ["."], d)
	msg := sprintf("domain %s is outside *.example.com", [d])
}

deny contains msg if {
	not regex.match("^[a-z][a-z0-9-]*$", svc.name)
	msg := sprintf("name %q is not a DNS label", [svc.name])
}

deny contains msg if {
	units.parse_bytes(object.get(svc.labels, "memory", "0")) > units.parse_bytes("512MiB")
	msg := "memory over 512MiB"
}

deny contains msg if {
	v := object.get(svc.labels, "version", "1.0.0")
	semver.is_valid(v)
	semver.compare(v, "2.0.0") < 0
	msg := sprintf("version %s is older than 2.0.0", [v])
}

deny contains msg if {
	src := object.get(svc.labels, "source", "10.0.0.1")
	not net.cidr_contains("10.0.0.0/8", src)
	msg := sprintf("source %s is outside 10.0.0.0/8", [src])
}

deny contains msg if {
	t := object.get(svc.labels, "expires", "2100-01-01T00:00:00Z")
	time.parse_rfc3339_ns(t) < time.parse_rfc3339_ns("2030-01-01T00:00:00Z")
	msg := sprintf("expires %s before 2030", [t])
}

deny contains msg if {
	upper(svc.labels.team) == "FORBIDDEN"
	msg := "team forbidden"
}

warn contains msg if {
	svc.replicas > 10
	msg := sprintf("%d replicas", [svc.replicas])
}
`

func policyInput(t *testing.T, svc map[string]any) []byte {
	t.Helper()
	obj, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_1"}, Object: obj})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

var regoCases = []map[string]any{
	{"name": "cart", "image": "registry/cart@sha256:ab", "domains": []string{"cart.example.com"}, "labels": map[string]string{"team": "shop", "version": "2.1.0"}},
	{"name": "cart", "image": "registry/cart:latest", "domains": []string{"cart.example.org"}, "labels": map[string]string{"team": "shop"}},
	{"name": "Cart_1", "domains": []string{"a.b.example.com"}, "labels": map[string]string{"team": "forbidden", "memory": "1GiB", "version": "1.9.9-rc.1"}},
	{"name": "api", "labels": map[string]string{"team": "x", "source": "192.168.1.1", "expires": "2029-12-31T23:59:59Z", "version": "2.0.0"}, "replicas": 12},
	{"name": "api", "labels": map[string]string{"team": "x", "source": "10.9.9.9/16", "memory": "100MB", "version": "2.0.0-beta.2"}},
}

// TestOPAModuleAgreesWithOPAEval: the same Rego, compiled with opa build
// -t wasm and run by Berth, gives the decisions and messages opa eval gives
// on the same inputs.
func TestOPAModuleAgreesWithOPAEval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, mod := wasmtest.BuildRego(t, regoSuite, "berth/deny", "berth/warn")
	r := newRuntime(t, wasm.Config{})
	m, err := r.Load(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	if m.Metadata().Kind != abiwasm.KindPolicy || m.Metadata().Name != "opa:berth/deny" || m.ABI() != "opa 1.x" {
		t.Fatalf("metadata %+v, ABI %q", m.Metadata(), m.ABI())
	}
	denied := 0
	for i, svc := range regoCases {
		in := policyInput(t, svc)
		var evalIn any
		if err := json.Unmarshal(in, &evalIn); err != nil {
			t.Fatal(err)
		}
		var res struct {
			Result []struct {
				Expressions []struct {
					Value []string `json:"value"`
				} `json:"expressions"`
			} `json:"result"`
		}
		if err := json.Unmarshal(wasmtest.OPAEval(t, regoSuite, "data.berth.deny", in), &res); err != nil {
			t.Fatal(err)
		}
		want := res.Result[0].Expressions[0].Value
		sort.Strings(want)
		got, err := m.EvaluateJSON(ctx, in)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		wantDecision := abiwasm.Allow
		if len(want) > 0 {
			wantDecision = abiwasm.Deny
			denied++
		}
		reasons := append([]string{}, got.Reasons...)
		sort.Strings(reasons)
		if got.Decision != wantDecision || (len(want) > 0 && !reflect.DeepEqual(reasons, want)) {
			t.Errorf("case %d: Berth %s %q, opa eval %q", i, got.Decision, got.Reasons, want)
		}
		again, err := m.EvaluateJSON(ctx, in)
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("case %d: a second evaluation gave %+v (%v), the first %+v", i, again, err, got)
		}
	}
	if denied < 4 {
		t.Fatalf("only %d of %d cases were denied: the suite does not exercise the builtins", denied, len(regoCases))
	}
}

// TestOPAAllowStyle: an allow boolean entrypoint allows when true and denies
// when false or undefined.
func TestOPAAllowStyle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := "package berth\n\nimport rego.v1\n\ndefault allow := false\n\nallow if input.object.replicas <= 3\n"
	_, mod := wasmtest.BuildRego(t, src, "berth/allow")
	m, err := newRuntime(t, wasm.Config{}).Load(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]abiwasm.Decision{1: abiwasm.Allow, 3: abiwasm.Allow, 4: abiwasm.Deny} {
		out, err := m.EvaluateJSON(ctx, policyInput(t, map[string]any{"replicas": n}))
		if err != nil {
			t.Fatal(err)
		}
		if out.Decision != want || (want == abiwasm.Deny && len(out.Reasons) == 0) {
			t.Errorf("replicas %d: %+v, want %s", n, out, want)
		}
	}
}

// TestOPARefusesMissingBuiltin: a module that needs a builtin the host lacks
// is refused at load, naming it.
func TestOPARefusesMissingBuiltin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := "package berth\n\nimport rego.v1\n\ndeny contains x if x := uuid.rfc4122(input.hook)\n"
	_, mod := wasmtest.BuildRego(t, src, "berth/deny")
	_, err := newRuntime(t, wasm.Config{}).Load(ctx, mod)
	if !errors.Is(err, wasm.ErrBadModule) || !strings.Contains(err.Error(), "uuid.rfc4122") {
		t.Fatalf("Load = %v, want ErrBadModule naming uuid.rfc4122", err)
	}
}

// TestOPALimits: malformed OPA modules are refused, and an input over the
// memory limit fails the call without breaking the module.
func TestOPALimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, mod := wasmtest.BuildRego(t, regoSuite, "berth/deny")
	r := newRuntime(t, wasm.Config{MemoryLimitPages: 64, MaxInputBytes: 16 << 20})
	if _, err := r.Load(ctx, mod[:len(mod)/2]); !errors.Is(err, wasm.ErrBadModule) {
		t.Fatalf("truncated module: %v, want ErrBadModule", err)
	}
	m, err := r.Load(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	big := policyInput(t, map[string]any{"name": strings.Repeat("a", 8<<20)})
	if _, err := m.EvaluateJSON(ctx, big); !errors.Is(err, wasm.ErrMemory) && !errors.Is(err, wasm.ErrTrap) {
		t.Fatalf("8 MiB input into 4 MiB of memory: %v, want ErrMemory or ErrTrap", err)
	}
	out, err := m.EvaluateJSON(ctx, policyInput(t, regoCases[0]))
	if err != nil || out.Decision != abiwasm.Allow {
		t.Fatalf("after the failed call: %+v, %v", out, err)
	}
}

// TestOPARefusesInputThatIsNotJSON: OPA's parser would read each of these
// as some input (or none, which this deny policy allows); the host answers
// bad_input instead, and the instance still decides the next input.
func TestOPARefusesInputThatIsNotJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := "package berth\n\nimport rego.v1\n\ndeny contains \"no bundle\" if not input.object.bundle\n"
	_, mod := wasmtest.BuildRego(t, src, "berth/deny")
	m, err := newRuntime(t, wasm.Config{}).Load(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{
		`{"object":{"bundle":"b"}} trailing`, `{"object":{"bundle":"b"}}}`, `{"object":{"bundle":"b",}}`,
		`{"object":{1:"b","bundle":"b"}}`, `{"object":{"bundle":"b"} "x":1}`, `{"object":{"bundle":"b","a":[1 2]}}`,
		`{"object":{"bundle":"b","n":01}}`, "{\"object\":{\"bundle\":\"b\x01\"}}", `{"object":{"bundle":"b"}`, ``,
	} {
		out, err := m.EvaluateJSON(ctx, []byte(in))
		var ge *abiwasm.GuestError
		if !errors.Is(err, wasm.ErrGuest) || !errors.As(err, &ge) || ge.Code != abiwasm.ErrCodeBadInput {
			t.Errorf("input %q: %+v, %v; want the guest error bad_input", in, out, err)
		}
		if out, err := m.EvaluateJSON(ctx, []byte(`{"object":{"bundle":"b"}}`)); err != nil || out.Decision != abiwasm.Allow {
			t.Fatalf("after input %q: %+v, %v", in, out, err)
		}
	}
}
