// Package dns runs Berth's DNS end to end with real processes: berthd with the DNS provider
// plugin writing to a real knot server (docs/dns.md).
package dns

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/berthhq/berth/internal/knottest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// bin is the directory of berthd and berth-plugin-dns: BERTH_BIN_DIR, or built by TestMain.
var bin string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if bin = os.Getenv("BERTH_BIN_DIR"); bin != "" {
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "berth-dns-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin = filepath.Join(tmp, "bin")
	cmd := exec.Command("go", "build", "-o", bin+"/", "github.com/berthhq/berth/cmd/berthd", "github.com/berthhq/berth/cmd/berth-plugin-dns")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// TestManagedDomainsGetRecordsAndLoseThemOnDelete: berthd with --dns-config and
// --edge-addresses; a service with dns: managed and two domains gets A and AAAA records of the
// edge addresses on knot, queried over DNS; a domain dropped by an apply loses its records, and
// deleting the service withdraws the rest, leaving the zone's own records alone.
func TestManagedDomainsGetRecordsAndLoseThemOnDelete(t *testing.T) {
	k := knottest.Start(t, "example.test")
	dir := t.TempDir()
	cfg, _ := json.Marshal(map[string]any{"server": k.Addr, "zones": []string{"example.test"},
		"tsig_key_name": k.Key.Name, "tsig_algorithm": k.Key.Algorithm, "tsig_secret": k.Key.Secret})
	cfgPath := filepath.Join(dir, "dns.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	data, api := filepath.Join(dir, "berthd"), proctest.FreeAddr(t)
	logPath := filepath.Join(dir, "berthd.log")
	p := proctest.Start(t, logPath, filepath.Join(bin, "berthd"), "--data-dir", data, "--listen", api,
		"--gateway-listen", "off", "--dns-config", cfgPath, "--edge-addresses", "192.0.2.10,2001:db8::10")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("berthd.log:\n%s\nknotd.log:\n%s", b, k.Log())
		}
	})
	d := proctest.WaitBerthdReady(t, p, data, "https://"+api, time.Minute)
	c, err := client.New("https://"+api, client.WithToken(d.Token), client.WithFingerprint(d.Fingerprint))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// The DNS plugin is supervised like the gateway: in berthd's plugin list and its metrics.
	plugins, err := c.ListPlugins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(plugins, func(p client.Plugin) bool { return p.Name == "dns" && p.Kind == "provider" && p.PID > 0 }) {
		t.Errorf("berthd's plugin list lacks the running DNS plugin: %+v", plugins)
	}
	resp, err := d.HTTP.Get("https://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(metrics), `plugin="dns"`) {
		t.Errorf("berthd's /metrics has no series of the DNS plugin (plugin=\"dns\")")
	}

	app := t.TempDir()
	if err := os.WriteFile(filepath.Join(app, "run.sh"), []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	digest, _, err := bundle.Create(ctx, app, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(ctx, "default", "sleeper", strings.NewReader(buf.String())); err != nil {
		t.Fatal(err)
	}
	spec := client.ServiceSpec{Bundle: digest, Command: []string{"./run.sh"}, Port: 8080,
		Domains: []string{"www.example.test", "shop.example.test"}, DNS: "managed"}
	svc, err := c.ApplyService(ctx, "default", "web", spec)
	if err != nil {
		t.Fatal(err)
	}
	if svc.DNS != "managed" {
		t.Fatalf("applied service dns = %q, want managed", svc.DNS)
	}
	wait := func(name string, rrtype uint16, want ...string) {
		t.Helper()
		proctest.WaitFor(t, 2*time.Minute, name+" "+mdns.TypeToString[rrtype]+" = "+strings.Join(want, ","), func() (bool, string) {
			got := k.Addresses(t, name, rrtype)
			return slices.Equal(got, want), strings.Join(got, ",")
		})
	}
	for _, host := range spec.Domains {
		wait(host, mdns.TypeA, "192.0.2.10")
		wait(host, mdns.TypeAAAA, "2001:db8::10")
	}

	spec.Domains = []string{"www.example.test"}
	if _, err := c.ApplyService(ctx, "default", "web", spec); err != nil {
		t.Fatal(err)
	}
	wait("shop.example.test", mdns.TypeA)
	wait("shop.example.test", mdns.TypeAAAA)
	wait("www.example.test", mdns.TypeA, "192.0.2.10")

	if err := c.DeleteService(ctx, "default", "web", nil); err != nil {
		t.Fatal(err)
	}
	wait("www.example.test", mdns.TypeA)
	wait("www.example.test", mdns.TypeAAAA)
	wait("ns1.example.test", mdns.TypeA, "127.0.0.1")
}
