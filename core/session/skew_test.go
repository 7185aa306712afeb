package session

import (
	"context"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
)

// TestSessionVersionSkew: berthd 0.4.0 welcomes agents and driver plugins
// 0.4.x and 0.3.x and refuses, with a fatal agent_version_skew before the
// close, an agent or plugin two minors behind and one ahead of it; a refused
// agent is not recorded as connected (docs/upgrades.md section 2).
func TestSessionVersionSkew(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *Config) { c.CoreVersion = "0.4.0" })
	for _, tc := range []struct {
		agent, driver string
		ok            bool
	}{
		{"0.4.1", "0.4.0", true},
		{"0.3.0", "0.3.2", true},
		{"0.2.9", "0.4.0", false},
		{"0.5.0", "0.4.0", false},
		{"1.4.0", "0.4.0", false},
		{"0.4.0", "0.2.0", false}, // the driver plugin is too old
		{"0.4.0", "conformance", true},
	} {
		t.Run(tc.agent+"/"+tc.driver, func(t *testing.T) {
			p, _, err := f.dial(t, f.cred)
			if err != nil {
				t.Fatal(err)
			}
			p.send(1, node.TypeHello, node.Hello{NodeID: f.node.ID, AgentVersion: tc.agent, Drivers: []string{"process"},
				DriverVersions: map[string]string{"process": tc.driver}})
			if !tc.ok {
				p.expectError("agent_version_skew", true)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, _, err := p.ws.Read(ctx); err == nil {
					t.Fatal("session still open after a fatal agent_version_skew")
				}
				n, err := f.reg.Get(ctx, f.node.ID)
				if err != nil {
					t.Fatal(err)
				}
				if n.AgentVersion == tc.agent {
					t.Fatalf("refused agent %s recorded as the node's agent version", tc.agent)
				}
				return
			}
			if env := p.next(); env.Type != node.TypeWelcome {
				t.Fatalf("agent %s: first answer %s %s, want welcome", tc.agent, env.Type, env.Body)
			}
		})
	}
}

// TestSessionNetworkPlugin: a hello's network_versions are judged by the
// skew rule like driver_versions, and a welcomed one records the node's
// network plugins, which decide whether berth-plugin-<name> may be upgraded
// on it (docs/upgrades.md sections 2 and 3.5).
func TestSessionNetworkPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *Config) { c.CoreVersion = "0.4.0" })
	hello := func(nft string) node.Hello {
		return node.Hello{NodeID: f.node.ID, AgentVersion: "0.4.0", Drivers: []string{"process"},
			DriverVersions: map[string]string{"process": "0.4.0"}, NetworkVersions: map[string]string{"nftables": nft}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p.send(1, node.TypeHello, hello("0.2.0"))
	p.expectError("agent_version_skew", true)
	if _, _, err := p.ws.Read(ctx); err == nil {
		t.Fatal("session still open after a fatal agent_version_skew")
	}
	if n, err := f.reg.Get(ctx, f.node.ID); err != nil || len(n.Networks) != 0 {
		t.Fatalf("refused hello recorded network plugins: %v %v", n.Networks, err)
	}

	p, _, err = f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	p.send(1, node.TypeHello, hello("0.4.1"))
	if env := p.next(); env.Type != node.TypeWelcome {
		t.Fatalf("first answer %s %s, want welcome", env.Type, env.Body)
	}
	n := f.waitNode(t, "recorded with its network plugins", func(n *nodes.Node) bool { return n.Status == nodes.StatusConnected })
	if len(n.Networks) != 1 || n.Networks[0] != "nftables" {
		t.Fatalf("node's network plugins %v, want [nftables]", n.Networks)
	}
}
