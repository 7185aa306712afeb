package plugin_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/examples/provider-hello/hello"
	"github.com/berthhq/berth/host/plugin"
)

func TestTypesRefusesATypeDeclaredTwiceNamingBothPlugins(t *testing.T) {
	t.Parallel()
	reg := plugin.NewTypes()
	decl := []provider.ResourceType{{Name: "acme.widget"}, {Name: "acme.gadget"}}
	if err := reg.Add("acme", "", nil, decl); err != nil {
		t.Fatal(err)
	}
	err := reg.Add("acme-fork", "", nil, []provider.ResourceType{{Name: "other.thing"}, {Name: "acme.widget"}})
	if !errors.Is(err, plugin.ErrTypeDeclaredTwice) {
		t.Fatalf("second declaration: got %v, want ErrTypeDeclaredTwice", err)
	}
	for _, want := range []string{"acme.widget", "plugin acme ", "plugin acme-fork"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, ok := reg.Lookup("other.thing"); ok {
		t.Error("a refused plugin registered some of its types")
	}
	if e, ok := reg.Lookup("acme.gadget"); !ok || e.Plugin != "acme" {
		t.Errorf("acme.gadget: %+v %v", e, ok)
	}
}

func TestTypesValidatesSpecsAgainstTheDeclaredSchema(t *testing.T) {
	t.Parallel()
	reg := plugin.NewTypes()
	if err := reg.Add("hello", "", nil, []provider.ResourceType{{Name: hello.ResourceType, Schema: json.RawMessage(hello.Schema)}}); err != nil {
		t.Fatal(err)
	}
	e, _ := reg.Lookup(hello.ResourceType)
	if err := e.Validate([]byte(`{"message":"hi","loud":true}`)); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
	for spec, field := range map[string]string{
		`{"message":"hi","loud":"yes"}`: "spec/loud",
		`{"loud":true}`:                 "spec",
		`{"message":""}`:                "spec/message",
		`{"message":"hi","colour":1}`:   "spec",
	} {
		err := e.Validate([]byte(spec))
		var se *plugin.SchemaError
		if !errors.As(err, &se) || se.Field != field {
			t.Errorf("%s: got %v, want a schema error at %s", spec, err, field)
		}
	}
	bad := reg.Add("broken", "", nil, []provider.ResourceType{{Name: "broken.thing", Schema: json.RawMessage(`{"type": 7}`)}})
	if bad == nil || !strings.Contains(bad.Error(), "bug in plugin broken") {
		t.Errorf("uncompilable schema: got %v", bad)
	}
}
