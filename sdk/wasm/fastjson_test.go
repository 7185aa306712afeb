package wasm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// fill sets every field of the struct at v to a distinct non-zero value, so a
// field the fast decoder forgets shows up as a difference.
func fill(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	*seed++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d \"é\"", *seed))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*seed))
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 { // json.RawMessage
			v.SetBytes([]byte(fmt.Sprintf(`{"k":[%d,"x",null,true]}`, *seed)))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), seed)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(t, k, seed)
			fill(t, e, seed)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(t, p.Elem(), seed)
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), seed)
		}
	default:
		t.Fatalf("fill: add %s (%s) to the fast decoder and to this test", v.Type(), v.Kind())
	}
}

// sameJSON compares two raw JSON values by meaning.
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func samePolicyInput(t *testing.T, a, b abiwasm.PolicyInput) bool {
	t.Helper()
	return a.Hook == b.Hook && a.Actor == b.Actor && reflect.DeepEqual(a.Project, b.Project) &&
		sameJSON(t, a.Object, b.Object) && sameJSON(t, a.OldObject, b.OldObject) && sameJSON(t, a.Config, b.Config)
}

// TestFastDecodersCoverEveryField: with every field of PolicyInput and
// Service set, the fast decoders give what encoding/json gives. A field added
// to either type without the decoder fails here.
func TestFastDecodersCoverEveryField(t *testing.T) {
	seed := 0
	var svc abiwasm.Service
	fill(t, reflect.ValueOf(&svc).Elem(), &seed)
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	var got abiwasm.Service
	if err := decodeService(raw, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, svc) {
		t.Fatalf("fast service decode\n got %+v\nwant %+v", got, svc)
	}
	var in abiwasm.PolicyInput
	fill(t, reflect.ValueOf(&in).Elem(), &seed)
	in.Object = raw
	rawIn, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var want abiwasm.PolicyInput
	if err := json.Unmarshal(rawIn, &want); err != nil {
		t.Fatal(err)
	}
	gotIn, err := decodePolicyInput(rawIn)
	if err != nil {
		t.Fatal(err)
	}
	if !samePolicyInput(t, gotIn, want) {
		t.Fatalf("fast input decode\n got %+v\nwant %+v", gotIn, want)
	}
	for _, bad := range []string{`{"hook":`, `[1,2]`, "\xff\xfe", ``, `{"hook":7}`, `{"project":"x"}`} {
		if _, err := decodePolicyInput([]byte(bad)); err == nil {
			t.Errorf("input %q decoded", bad)
		}
	}
	if err := decodeService([]byte(`{"replicas":"three"}`), &got); err == nil {
		t.Error("a string replicas decoded")
	}
}

// FuzzFastDecoders: whenever both decoders accept an input, they agree.
func FuzzFastDecoders(f *testing.F) {
	f.Add([]byte(`{"hook":"service.apply","actor":{"kind":"token","id":"t"},"project":{"name":"p","replicas":2},"object":{"name":"a","env":{"A":"b"},"domains":["x"]},"config":null}`))
	f.Add([]byte(`{"name":"a","replicas":3,"labels":{"team":"x"},"command":["a","b"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want abiwasm.PolicyInput
		if json.Unmarshal(b, &want) == nil {
			if got, err := decodePolicyInput(b); err == nil && !samePolicyInput(t, got, want) {
				t.Fatalf("input %q: fast %+v, encoding/json %+v", b, got, want)
			} else if err == nil && (!bytes.Equal(got.Object, want.Object) || !bytes.Equal(got.OldObject, want.OldObject) || !bytes.Equal(got.Config, want.Config)) {
				t.Fatalf("input %q: raw values %q %q %q, encoding/json's %q %q %q", b, got.Object, got.OldObject, got.Config, want.Object, want.OldObject, want.Config)
			}
		}
		if want.Hook.Valid() { // through HandlePolicy, the service from the parsed tree
			var fromTree, fromBytes abiwasm.Service
			var treeErr, bytesErr error
			HandlePolicy(b, func(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
				if len(in.Object) > 0 && string(in.Object) != "null" {
					fromTree, _, treeErr = Object[abiwasm.Service](in.Object)
					bytesErr = decodeService(in.Object, &fromBytes)
				}
				return Allow()
			})
			if (treeErr == nil) != (bytesErr == nil) || !reflect.DeepEqual(fromTree, fromBytes) {
				t.Fatalf("input %q: service from the tree %+v (%v), from its bytes %+v (%v)", b, fromTree, treeErr, fromBytes, bytesErr)
			}
		}
		var ws, gs abiwasm.Service
		if json.Unmarshal(b, &ws) == nil {
			if err := decodeService(b, &gs); err == nil && !reflect.DeepEqual(gs, ws) {
				t.Fatalf("service %q: fast %+v, encoding/json %+v", b, gs, ws)
			}
		}
	})
}

// TestFastDecodersKeepNothingOfTheParser: the parsers are reused between
// calls, so what one decode returned must not change when the next one
// parses other bytes into the same parser, nor when the input's bytes are
// overwritten (the host reuses the input's memory).
func TestFastDecodersKeepNothingOfTheParser(t *testing.T) {
	first := []byte(`{"hook":"service.apply","actor":{"kind":"token","id":"tok_a"},"project":{"name":"shop","replicas":2},` +
		`"object":{"name":"cart","bundle":"cart","env":{"A":"b"},"domains":["x.example.com"],"labels":{"team":"t"}},"config":{"k":[1]}}`)
	var want abiwasm.PolicyInput
	if err := json.Unmarshal(first, &want); err != nil {
		t.Fatal(err)
	}
	var wantSvc abiwasm.Service
	if err := json.Unmarshal(want.Object, &wantSvc); err != nil {
		t.Fatal(err)
	}
	in, err := decodePolicyInput(bytes.Clone(first))
	if err != nil {
		t.Fatal(err)
	}
	obj := bytes.Clone(in.Object)
	var svc abiwasm.Service
	if err := decodeService(obj, &svc); err != nil {
		t.Fatal(err)
	}
	clear(obj)
	second := bytes.ReplaceAll(first, []byte("a"), []byte("z"))
	for range 4 { // several parsers may be pooled: reach each
		if _, err := decodePolicyInput(second); err != nil {
			t.Fatal(err)
		}
		var other abiwasm.Service
		if err := decodeService([]byte(`{"name":"zzzz","bundle":"zzzz","env":{"Z":"zz"},"domains":["z.zz"],"labels":{"zz":"z"}}`), &other); err != nil {
			t.Fatal(err)
		}
	}
	if !samePolicyInput(t, in, want) {
		t.Fatalf("input changed by later decodes\n got %+v\nwant %+v", in, want)
	}
	if !reflect.DeepEqual(svc, wantSvc) {
		t.Fatalf("service changed by later decodes\n got %+v\nwant %+v", svc, wantSvc)
	}
}

// TestFastDecodersAllocateLittle: a typical input is decoded with a few
// dozen allocations (the strings, slices and maps of the result), not one
// per key or per parsed value (26 here, about 55 under the race detector);
// before the parsers were reused and keys folded without copies it took
// 150. Allocations, unlike time, do not
// depend on the machine. The race detector drops pooled parsers at random,
// so the bound leaves room for some fresh ones.
func TestFastDecodersAllocateLittle(t *testing.T) {
	svc := abiwasm.Service{Project: "shop", Name: "cart", Revision: 7, Bundle: "cart", BundleDigest: "sha256:ab",
		Command: []string{"./cart", "--listen", ":8080"}, Env: map[string]string{"LOG_LEVEL": "info", "REGION": "eu-1"},
		Port: 8080, Domains: []string{"cart.shop.example.com"}, Replicas: 3, Labels: map[string]string{"team": "checkout"}}
	obj, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	input, err := json.Marshal(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_01"},
		Project: &abiwasm.Project{Name: "shop", Services: 4}, Object: obj, OldObject: obj, Config: json.RawMessage(`{"labels":["team"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		in, err := decodePolicyInput(input)
		if err != nil {
			t.Fatal(err)
		}
		var s abiwasm.Service
		if err := decodeService(in.Object, &s); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations per decode", allocs)
	if allocs > 100 {
		t.Fatalf("decoding a typical input took %.0f allocations, want at most 100", allocs)
	}
}

// TestHandlePolicyDecodesTheParsedService: inside HandlePolicy, Object gives
// the service json.Unmarshal gives for the object and the old object, from
// the parsed trees, which are forgotten when HandlePolicy returns.
func TestHandlePolicyDecodesTheParsedService(t *testing.T) {
	input := []byte(`{"hook":"service.apply","object":{"name":"cart","image":"x","env":{"A":"b"},"lease":{"mode":"m"}},` +
		`"old_object":{"name":"old","replicas":2}}`)
	var calls int
	HandlePolicy(input, func(in abiwasm.PolicyInput) abiwasm.PolicyOutput {
		calls++
		for _, raw := range []json.RawMessage{in.Object, in.OldObject} {
			if _, ok := parsedObjects.Load(keyOf(raw)); !ok {
				t.Errorf("no parsed tree for %s", raw)
			}
			got, ok, err := Object[abiwasm.Service](raw)
			var want abiwasm.Service
			if uerr := json.Unmarshal(raw, &want); uerr != nil || err != nil || !ok {
				t.Fatalf("decode %s: %v, %v, ok %v", raw, uerr, err, ok)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("service from the tree\n got %+v\nwant %+v", got, want)
			}
		}
		return Allow()
	})
	if calls != 1 {
		t.Fatalf("policy called %d times", calls)
	}
	n := 0
	parsedObjects.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("%d parsed trees remembered after HandlePolicy returned", n)
	}
}
