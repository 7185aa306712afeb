package server

import (
	"context"

	abierrors "github.com/berthhq/berth/abi/errors"
	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/policy"
	"github.com/berthhq/berth/core/resources"
)

// resourceAdmission asks the policies bound to resource.apply about a declared resource
// (docs/resources.md section 1, docs/wasm-abi.md section 5.1); a denial is policy_denied.
func resourceAdmission(engine *policy.Engine) resources.AdmitFunc {
	return func(ctx context.Context, next, old *resources.Resource) error {
		in := abiwasm.PolicyInput{Hook: abiwasm.HookResourceApply, Actor: abiwasm.Actor{Kind: "system"},
			Object: policy.Raw(resourceObject(next)), OldObject: policy.Raw(nil)}
		if old != nil {
			in.OldObject = policy.Raw(resourceObject(old))
		}
		v, err := engine.Admit(ctx, next.Project, in)
		if err != nil {
			return err
		}
		if v.Allowed {
			return nil
		}
		de := &policy.DeniedError{Hook: in.Hook, Reasons: v.UniqueReasons(), Denials: v.Denials}
		return &abierrors.Error{Code: abierrors.PolicyDenied, Message: de.Error(), Err: de}
	}
}

// resourceObject is r as policies see it.
func resourceObject(r *resources.Resource) abiwasm.Resource {
	return abiwasm.Resource{Type: r.Type, Name: r.Name, Project: r.Project, Spec: r.SpecJSON(), OnDrift: r.OnDrift, Generation: r.Generation}
}
