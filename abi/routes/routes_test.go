package routes

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	up := Upstream{WorkloadID: "wl_1", Address: "10.0.0.1:8080", Healthy: true}
	ok := Route{Hostname: "a.example.com", Upstreams: []Upstream{up}, TLSMode: TLSNone, AllowSources: []string{"10.0.0.0/8", "fd00::/8", "192.0.2.7/32"}}
	if err := (Table{Routes: []Route{ok, {Hostname: "b.example.com", TLSMode: TLSACME}, {Hostname: "c", TLSMode: TLSPassthrough}}}).Validate(); err != nil {
		t.Fatalf("a routable table: %v", err)
	}
	for _, tc := range []struct {
		name string
		r    Route
		want string
	}{
		{"empty hostname", Route{}, "empty or repeated"},
		{"upper case", Route{Hostname: "A.example.com"}, "lower case"},
		{"trailing dot", Route{Hostname: "a.example.com."}, "trailing dot"},
		{"port", Route{Hostname: "a.example.com:80"}, "without port"},
		{"tls mode", Route{Hostname: "a.test", TLSMode: "https"}, `unknown tls_mode "https"`},
		{"not a prefix", Route{Hostname: "a.test", AllowSources: []string{"10.0.0.1"}}, "not a CIDR prefix"},
		{"host bits", Route{Hostname: "a.test", AllowSources: []string{"10.0.0.1/8"}}, "write 10.0.0.0/8"},
		{"no workload", Route{Hostname: "a.test", Upstreams: []Upstream{{Address: "10.0.0.1:1"}}}, "no workload_id"},
		{"bad address", Route{Hostname: "a.test", Upstreams: []Upstream{{WorkloadID: "wl_1", Address: "10.0.0.1"}}}, "not host:port"},
	} {
		err := (Table{Routes: []Route{tc.r}}).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	if err := (Table{Routes: []Route{ok, ok}}).Validate(); err == nil || !strings.Contains(err.Error(), "repeated") {
		t.Errorf("a repeated hostname: %v", err)
	}
}
