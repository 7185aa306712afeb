package wasm

import (
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
