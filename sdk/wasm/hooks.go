package wasm

import (
	"errors"
	"fmt"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// ErrWrongHook is returned by the typed hook helpers ([ServiceApplyInput],
// [ServiceDeleteInput], [NodeEnrollInput], [DeployInput]) for an input of
// another hook.
var ErrWrongHook = errors.New("berth: the input is of another hook")

// ErrNoObject is returned by the typed hook helpers when the object the
// hook always carries is null or absent.
var ErrNoObject = errors.New("berth: the input carries no object")

func wantHook(in abiwasm.PolicyInput, h abiwasm.Hook) error {
	if in.Hook != h {
		return fmt.Errorf("%w: %q, want %q", ErrWrongHook, in.Hook, h)
	}
	return nil
}

// ServiceApplyInput decodes a service.apply input (docs/wasm-abi.md section
// 5.1): the service as it would be stored, and the stored one, nil when the
// service is new. Errors: ErrWrongHook, ErrNoObject, or a decode error.
func ServiceApplyInput(in abiwasm.PolicyInput) (svc abiwasm.Service, old *abiwasm.Service, err error) {
	if err := wantHook(in, abiwasm.HookServiceApply); err != nil {
		return svc, nil, err
	}
	svc, ok, err := Object[abiwasm.Service](in.Object)
	if err != nil {
		return svc, nil, err
	}
	if !ok {
		return svc, nil, ErrNoObject
	}
	o, ok, err := Object[abiwasm.Service](in.OldObject)
	if err != nil {
		return svc, nil, fmt.Errorf("old object: %w", err)
	}
	if ok {
		old = &o
	}
	return svc, old, nil
}

// ServiceDeleteInput decodes a service.delete input: the stored service
// about to be deleted (the old object). Errors: ErrWrongHook, ErrNoObject,
// or a decode error.
func ServiceDeleteInput(in abiwasm.PolicyInput) (abiwasm.Service, error) {
	if err := wantHook(in, abiwasm.HookServiceDelete); err != nil {
		return abiwasm.Service{}, err
	}
	svc, ok, err := Object[abiwasm.Service](in.OldObject)
	if err == nil && !ok {
		err = ErrNoObject
	}
	return svc, err
}

// NodeEnrollInput decodes a node.enroll input: the enrolling node. Errors:
// ErrWrongHook, ErrNoObject, or a decode error.
func NodeEnrollInput(in abiwasm.PolicyInput) (abiwasm.Node, error) {
	if err := wantHook(in, abiwasm.HookNodeEnroll); err != nil {
		return abiwasm.Node{}, err
	}
	n, ok, err := Object[abiwasm.Node](in.Object)
	if err == nil && !ok {
		err = ErrNoObject
	}
	return n, err
}

// DeployInput decodes a deploy input: the service, the slot the reconciler
// is about to start and the chosen node. Errors: ErrWrongHook, ErrNoObject,
// or a decode error.
func DeployInput(in abiwasm.PolicyInput) (abiwasm.Placement, error) {
	if err := wantHook(in, abiwasm.HookDeploy); err != nil {
		return abiwasm.Placement{}, err
	}
	p, ok, err := Object[abiwasm.Placement](in.Object)
	if err == nil && !ok {
		err = ErrNoObject
	}
	return p, err
}
