package wasm

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/internal/fillall"
)

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRoutesJSONCoversEveryField: with every field of RoutesInput and
// RoutesOutput set (and with fields left empty), the decoders give what
// encoding/json gives and the encoders write json.Marshal's bytes. A field
// added to any of these types without the codec fails here.
func TestRoutesJSONCoversEveryField(t *testing.T) {
	seed := 0
	var full RoutesInput
	fillall.Fill(t, reflect.ValueOf(&full).Elem(), &seed)
	for _, in := range []RoutesInput{full, {}, {Services: []RouteService{{}}, Workloads: []RouteWorkload{{}}}} {
		raw := marshal(t, in)
		if enc := AppendRoutesInput(nil, in); !bytes.Equal(enc, raw) {
			t.Fatalf("encode input\n got %s\nwant %s", enc, raw)
		}
		got, err := DecodeRoutesInput(raw)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("decode input\n got %+v\nwant %+v", got, in)
		}
	}
	var out RoutesOutput
	fillall.Fill(t, reflect.ValueOf(&out).Elem(), &seed)
	out.Routes = append(out.Routes, routes.Route{Timeouts: routes.Timeouts{IdleMS: 5}, Upstreams: []routes.Upstream{}}, routes.Route{})
	for _, o := range []RoutesOutput{out, {}, {Routes: []routes.Route{}}} {
		raw := marshal(t, o)
		got, err := DecodeRoutesOutput(raw)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, o) {
			t.Fatalf("decode output\n got %+v\nwant %+v", got, o)
		}
		if o.Routes != nil {
			if enc, want := AppendRoutes(nil, o.Routes), marshal(t, o.Routes); !bytes.Equal(enc, want) {
				t.Fatalf("encode routes\n got %s\nwant %s", enc, want)
			}
		}
	}
}

// TestRoutesJSONRefuses: inputs encoding/json refuses are refused with
// ErrRoutesJSON.
func TestRoutesJSONRefuses(t *testing.T) {
	for _, bad := range []string{
		``, `[]`, `"x"`, `{"services":`, `{"services":{}}`, `{"workloads":[{"port":"80"}]}`,
		`{"workloads":[{"port":1.5}]}`, `{"workloads":[{"port":1e3}]}`, `{"workloads":[{"port":99999999999999999999}]}`,
		`{"services":[{"id":7}]}`, `{"services":[{"domains":"a"}]}`, `{"services":[1]}`, `{} {}`,
		"{\"services\":[{\"id\":\"a\x01\"}]}", `{"services":[{"id":"\x"}]}`, `{"services":[{"id":"\u12"}]}`,
		`{"x":01}`, `{"x":-}`, `{"x":1.}`, `{"x":tru}`, `{"x":[1,]}`, `{"x":{"a":1,}}`, `{'x':1}`, "\xff",
		`{"routes":[{"stream":1}]}`, `{"routes":[{"upstreams":[{"healthy":"yes"}]}]}`, `{"routes":[{"timeouts":[]}]}`,
		`{"error":"x"}`, `{"routes":[{"hsts_max_age_s":true}]}`,
	} {
		var in RoutesInput
		var out RoutesOutput
		inErr, outErr := json.Unmarshal([]byte(bad), &in), json.Unmarshal([]byte(bad), &out)
		if inErr != nil {
			if _, err := DecodeRoutesInput([]byte(bad)); !errorsIs(err) {
				t.Errorf("input %q: DecodeRoutesInput gave %v", bad, err)
			}
		}
		if outErr != nil {
			if _, err := DecodeRoutesOutput([]byte(bad)); !errorsIs(err) {
				t.Errorf("output %q: DecodeRoutesOutput gave %v", bad, err)
			}
		}
		if inErr == nil && outErr == nil {
			t.Errorf("encoding/json accepts %q: not a refusal case", bad)
		}
	}
}

// FuzzRoutesJSON: the decoders accept exactly what json.Unmarshal accepts
// and give the same values; the encoders write json.Marshal's bytes.
func FuzzRoutesJSON(f *testing.F) {
	for _, s := range []string{
		`{"services":[{"id":"svc_1","project":"p","name":"a","domains":["a.example.com","B.example.com."],"tls_mode":"acme","allow_sources":["10.0.0.0/8"]}],` +
			`"workloads":[{"id":"wl_1","service_id":"svc_1","node_id":"nod_1","node_address":"10.0.0.1","port":8080,"address":"10.0.0.1:8080","observed_status":"running","health":"passing"}]}`,
		`{"SERVICES":[{"ID":"a","\u212aind":1,"Id":null}],"services":[{"name":"b"},null]}`,
		`{"workloads":[{"port":-0},{"port":null,"health":"\ud83d\ude00\ud800\udc00x\ud800\u0041\udc00"}],"extra":{"a":[1,2.5e-3,true,false,null,"\"\\\/\b\f\n\r\t"]}}`,
		"{\"services\":[{\"domains\":[\"\xff\xfe\",null,\"\u2028\"]}]}",
		` null `, `{"services":[],"workloads":null}`,
		`{"services":[{"id":"a"},{"id":"b"},{"id":"c"}],"services":[{"name":"x"}],"services":[{},{},{}]}`,
		`{"routes":[{"hostname":"a","upstreams":[{"workload_id":"w","address":"a:1","healthy":true}],"tls_mode":"acme","allow_sources":["10.0.0.0/8"],` +
			`"timeouts":{"connect_ms":1,"idle_ms":null},"stream":true,"https_redirect":false,"hsts_max_age_s":60}],"sha256":"ab","error":{"code":"c","message":"m"}}`,
		`{"error":null,"error":{"code":"x"},"Error":{"MESSAGE":"y"},"routes":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want RoutesInput
		werr := json.Unmarshal(b, &want)
		got, gerr := DecodeRoutesInput(b)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("input %q: encoding/json says %v, the fast decoder %v", b, werr, gerr)
		}
		if werr == nil {
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("input %q:\nfast          %#v\nencoding/json %#v", b, got, want)
			}
			if enc, jm := AppendRoutesInput(nil, want), marshal(t, want); !bytes.Equal(enc, jm) {
				t.Fatalf("encode input %q:\nfast %s\njson %s", b, enc, jm)
			}
		}
		var wantOut RoutesOutput
		werr = json.Unmarshal(b, &wantOut)
		gotOut, gerr := DecodeRoutesOutput(b)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("output %q: encoding/json says %v, the fast decoder %v", b, werr, gerr)
		}
		if werr == nil {
			if !reflect.DeepEqual(gotOut, wantOut) {
				t.Fatalf("output %q:\nfast          %#v\nencoding/json %#v", b, gotOut, wantOut)
			}
			if wantOut.Routes != nil {
				if enc, jm := AppendRoutes(nil, wantOut.Routes), marshal(t, wantOut.Routes); !bytes.Equal(enc, jm) {
					t.Fatalf("routes %q:\nfast %s\njson %s", b, enc, jm)
				}
			}
		}
		if enc, jm := AppendJSONString(nil, string(b)), marshal(t, string(b)); !bytes.Equal(enc, jm) {
			t.Fatalf("string %q:\nfast %s\njson %s", b, enc, jm)
		}
	})
}

func errorsIs(err error) bool { return errors.Is(err, ErrRoutesJSON) }
