package wasm

import (
	"encoding/json"
	"reflect"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// objectAgrees decodes b into a T with Object (the fast path for Service,
// Placement and Node) and with encoding/json, and fails when encoding/json
// accepts b and Object does not, or when both accept it and disagree.
func objectAgrees[T any](t *testing.T, b []byte) {
	t.Helper()
	var want T
	wantErr := json.Unmarshal(b, &want)
	got, _, err := Object[T](b)
	switch {
	case wantErr == nil && err != nil && string(b) != "null":
		t.Fatalf("%T %q: encoding/json accepts it, the fast path says %v", want, b, err)
	case wantErr == nil && err == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("%T %q: fast %+v, encoding/json %+v", want, b, got, want)
	}
}

// TestObjectPlacementAndNodeCoverEveryField: with every field set, Object
// gives what encoding/json gives, for a Placement and a Node, from bytes
// and from the input's parsed tree. A field added to either type without
// the decoder fails here.
func TestObjectPlacementAndNodeCoverEveryField(t *testing.T) {
	seed := 0
	var pl abiwasm.Placement
	fill(t, reflect.ValueOf(&pl).Elem(), &seed)
	raw, err := json.Marshal(pl)
	if err != nil {
		t.Fatal(err)
	}
	node, err := json.Marshal(pl.Node)
	if err != nil {
		t.Fatal(err)
	}
	objectAgrees[abiwasm.Placement](t, raw)
	objectAgrees[abiwasm.Node](t, node)
	if got, ok, err := Object[abiwasm.Placement](raw); err != nil || !ok || !reflect.DeepEqual(got, pl) {
		t.Fatalf("placement: %+v, %v, %v; want %+v", got, ok, err, pl)
	}
	input, err := json.Marshal(abiwasm.PolicyInput{Hook: abiwasm.HookDeploy, Object: raw, OldObject: node})
	if err != nil {
		t.Fatal(err)
	}
	HandlePolicy(input, func(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
		if _, ok := parsedObjects.Load(keyOf(in.Object)); !ok {
			t.Error("no parsed tree for the placement")
		}
		if got, _, err := Object[abiwasm.Placement](in.Object); err != nil || !reflect.DeepEqual(got, pl) {
			t.Errorf("placement from the tree: %+v, %v", got, err)
		}
		if got, _, err := Object[abiwasm.Node](in.OldObject); err != nil || !reflect.DeepEqual(got, pl.Node) {
			t.Errorf("node from the tree: %+v, %v", got, err)
		}
		return Allow()
	})
	for _, bad := range []string{`[1]`, `{"slot":"one"}`, `{"node":{"cpus":1.5}}`, `{"service":{"replicas":"x"}}`, `{"node":7}`, `{"slot":1`} {
		if _, _, err := Object[abiwasm.Placement]([]byte(bad)); err == nil {
			t.Errorf("placement %s decoded", bad)
		}
	}
	for _, bad := range []string{`"n"`, `{"labels":[]}`, `{"memory_mb":"1"}`} {
		if _, _, err := Object[abiwasm.Node]([]byte(bad)); err == nil {
			t.Errorf("node %s decoded", bad)
		}
	}
}

// FuzzObjectDecoders: on any input encoding/json accepts, Object decodes a
// Service, a Placement and a Node exactly as it does.
func FuzzObjectDecoders(f *testing.F) {
	f.Add([]byte(`{"service":{"name":"a","labels":{"x":"y"},"lease":{"mode":"m"}},"slot":2,"node":{"id":"n1","hostname":"h","labels":{"zone":"a"},"cpus":4,"memory_mb":8192}}`))
	f.Add([]byte(`{"id":"n1","Hostname":"h","region":"eu","labels":{"a":"b"},"labels":{"c":"d"},"cpus":null,"address":"10.0.0.1:7000"}`))
	f.Add([]byte(`{"slot":3,"slot":null,"node":null,"service":{"env":{"A":"1"},"env":{"B":"2"},"replicas":2,"replicas":null}}`))
	f.Add([]byte(`{"name":"a","labels":null,"command":["x"],"port":80}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		objectAgrees[abiwasm.Service](t, b)
		objectAgrees[abiwasm.Placement](t, b)
		objectAgrees[abiwasm.Node](t, b)
	})
}

// TestConfigIsDecodedOncePerBinding: Config gives what encoding/json gives,
// decodes a configuration's bytes once (the kept value is returned on the
// next call, so a change to it would show), keeps configurations of
// different types and bytes apart, never keeps one that fails, and holds no
// more than its bounds.
func TestConfigIsDecodedOncePerBinding(t *testing.T) {
	type capCfg struct {
		Max    int      `json:"max_replicas"`
		Labels []string `json:"labels"`
	}
	type other struct {
		Max string `json:"max_replicas"`
	}
	configs = configCache{}
	in := abiwasm.PolicyInput{Config: json.RawMessage(`{"max_replicas":5,"labels":["team"]}`)}
	first, err := Config[capCfg](in)
	if err != nil || first.Max != 5 || !reflect.DeepEqual(first.Labels, []string{"team"}) {
		t.Fatalf("config %+v, %v", first, err)
	}
	first.Labels[0] = "changed" // shares the kept value's slice: shows it was not decoded again
	again, err := Config[capCfg](in)
	if err != nil || again.Labels[0] != "changed" {
		t.Fatalf("second call decoded again: %+v, %v", again, err)
	}
	if _, err := Config[other](in); err == nil {
		t.Fatal("a config of another type came from the kept one")
	}
	in2 := abiwasm.PolicyInput{Config: json.RawMessage(`{"max_replicas":6}`)}
	if c, err := Config[capCfg](in2); err != nil || c.Max != 6 {
		t.Fatalf("other bytes: %+v, %v", c, err)
	}
	bad := abiwasm.PolicyInput{Config: json.RawMessage(`{"max_replicas":"x"}`)}
	for range 2 {
		if _, err := Config[capCfg](bad); err == nil {
			t.Fatal("a bad config decoded")
		}
	}
	if c, err := Config[capCfg](abiwasm.PolicyInput{Config: json.RawMessage(`null`)}); err != nil || !reflect.DeepEqual(c, capCfg{}) {
		t.Fatalf("null config: %+v, %v", c, err)
	}
	for i := range 3 * maxConfigs {
		raw, _ := json.Marshal(capCfg{Max: i})
		if c, err := Config[capCfg](abiwasm.PolicyInput{Config: raw}); err != nil || c.Max != i {
			t.Fatalf("config %d: %+v, %v", i, c, err)
		}
		if n := len(configs.m); n > maxConfigs || configs.bytes > maxConfigBytes {
			t.Fatalf("%d configurations (%d bytes) kept", n, configs.bytes)
		}
	}
	big := make([]byte, 0, maxConfigBytes+64)
	big = append(big, `{"labels":["`...)
	for len(big) < maxConfigBytes+16 {
		big = append(big, 'x')
	}
	big = append(big, `"]}`...)
	if c, err := Config[capCfg](abiwasm.PolicyInput{Config: big}); err != nil || len(c.Labels) != 1 {
		t.Fatalf("big config: %v", err)
	}
	if _, ok := configs.get(configKey{typ: (*capCfg)(nil), raw: string(big)}); ok {
		t.Fatal("a config over maxConfigBytes was kept")
	}
}
