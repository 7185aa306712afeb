package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// Evaluate asks a policy module for a decision. It returns the module's
// decision, or an error: the Call errors, ErrGuest (wrapping the module's
// *abiwasm.GuestError) when the module used the error convention, and
// ErrBadOutput when the answer is not a PolicyOutput. A deny without
// reasons gets the reason "denied by policy <name>".
func (m *Module) Evaluate(ctx context.Context, in abiwasm.PolicyInput) (abiwasm.PolicyOutput, error) {
	raw, err := json.Marshal(in)
	if err != nil {
		return abiwasm.PolicyOutput{}, fmt.Errorf("encode policy input: %w", err)
	}
	return m.EvaluateJSON(ctx, raw)
}

// EvaluateJSON is Evaluate with the input already encoded.
func (m *Module) EvaluateJSON(ctx context.Context, input []byte) (abiwasm.PolicyOutput, error) {
	if m.meta.Kind != abiwasm.KindPolicy {
		return abiwasm.PolicyOutput{}, m.errf(ErrBadModule, "is a %s module, not a policy", m.meta.Kind)
	}
	raw, err := m.Call(ctx, input)
	if err != nil {
		return abiwasm.PolicyOutput{}, err
	}
	if m.opa != nil {
		out, err := m.opaDecision(raw)
		if err == nil && out.Decision == abiwasm.Deny && len(out.Reasons) == 0 {
			out.Reasons = []string{"denied by policy " + m.meta.Name}
		}
		return out, err
	}
	p := m.rt.parsers.Get()
	out, ok := fastPolicyOutput(p, raw)
	m.rt.parsers.Put(p)
	if !ok {
		out = abiwasm.PolicyOutput{}
		if err := json.Unmarshal(raw, &out); err != nil {
			return out, m.errf(ErrBadOutput, "policy output is not JSON: %s", err)
		}
	}
	if out.Error != nil {
		return out, fmt.Errorf("module %s (%s): %w: %w", m.meta.Name, m.digest, ErrGuest, out.Error)
	}
	switch out.Decision {
	case abiwasm.Allow:
	case abiwasm.Deny:
		if len(out.Reasons) == 0 {
			out.Reasons = []string{"denied by policy " + m.meta.Name}
		}
	default:
		return out, m.errf(ErrBadOutput, "decision %q is neither allow nor deny", out.Decision)
	}
	return out, nil
}

// CompileRoutes asks a route-compiler module for the route table. The
// module's SHA-256 must equal [routes.Table.Digest] of the table it returned,
// and the table must pass [routes.Table.Validate] (unique, normalized
// hostnames, known TLS modes, allow_sources as CIDR prefixes, upstreams as
// host:port, match conditions by the rules of docs/routes.md section 3;
// docs/wasm-abi.md section 6.2); otherwise the error wraps ErrBadOutput,
// and for refused match conditions also the *routes.InvalidError with its
// code. The table comes back normalized, without a revision.
func (m *Module) CompileRoutes(ctx context.Context, in abiwasm.RoutesInput) (routes.Table, error) {
	if m.meta.Kind != abiwasm.KindRoutes {
		return routes.Table{}, m.errf(ErrBadModule, "is a %s module, not a route compiler", m.meta.Kind)
	}
	// The reflection-free codec gives encoding/json's bytes and values
	// (docs/wasm-abi.md section 6.5).
	input := abiwasm.AppendRoutesInput(make([]byte, 0, 64+128*len(in.Services)+192*len(in.Workloads)), in)
	raw, err := m.Call(ctx, input)
	if err != nil {
		return routes.Table{}, err
	}
	out, err := abiwasm.DecodeRoutesOutput(raw)
	if err != nil {
		return routes.Table{}, m.errf(ErrBadOutput, "routes output is not JSON: %s", err)
	}
	if out.Error != nil {
		return routes.Table{}, fmt.Errorf("module %s (%s): %w: %w", m.meta.Name, m.digest, ErrGuest, out.Error)
	}
	t := routes.Table{Routes: out.Routes}
	if err := t.Validate(); err != nil {
		return routes.Table{}, fmt.Errorf("module %s (%s): %w: %w", m.meta.Name, m.digest, ErrBadOutput, err)
	}
	// t.Digest() of the normalized table, by the reflection-free encoder.
	t.Normalize()
	sum := sha256.Sum256([]byte("null"))
	if len(t.Routes) > 0 {
		sum = sha256.Sum256(abiwasm.AppendRoutes(make([]byte, 0, len(raw)), t.Routes))
	}
	if d := hex.EncodeToString(sum[:]); d != out.SHA256 {
		return routes.Table{}, m.errf(ErrBadOutput, "route table hashes to %s, the module said %s", d, out.SHA256)
	}
	if t.Routes == nil {
		t.Routes = []routes.Route{}
	}
	return t, nil
}
