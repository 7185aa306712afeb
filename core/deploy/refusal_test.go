package deploy

import (
	"errors"
	"fmt"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/policy"
)

// TestRefusalReason: a follow whose every failure is a policy refusal settles as refused, with
// the policies' reasons once each; a failure of another kind beside a refusal is not a refusal,
// so the follow is tried again.
func TestRefusalReason(t *testing.T) {
	t.Parallel()
	deny := func(reasons ...string) error {
		return fmt.Errorf("service shop/web: %w", &policy.DeniedError{Hook: abiwasm.HookServiceApply, Reasons: reasons})
	}
	for _, c := range []struct {
		name   string
		err    error
		want   string
		refuse bool
	}{
		{"none", nil, "", false},
		{"one refusal", deny("images only from our registry"), "policy: images only from our registry", true},
		{"two services refused alike", errors.Join(deny("pinned by digest"), deny("pinned by digest")), "policy: pinned by digest", true},
		{"two reasons", errors.Join(deny("a"), deny("b")), "policy: a; b", true},
		{"a refusal and a failure", errors.Join(deny("a"), errors.New("store unavailable")), "", false},
		{"a failure", errors.New("store unavailable"), "", false},
	} {
		got, ok := RefusalReason(c.err)
		if ok != c.refuse || got != c.want {
			t.Errorf("%s: RefusalReason = %q, %v; want %q, %v", c.name, got, ok, c.want, c.refuse)
		}
	}
}
