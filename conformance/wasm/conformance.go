// Package wasm checks a WebAssembly module against abi/wasm: the conformance
// suite behind "berth conformance wasm", and the declarative test cases behind
// "berth policy test" (docs/wasm-abi.md sections 7 and 8).
package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
)

// Options tune a conformance run. The zero value works.
type Options struct {
	// CacheDir is the wazero compilation cache; empty compiles in memory.
	CacheDir string
	// Fuel bounds the work of one call in host/wasm's units (loop
	// iterations and counted calls); zero means host/wasm's DefaultFuel. A
	// module that loops forever fails the sample check when its fuel runs
	// out, however busy the machine is.
	Fuel uint64
	// Timeout, when positive, also bounds one call's wall-clock time; zero or
	// negative means no wall-clock limit (fuel and the caller's ctx bound the
	// call). A wall-clock limit can fail a correct module on a loaded
	// machine, so the checks do not set one unless asked to.
	Timeout time.Duration
	// MemoryLimitPages is the memory limit; zero means host/wasm's default.
	MemoryLimitPages uint32
	// Sample is the input used for the determinism and limit checks; nil
	// uses a typical input of the module's kind.
	Sample []byte
}

// Result is the outcome of one named check. Err is nil when it passed.
type Result struct {
	Name string
	Err  error
}

// Check runs every check against module and returns their results in order:
// load (imports, exports and their types, ABI version, metadata), sample
// (the sample input is answered within its fuel), determinism (the same
// input twice, on one instance and on a fresh one, gives the same bytes),
// malformed-input (non-JSON and wrongly shaped input get the error
// convention, not a trap), memory-limit (an allocation past the memory limit
// fails cleanly and the module still answers), and recovery (after a call
// stopped at its deadline the module still answers). It returns an error only
// when it could not run at all.
func Check(ctx context.Context, module []byte, opts Options) ([]Result, error) {
	if opts.MemoryLimitPages == 0 {
		opts.MemoryLimitPages = hostwasm.DefaultMemoryLimitPages
	}
	newRT := func(maxIn int) (*hostwasm.Runtime, error) {
		return hostwasm.New(ctx, hostwasm.Config{CacheDir: opts.CacheDir, Fuel: opts.Fuel, Timeout: opts.Timeout, MemoryLimitPages: opts.MemoryLimitPages, MaxInstances: 1, MaxInputBytes: maxIn})
	}
	rt, err := newRT(0)
	if err != nil {
		return nil, err
	}
	defer rt.Close(ctx)

	var results []Result
	add := func(name string, err error) { results = append(results, Result{Name: name, Err: err}) }
	m, err := rt.Load(ctx, module)
	add("load", err)
	if err != nil {
		return results, nil
	}
	sample := opts.Sample
	if sample == nil {
		sample = SampleInput(m.Metadata().Kind)
	}

	// OPA-compiled modules (docs/wasm-abi.md section 11) answer an OPA
	// result set; their decision is read by the host.
	isOPA := strings.HasPrefix(m.ABI(), "opa")
	first, err := m.Call(ctx, sample)
	switch {
	case err != nil:
	case isOPA:
		_, err = m.EvaluateJSON(ctx, sample)
	case m.Metadata().Kind == abiwasm.KindRoutes:
		err = compileSample(ctx, m, sample)
	default:
		err = validOutput(m.Metadata().Kind, first)
	}
	add("sample", err)

	add("determinism", func() error {
		second, err := m.Call(ctx, sample) // same instance (MaxInstances is 1)
		if err != nil {
			return err
		}
		rt2, err := newRT(0)
		if err != nil {
			return err
		}
		defer rt2.Close(ctx)
		m2, err := rt2.Load(ctx, module)
		if err != nil {
			return err
		}
		third, err := m2.Call(ctx, sample) // a fresh instance
		if err != nil {
			return err
		}
		if !bytes.Equal(first, second) || !bytes.Equal(first, third) {
			return fmt.Errorf("the same input gave different output:\n  %s\n  %s\n  %s", first, second, third)
		}
		return nil
	}())

	add("malformed-input", func() error {
		if isOPA {
			// Any JSON value is a Rego input; what is not JSON must fail
			// the call, not the module.
			for _, in := range [][]byte{[]byte(`{"hook":`), []byte("\xff\xfe"), {}} {
				if _, err := m.EvaluateJSON(ctx, in); err == nil {
					return fmt.Errorf("input %q is not JSON and was decided", in)
				}
				if _, err := m.EvaluateJSON(ctx, sample); err != nil {
					return fmt.Errorf("after input %q: %w", in, err)
				}
			}
			return nil
		}
		for _, in := range [][]byte{[]byte(`{"hook":`), []byte(`[1,2]`), []byte("\xff\xfe"), {}} {
			out, err := m.Call(ctx, in)
			if err != nil {
				return fmt.Errorf("input %q: %w", in, err)
			}
			var e struct {
				Error *abiwasm.GuestError `json:"error"`
			}
			if json.Unmarshal(out, &e) != nil || e.Error == nil || e.Error.Code == "" {
				return fmt.Errorf("input %q: answer %s is not the error convention {\"error\":{\"code\",\"message\"}}", in, out)
			}
		}
		return nil
	}())

	add("memory-limit", func() error {
		big := int(opts.MemoryLimitPages)*65536 + 65536
		rt3, err := newRT(big + 1)
		if err != nil {
			return err
		}
		defer rt3.Close(ctx)
		m3, err := rt3.Load(ctx, module)
		if err != nil {
			return err
		}
		_, err = m3.Call(ctx, make([]byte, big))
		switch {
		case err == nil:
			return fmt.Errorf("an input of %d bytes, past the memory limit, was accepted", big)
		case !errors.Is(err, hostwasm.ErrMemory) && !errors.Is(err, hostwasm.ErrTrap) && !errors.Is(err, hostwasm.ErrGuest):
			return fmt.Errorf("allocation past the limit did not fail cleanly: %w", err)
		}
		if _, err := m3.Call(ctx, sample); err != nil {
			return fmt.Errorf("after a failed allocation: %w", err)
		}
		return nil
	}())

	add("recovery", func() error {
		cctx, cancel := context.WithCancel(ctx)
		cancel() // a call whose caller already gave up must fail, not hang
		if _, err := m.Call(cctx, sample); err == nil {
			return fmt.Errorf("a call with an ended context succeeded")
		}
		if _, err := m.Call(ctx, sample); err != nil {
			return fmt.Errorf("after a stopped call: %w", err)
		}
		return nil
	}())
	return results, nil
}

func validOutput(k abiwasm.Kind, out []byte) error {
	switch k {
	case abiwasm.KindPolicy:
		var o abiwasm.PolicyOutput
		if err := json.Unmarshal(out, &o); err != nil {
			return fmt.Errorf("output is not JSON: %w", err)
		}
		if o.Decision != abiwasm.Allow && o.Decision != abiwasm.Deny {
			return fmt.Errorf("output %s has no decision", out)
		}
	}
	return nil
}

// compileSample asks a route compiler for the table of sample the way
// berthd does ([hostwasm.Module.CompileRoutes]): the table must pass
// abi/routes' Table.Validate and hash to the SHA-256 the module reports,
// or berthd keeps its last good table on every pass.
func compileSample(ctx context.Context, m *hostwasm.Module, sample []byte) error {
	var in abiwasm.RoutesInput
	dec := json.NewDecoder(bytes.NewReader(sample))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("the sample is not a route compiler's input: %w", err)
	}
	if _, err := m.CompileRoutes(ctx, in); err != nil {
		return fmt.Errorf("berthd would refuse the table: %w", err)
	}
	return nil
}

// SampleInput returns a typical input for a module of kind k.
func SampleInput(k abiwasm.Kind) []byte {
	if k == abiwasm.KindRoutes {
		return []byte(`{"services":[{"id":"svc_1","project":"default","name":"hello","domains":["hello.localhost"]}],` +
			`"workloads":[{"id":"wl_1","service_id":"svc_1","node_id":"nod_1","node_address":"127.0.0.1","port":8081,"address":"127.0.0.1:8081","observed_status":"running","health":"passing"}]}`)
	}
	return []byte(`{"hook":"service.apply","actor":{"kind":"token","id":"tok_1"},` +
		`"project":{"name":"default","services":1,"replicas":2,"capacity_units":2},` +
		`"object":{"project":"default","name":"hello","revision":0,"bundle":"hello","bundle_digest":"sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",` +
		`"command":["./hello"],"env":{},"port":8080,"domains":["hello.localhost"],"replicas":2,"capacity_units":1,"labels":{"team":"web"}},` +
		`"old_object":null,"config":null}`)
}
