package wasm

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/routes"
)

// schemaNode is the part of a JSON Schema the test compares with the Go types.
type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	Items      *schemaNode            `json:"items"`
	Ref        string                 `json:"$ref"`
	OneOf      []*schemaNode          `json:"oneOf"`
	Defs       map[string]*schemaNode `json:"$defs"`
}

func loadSchema(t *testing.T, name string) *schemaNode {
	t.Helper()
	raw, err := Schemas.ReadFile("schema/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var n schemaNode
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &n
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("json"), ",")[0]
		if tag != "" && tag != "-" {
			out = append(out, tag)
		}
	}
	sort.Strings(out)
	return out
}

func keys(m map[string]*schemaNode) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestSchemasMatchTypes proves that every schema names exactly the fields of
// the Go type that carries it, so neither drifts from the other.
func TestSchemasMatchTypes(t *testing.T) {
	pin := loadSchema(t, "policy_input.json")
	rin := loadSchema(t, "routes_input.json")
	rout := loadSchema(t, "routes_output.json")
	cases := []struct {
		name string
		node *schemaNode
		typ  any
	}{
		{"metadata", loadSchema(t, "metadata.json"), Metadata{}},
		{"policy_input", pin, PolicyInput{}},
		{"policy_input.actor", pin.Properties["actor"], Actor{}},
		{"policy_input.project", pin.Properties["project"], Project{}},
		{"policy_input.service", pin.Defs["service"], Service{}},
		{"policy_input.node", pin.Defs["node"], Node{}},
		{"policy_input.placement", pin.Defs["placement"], Placement{}},
		{"policy_input.health_check", pin.Defs["health_check"], HealthCheck{}},
		{"policy_input.lease", pin.Defs["lease"], Lease{}},
		{"policy_output", loadSchema(t, "policy_output.json"), PolicyOutput{}},
		{"policy_output.error", loadSchema(t, "policy_output.json").Defs["error"], GuestError{}},
		{"routes_input", rin, RoutesInput{}},
		{"routes_input.service", rin.Properties["services"].Items, RouteService{}},
		{"routes_input.workload", rin.Properties["workloads"].Items, RouteWorkload{}},
		{"routes_output", rout, RoutesOutput{}},
		{"routes_output.route", rout.Properties["routes"].Items, routes.Route{}},
		{"routes_output.upstream", rout.Properties["routes"].Items.Properties["upstreams"].Items, routes.Upstream{}},
		{"routes_output.header", rout.Properties["routes"].Items.Properties["headers"].Items, routes.HeaderMatch{}},
	}
	for _, c := range cases {
		if c.node == nil {
			t.Errorf("%s: schema node missing", c.name)
			continue
		}
		got, want := keys(c.node.Properties), jsonFields(reflect.TypeOf(c.typ))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: schema properties %v, Go fields %v", c.name, got, want)
		}
	}
}

func TestVersionAndPack(t *testing.T) {
	if ma, mi := SplitVersion(Version(Major, Minor)); ma != Major || mi != Minor {
		t.Fatalf("SplitVersion(Version(%d, %d)) = %d, %d", Major, Minor, ma, mi)
	}
	if p, l := Unpack(Pack(0xdeadbeef, 7)); p != 0xdeadbeef || l != 7 {
		t.Fatalf("Unpack(Pack) = %#x, %d", p, l)
	}
	for _, h := range Hooks() {
		if !h.Valid() {
			t.Errorf("hook %q not valid", h)
		}
	}
	if Hook("service.create").Valid() {
		t.Error("unknown hook reported valid")
	}
}
