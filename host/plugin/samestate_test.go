package plugin

import (
	"encoding/json"
	"testing"

	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
)

// TestSameStateIgnoresOnlyCertificatePEM: a gateway answers a table with
// certificates without their PEM, which is the planned state; any other
// difference is still one.
func TestSameStateIgnoresOnlyCertificatePEM(t *testing.T) {
	table := func(cert, key string, names ...string) provider.Resource {
		raw, _ := json.Marshal(map[string]any{"revision": 1, "routes": []any{},
			"certificates": []any{map[string]any{"names": names, "cert_pem": cert, "key_pem": key, "not_after": "2027-01-01T00:00:00Z"}}})
		return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
	}
	planned := table("CERT", "KEY", "a.example.test")
	redacted := func() provider.Resource {
		raw, _ := json.Marshal(map[string]any{"revision": 1, "routes": []any{},
			"certificates": []any{map[string]any{"names": []string{"a.example.test"}, "not_after": "2027-01-01T00:00:00Z"}}})
		return provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
	}()
	if !sameState(planned, redacted) {
		t.Error("a table answered without its PEM differs from the planned one")
	}
	if sameState(planned, table("CERT", "KEY", "b.example.test")) {
		t.Error("certificates for other names compare equal")
	}
	other := redacted
	other.Type = "dns.record"
	p2 := planned
	p2.Type = "dns.record"
	if sameState(p2, other) {
		t.Error("PEM fields are ignored for a type that is not the route table")
	}
	if d := attrDigest(planned); len(d) != 64 || d == attrDigest(redacted) {
		t.Errorf("attrDigest = %q", d)
	}
}
