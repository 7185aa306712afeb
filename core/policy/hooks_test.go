package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	wasmconf "github.com/berthhq/berth/conformance/wasm"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestInputsFollowSchema encodes the inputs berthd sends for every hook, for
// a service with every field the API accepts set and for a bare one, proves
// through the recorded decisions' input digests that these are the exact
// bytes the module saw, and validates each against the published schema in
// exact mode (every field present, nothing else).
func TestInputsFollowSchema(t *testing.T) {
	ctx := context.Background()
	st, blobs, rt := newTestDeps(t)
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.Policy(wasmtest.PolicyOptions{Name: "allow-all"})))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range abiwasm.Hooks() {
		if _, err := e.Bind(ctx, Binding{Hook: h, ModuleDigest: m.Digest, Config: `{"k":"v"}`}); err != nil {
			t.Fatal(err)
		}
	}
	schema, err := wasmconf.NewInputSchema()
	if err != nil {
		t.Fatal(err)
	}

	full := &services.Service{Project: "default", Name: "db", Revision: 3, Bundle: "sha256:" + strings.Repeat("a", 64),
		BundleDigest: "sha256:" + strings.Repeat("a", 64), Command: []string{"./db"}, Env: map[string]string{"A": "1"},
		Port: 5432, Domains: []string{"db.example.com"}, Replicas: 1,
		HealthCheck: services.HealthCheck{Path: "/healthz", IntervalS: 5, TimeoutS: 2, Failures: 3},
		Labels:      map[string]string{"team": "data"}, CapacityUnits: 4, PlacementMode: services.PlacementStateful,
		LeaseMode: "expiring", LeaseDurationMS: 15000, Runtime: "containerd", Image: "registry.test/db@sha256:" + strings.Repeat("b", 64),
		User: "1000", MemoryMB: 512, CPUMillis: 250}
	bare := &services.Service{Project: "default", Name: "web"}
	n := &nodes.Node{ID: "nod_1", Hostname: "h1", Address: "10.0.0.1", CPUs: 2, MemoryMB: 2048}
	inputs := map[string]abiwasm.PolicyInput{}
	for _, s := range []*services.Service{full, bare} {
		inputs["service.apply "+s.Name] = abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_1"},
			Project: Usage(s.Project, nil, s.Name), Object: Raw(ServiceObject(s)), OldObject: Raw(ServiceObject(s))}
		inputs["service.apply new "+s.Name] = abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token"},
			Project: Usage(s.Project, nil, s.Name), Object: Raw(ServiceObject(s)), OldObject: Raw(nil)}
		inputs["service.delete "+s.Name] = abiwasm.PolicyInput{Hook: abiwasm.HookServiceDelete, Actor: abiwasm.Actor{Kind: "token"},
			Project: &abiwasm.Project{Name: s.Project}, Object: Raw(nil), OldObject: Raw(ServiceObject(s))}
		inputs["deploy "+s.Name] = abiwasm.PolicyInput{Hook: abiwasm.HookDeploy, Actor: abiwasm.Actor{Kind: "system"},
			Project: &abiwasm.Project{Name: s.Project}, Object: Raw(abiwasm.Placement{Service: ServiceObject(s), Slot: 0, Node: NodeObject(n)}), OldObject: Raw(nil)}
	}
	res := abiwasm.Resource{Type: "hello.greeting", Name: "w1", Project: "default", Spec: json.RawMessage(`{"message":"hi"}`), OnDrift: "report", Generation: 2}
	inputs["resource.apply"] = abiwasm.PolicyInput{Hook: abiwasm.HookResourceApply, Actor: abiwasm.Actor{Kind: "system"}, Object: Raw(res), OldObject: Raw(res)}
	inputs["node.enroll"] = abiwasm.PolicyInput{Hook: abiwasm.HookNodeEnroll, Actor: abiwasm.Actor{Kind: "join_token"}, Object: Raw(NodeObject(n)), OldObject: Raw(nil)}

	for name, in := range inputs {
		if _, err := e.Admit(ctx, "default", in); err != nil {
			t.Fatalf("%s: admit: %v", name, err)
		}
		ds, err := e.Decisions(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("%s: decisions %v, %v", name, ds, err)
		}
		sent := in
		sent.SchemaVersion, sent.Config = abiwasm.InputSchemaVersion, json.RawMessage(`{"k":"v"}`)
		raw, err := json.Marshal(sent)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != ds[0].InputSHA256 {
			t.Fatalf("%s: the bytes encoded here are not what the module saw", name)
		}
		if err := schema.Validate(raw, false); err != nil {
			t.Errorf("%s: %v\n%s", name, err, raw)
		}
	}
	if o := ServiceObject(full); o.HealthCheck.Path != "/healthz" || o.Lease == nil || o.Lease.Mode != "expiring" || o.Runtime != "containerd" || o.Image == "" {
		t.Errorf("the service object leaves out fields: %+v", o)
	}

	// A field the server never sends is named with its path, in both modes.
	bad := []byte(`{"hook":"service.apply","object":{"name":"web","health":{"path":"/"}}}`)
	for _, partial := range []bool{true, false} {
		err := schema.Validate(bad, partial)
		var ie *wasmconf.InputError
		if !errors.As(err, &ie) || !errors.Is(err, wasmconf.ErrInputSchema) || !strings.Contains(err.Error(), `at /object: unknown field "health"`) {
			t.Errorf("partial=%v: %v; want the unknown field named at /object", partial, err)
		}
	}
	if err := schema.Validate([]byte(`{"hook":"service.apply","object":{"name":"web","health_check":{"path":"/"}}}`), true); err != nil {
		t.Errorf("a partial input with known fields: %v", err)
	}
}

// TestServiceObjectWritesHealthCheckDefaults: a policy sees the health check
// the service runs with (docs/wasm-abi.md section 5): zero timings are the
// node's defaults written out (docs/node-protocol.md section 6.3: every 10 s,
// 2 s timeout, 3 failures), what the service sets is kept, and path stays as
// declared ("" when the service declares none).
func TestServiceObjectWritesHealthCheckDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   services.HealthCheck
		want abiwasm.HealthCheck
	}{
		{services.HealthCheck{}, abiwasm.HealthCheck{IntervalS: 10, TimeoutS: 2, Failures: 3}},
		{services.HealthCheck{Path: "/healthz", IntervalS: 30}, abiwasm.HealthCheck{Path: "/healthz", IntervalS: 30, TimeoutS: 2, Failures: 3}},
		{services.HealthCheck{Path: "/up", IntervalS: 5, TimeoutS: 1, Failures: 7}, abiwasm.HealthCheck{Path: "/up", IntervalS: 5, TimeoutS: 1, Failures: 7}},
	} {
		s := &services.Service{Project: "default", Name: "web", Port: 8080, HealthCheck: c.in}
		if got := ServiceObject(s).HealthCheck; got != c.want {
			t.Errorf("health check %+v: the policy sees %+v, want %+v", c.in, got, c.want)
		}
	}
}
