// Command sticky is a deliberately broken gateway for the gateway cases of
// the conformance suite: the built-in gateway whose Apply never withdraws a
// host (each table is merged into the routes it already serves). The suite
// must fail it in exactly gateway_swap_withdraws (plugins/gateway's
// TestGatewayConformanceFailsAStickyGateway checks that), which proves the
// cases look at what is served, not only at what the plugin answers.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/plugins/gateway"
	"github.com/berthhq/berth/sdk/provider"
)

// sticky is the gateway plugin with a merging Apply: routes are kept by
// hostname and match conditions.
type sticky struct {
	*gateway.Plugin
	served map[string]routes.Route
}

func (s *sticky) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	var t routes.Table
	if err := json.Unmarshal(req.Planned.Attributes, &t); err == nil {
		for _, r := range t.Routes {
			s.served[r.Hostname+"\x00"+r.MatchKey()] = r
		}
		t.Routes = t.Routes[:0]
		for _, r := range s.served {
			t.Routes = append(t.Routes, r)
		}
		t.Normalize()
		req.Planned.Attributes, _ = json.Marshal(t)
	}
	return s.Plugin.Apply(ctx, req)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address the HTTP proxy listens on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sticky: %v\n", err)
		os.Exit(1)
	}
	proxy := gateway.NewProxy(nil)
	go func() { _ = gateway.NewServer(proxy).Serve(ln) }()
	provider.Serve(&sticky{Plugin: gateway.NewPlugin(proxy), served: map[string]routes.Route{}})
}
