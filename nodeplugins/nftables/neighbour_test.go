package nftables_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/nodeplugins/nftables"
)

// newSmallNetwork is newNetwork on a /30 of its own: one workload address
// besides the gateway, so a successor must get its predecessor's address.
func newSmallNetwork(t *testing.T, stateDir string) (*nftables.Network, nftables.Config) {
	t.Helper()
	requireRoot(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	cfg := nftables.Config{
		Subnet:      netip.MustParsePrefix(fmt.Sprintf("10.214.%d.%d/30", b[0], b[1]&0xfc)),
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

// steadyBridge keeps bridge as it is on a node with other workloads
// attached: a fixed hardware address, and carrier from a port of the test's
// own (a veth pair, removed when t ends). A bridge otherwise takes the
// lowest of its ports' addresses and loses carrier with its last port, and
// either flushes its neighbour entries; with other workloads attached
// neither happens, and a stale entry stays.
func steadyBridge(t *testing.T, bridge string) {
	t.Helper()
	port, peer := "bk"+bridge[2:], "bl"+bridge[2:]
	for _, args := range [][]string{
		{"link", "set", bridge, "address", "02:00:5e:10:00:01"},
		{"link", "add", port, "type", "veth", "peer", "name", peer},
		{"link", "set", port, "master", bridge, "up"},
		{"link", "set", peer, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		if args[1] == "add" {
			t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", port).Run() })
		}
	}
}

// getFromNode reports whether a GET from the node itself to addr:8080
// returns want (one second timeout).
func getFromNode(addr netip.Addr, want string) bool {
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr.String() + ":8080/")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(body)) == want
}

// reachableAtOnce reports whether the node reaches a's server within three
// one-second tries: a stale neighbour entry costs tens of seconds instead.
func reachableAtOnce(a nftables.Attachment, want string) bool {
	for range 3 {
		if getFromNode(a.Address, want) {
			return true
		}
	}
	return false
}

// workloadMAC is the hardware address of eth0 in a's namespace.
func workloadMAC(t *testing.T, a nftables.Attachment) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", a.NetNS, "-o", "link", "show", "eth0").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show eth0 in %s: %v: %s", a.NetNS, err, out)
	}
	f := strings.Fields(string(out))
	for i := range f[:len(f)-1] {
		if f[i] == "link/ether" {
			return f[i+1]
		}
	}
	t.Fatalf("no link/ether in %q", out)
	return ""
}

// neighbourMAC is the node's neighbour entry for addr on bridge: its
// hardware address, or "" when there is none (or it holds none).
func neighbourMAC(t *testing.T, bridge string, addr netip.Addr) string {
	t.Helper()
	out, err := exec.Command("ip", "neigh", "show", "to", addr.String(), "dev", bridge).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh show: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "lladdr" {
			return f[i+1]
		}
	}
	return ""
}

// TestSuccessorGetsAnotherAddress: a workload attached right after another
// was detached (a replica's successor) does not get the address just
// released, and the node reaches it at once.
func TestSuccessorGetsAnotherAddress(t *testing.T) {
	state := t.TempDir()
	n, cfg := newNetwork(t, state)
	steadyBridge(t, cfg.Bridge)
	a1 := attach(t, n, "wl_p1", "prj_s")
	serve(t, a1, "p1")
	if !reachableAtOnce(a1, "p1") {
		t.Fatalf("the node does not reach %s at %s", a1.WorkloadID, a1.Address)
	}
	if err := n.Detach(t.Context(), a1.WorkloadID); err != nil {
		t.Fatal(err)
	}
	a2 := attach(t, n, "wl_p2", "prj_s")
	if a2.Address == a1.Address {
		t.Errorf("successor got %s, the address its predecessor released a moment ago", a2.Address)
	}
	serve(t, a2, "p2")
	if !reachableAtOnce(a2, "p2") {
		t.Errorf("the node does not reach the successor at %s within three tries", a2.Address)
	}

	// The released address stays out of use across a restart of the network
	// plugin: the next attachment after it is not it either.
	if err := n.Detach(t.Context(), a2.WorkloadID); err != nil {
		t.Fatal(err)
	}
	n2 := open(t, cfg)
	a3 := attach(t, n2, "wl_p3", "prj_s")
	if a3.Address == a2.Address || a3.Address == a1.Address {
		t.Errorf("after a restart, a new workload got %s; released were %s and %s", a3.Address, a1.Address, a2.Address)
	}
}

// TestReusedAddressHasNoStaleNeighbour: when a successor must reuse its
// predecessor's address (a pool of one), attaching it removes the node's
// neighbour entry holding the predecessor's hardware address, so the node
// reaches the successor at once instead of after the entry fails.
func TestReusedAddressHasNoStaleNeighbour(t *testing.T) {
	n, cfg := newSmallNetwork(t, t.TempDir())
	steadyBridge(t, cfg.Bridge)
	a1 := attach(t, n, "wl_q1", "prj_q")
	serve(t, a1, "q1")
	if !reachableAtOnce(a1, "q1") {
		t.Fatalf("the node does not reach %s at %s", a1.WorkloadID, a1.Address)
	}
	old := workloadMAC(t, a1)
	if got := neighbourMAC(t, cfg.Bridge, a1.Address); got != old {
		t.Fatalf("neighbour entry of %s = %q; want the workload's %s (the test relies on it)", a1.Address, got, old)
	}
	if err := n.Detach(t.Context(), a1.WorkloadID); err != nil {
		t.Fatal(err)
	}
	a2 := attach(t, n, "wl_q2", "prj_q")
	if a2.Address != a1.Address {
		t.Fatalf("successor got %s in a pool of one address (%s)", a2.Address, a1.Address)
	}
	if got := neighbourMAC(t, cfg.Bridge, a2.Address); got == old {
		t.Errorf("after attaching the successor, the node's neighbour entry of %s still holds the predecessor's %s", a2.Address, old)
	}
	serve(t, a2, "q2")
	if !reachableAtOnce(a2, "q2") {
		t.Errorf("the node does not reach the successor at %s within three tries", a2.Address)
	}
}
