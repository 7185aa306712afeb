package nftables_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nft "github.com/google/nftables"

	"github.com/berthhq/berth/nodeplugins/containerd/ctrtest"
	"github.com/berthhq/berth/nodeplugins/nftables"
)

// newNetwork returns a network on a bridge, tables and /24 of its own, with
// the guard and base ruleset applied, torn down when t ends.
func newNetwork(t *testing.T, stateDir string) (*nftables.Network, nftables.Config) {
	t.Helper()
	requireRoot(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	cfg := nftables.Config{
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.213.%d.0/24", b[0])),
		Bridge:      "bt" + h,
		TablePrefix: "bt" + h,
		StateDir:    stateDir,
	}
	n := open(t, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Teardown(ctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return n, cfg
}

func open(t *testing.T, cfg nftables.Config) *nftables.Network {
	t.Helper()
	n, err := nftables.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := n.Guard(t.Context()); err != nil {
		t.Fatalf("Guard: %v", err)
	}
	if err := n.Ensure(t.Context()); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return n
}

// requireRoot fails under make test (which runs as root) and skips a
// developer's unprivileged run.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(ctrtest.EnvRequire) == "1" {
		t.Fatalf("network tests need root")
	}
	t.Skip("skipped: network tests need root (network namespaces, veths, nftables)")
}

// serve runs busybox httpd in a's namespace on port 8080, answering name.
func serve(t *testing.T, a nftables.Attachment, name string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", a.NetNS, ctrtest.Busybox, "httpd", "-f", "-p", a.Address.String()+":8080", "-h", dir)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start httpd: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Wait until it answers inside its own namespace.
	deadline := time.Now().Add(10 * time.Second)
	for !fetch(t, a, a.Address, name) {
		if time.Now().After(deadline) {
			t.Fatalf("httpd in %s did not answer", a.WorkloadID)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fetch reports whether a GET from inside from's namespace to addr:8080
// returns want (one second timeout).
func fetch(t *testing.T, from nftables.Attachment, addr netip.Addr, want string) bool {
	t.Helper()
	// timeout(1) bounds it: busybox wget's own -T crashes in Debian's build.
	out, err := exec.Command("timeout", "1", "ip", "netns", "exec", from.NetNS, ctrtest.Busybox, "wget", "-q", "-O", "-",
		"http://"+addr.String()+":8080/").CombinedOutput()
	return err == nil && strings.TrimSpace(string(out)) == want
}

func attach(t *testing.T, n *nftables.Network, id, group string, ports ...nftables.Port) nftables.Attachment {
	t.Helper()
	a, err := n.Attach(t.Context(), nftables.AttachRequest{WorkloadID: id, Group: group, Ports: ports})
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	return a
}

// TestIsolationPortsAndRemoval sends real packets: one project's workloads
// reach each other, another project's do not, a published port answers from
// the node, and removal leaves no rule, veth or namespace.
func TestIsolationPortsAndRemoval(t *testing.T) {
	n, cfg := newNetwork(t, t.TempDir())
	a1 := attach(t, n, "wl_a1", "prj_a")
	a2 := attach(t, n, "wl_a2", "prj_a", nftables.Port{HostPort: 18080 + uint16(time.Now().UnixNano()%1000), ContainerPort: 8080})
	b1 := attach(t, n, "wl_b1", "prj_b")
	serve(t, a1, "a1")
	serve(t, a2, "a2")
	serve(t, b1, "b1")

	if !fetch(t, a2, a1.Address, "a1") {
		t.Errorf("a workload cannot reach another of its project")
	}
	if fetch(t, b1, a1.Address, "a1") {
		t.Errorf("a workload of project b reached one of project a")
	}
	if fetch(t, a1, b1.Address, "b1") {
		t.Errorf("a workload of project a reached one of project b")
	}

	// The node reaches a published port on its own address (the gateway).
	gw := cfg.Subnet.Addr().Next()
	url := fmt.Sprintf("http://%s:%d/", gw, a2.Ports[0].HostPort)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(body)) != "a2" {
		t.Errorf("published port answered %q; want a2", body)
	}

	// And on its loopback address.
	url = fmt.Sprintf("http://127.0.0.1:%d/", a2.Ports[0].HostPort)
	resp, err = (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(body)) != "a2" {
		t.Errorf("published port on 127.0.0.1 answered %q; want a2", body)
	}

	// Moving a2 to project b (same address) takes effect in one apply.
	if _, err := n.Attach(t.Context(), nftables.AttachRequest{WorkloadID: "wl_a2", Group: "prj_b"}); err != nil {
		t.Fatal(err)
	}
	if fetch(t, a2, a1.Address, "a1") || !fetch(t, a2, b1.Address, "b1") {
		t.Errorf("after regrouping, wl_a2 does not see exactly project b")
	}

	for _, a := range []nftables.Attachment{a1, a2, b1} {
		if err := n.Detach(t.Context(), a.WorkloadID); err != nil {
			t.Fatalf("Detach: %v", err)
		}
		if _, err := os.Stat(a.NetNSPath()); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind (%v)", a.NetNS, err)
		}
		if _, err := os.Stat("/sys/class/net/" + a.HostVeth); !os.IsNotExist(err) {
			t.Errorf("veth %s left behind", a.HostVeth)
		}
	}
	if rules := countRules(t, cfg.TablePrefix); rules["published"] != 0 || rules["forward"] != 0 {
		t.Errorf("rules left after removing every workload: %v", rules)
	}
	if err := n.Teardown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if tables := tablesNamed(t, cfg.TablePrefix); len(tables) != 0 {
		t.Errorf("tables left after teardown: %v", tables)
	}
	if _, err := os.Stat("/sys/class/net/" + cfg.Bridge); !os.IsNotExist(err) {
		t.Errorf("bridge %s left after teardown", cfg.Bridge)
	}
}

// TestRestartKeepsAddressesAndGuard: a new Network on the same state
// directory (an agent restart) restores the guard first, keeps every
// allocation and the traffic between them.
func TestRestartKeepsAddressesAndGuard(t *testing.T) {
	state := t.TempDir()
	n, cfg := newNetwork(t, state)
	a1 := attach(t, n, "wl_r1", "prj_r")
	a2 := attach(t, n, "wl_r2", "prj_r")
	serve(t, a1, "r1")

	// The agent stops; someone deletes the guard table meanwhile.
	c, err := nft.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nft.Table{Family: nft.TableFamilyINet, Name: cfg.TablePrefix + "_guard"})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	n2 := open(t, cfg)
	if got := tablesNamed(t, cfg.TablePrefix+"_guard"); len(got) != 1 {
		t.Errorf("guard tables after restart: %v; want one", got)
	}
	if rules := countRules(t, cfg.TablePrefix+"_guard"); rules["forward"] != 4 {
		t.Errorf("guard rules after restart = %v; want 4 in forward", rules)
	}
	got := n2.Attachments()
	if len(got) != 2 || got[0].Address != a1.Address || got[1].Address != a2.Address {
		t.Errorf("attachments after restart = %+v", got)
	}
	if !fetch(t, a2, a1.Address, "r1") {
		t.Errorf("traffic within the project lost across a restart")
	}
}

func tablesNamed(t *testing.T, name string) []string {
	t.Helper()
	c, err := nft.New()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range ts {
		if tb.Name == name {
			out = append(out, fmt.Sprintf("%d/%s", tb.Family, tb.Name))
		}
	}
	return out
}

// countRules counts the rules of every chain of the tables named name.
func countRules(t *testing.T, name string) map[string]int {
	t.Helper()
	c, err := nft.New()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != name {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		out[ch.Name] += len(rules)
	}
	return out
}
