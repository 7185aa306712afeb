package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/berthhq/berth/sdk/client"
)

// relayNet is the network of the relay test, made by the test with iproute2 and nftables:
//
//	root namespace (berthd, the direct node)          10.X.1.1 ── veth ── 10.X.1.2
//	relay namespace (berth-relay; the nodes' router)   10.X.2.1 ── veth ── 10.X.2.2  node namespace a
//	                                                   10.X.3.1 ── veth ── 10.X.3.2  node namespace b
//
// The node namespaces route everything through the relay's namespace, which forwards (as the one
// host of a site allowed out would) until the test installs its firewall: an nftables forward
// chain whose policy is drop, so a node reaches the relay and nothing beyond it. X is picked per
// run among octets no address of this machine uses, and every name carries a random suffix, so
// two runs on one machine do not meet.
type relayNet struct {
	relayNS string
	nodeNS  [2]string
	rootIf  string // the root namespace's end of the core link
	octet   int
}

// coreIP is berthd's address on the core link (root namespace).
func (n *relayNet) coreIP() string { return fmt.Sprintf("10.%d.1.1", n.octet) }

// relayCoreIP is the relay's address on the core link.
func (n *relayNet) relayCoreIP() string { return fmt.Sprintf("10.%d.1.2", n.octet) }

// relayNodeIP is the relay's address on node i's link, the address that node dials.
func (n *relayNet) relayNodeIP(i int) string { return fmt.Sprintf("10.%d.%d.1", n.octet, i+2) }

// requireRoot fails t unless it runs as root: make test runs as root, and namespaces, veths and
// nftables need it.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes network namespaces, veth pairs and nftables rules: run it as root (make test does)")
	}
}

// ipCmd runs ip with args and fails t with its output when it fails.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newRelayNet makes the namespaces and links. Its cleanup, registered before any process of the
// test starts (so it runs after they are stopped), deletes the namespaces, which takes their
// veths, routes and nftables tables with them.
func newRelayNet(t *testing.T) *relayNet {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip (iproute2) is not installed: apt-get install iproute2 (make test installs it)")
	}
	var rb [3]byte
	if _, err := rand.Read(rb[:]); err != nil {
		t.Fatal(err)
	}
	id := binary.BigEndian.Uint16(rb[:2])
	n := &relayNet{relayNS: fmt.Sprintf("brr%04x", id), nodeNS: [2]string{fmt.Sprintf("bra%04x", id), fmt.Sprintf("brb%04x", id)},
		rootIf: fmt.Sprintf("brc%04x", id)}
	n.octet = freeOctet(t, int(rb[2]))
	t.Cleanup(func() {
		for _, ns := range []string{n.nodeNS[0], n.nodeNS[1], n.relayNS} {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Logf("ip netns del %s: %v %s", ns, err, out)
			}
		}
		// Gone with the relay namespace's end; deleted here in case that failed.
		_ = exec.Command("ip", "link", "del", n.rootIf).Run()
	})
	for _, ns := range []string{n.relayNS, n.nodeNS[0], n.nodeNS[1]} {
		ipCmd(t, "netns", "add", ns)
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	// The core link: root namespace to the relay's.
	peer := fmt.Sprintf("brs%04x", id)
	ipCmd(t, "link", "add", n.rootIf, "type", "veth", "peer", "name", peer, "netns", n.relayNS)
	ipCmd(t, "addr", "add", n.coreIP()+"/24", "dev", n.rootIf)
	ipCmd(t, "link", "set", n.rootIf, "up")
	ipCmd(t, "-n", n.relayNS, "addr", "add", n.relayCoreIP()+"/24", "dev", peer)
	ipCmd(t, "-n", n.relayNS, "link", "set", peer, "up")
	// The node links: the relay's namespace to each node's, the relay the nodes' default route.
	for i, ns := range n.nodeNS {
		rif, nif := fmt.Sprintf("br%c%04x", 'x'+i, id), fmt.Sprintf("bn%c%04x", 'x'+i, id)
		ipCmd(t, "-n", n.relayNS, "link", "add", rif, "type", "veth", "peer", "name", nif, "netns", ns)
		ipCmd(t, "-n", n.relayNS, "addr", "add", n.relayNodeIP(i)+"/24", "dev", rif)
		ipCmd(t, "-n", n.relayNS, "link", "set", rif, "up")
		ipCmd(t, "-n", ns, "addr", "add", fmt.Sprintf("10.%d.%d.2/24", n.octet, i+2), "dev", nif)
		ipCmd(t, "-n", ns, "link", "set", nif, "up")
		ipCmd(t, "-n", ns, "route", "add", "default", "via", n.relayNodeIP(i))
	}
	// The way back from the root namespace to the nodes, and forwarding in the relay's namespace:
	// without the firewall the nodes reach berthd, which is what the test proves first.
	ipCmd(t, "route", "add", fmt.Sprintf("10.%d.2.0/23", n.octet), "via", n.relayCoreIP(), "dev", n.rootIf)
	ipCmd(t, "netns", "exec", n.relayNS, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	return n
}

// freeOctet returns a second octet X in 100..199, starting at seed, such that no address of this
// machine is in 10.X.0.0/16.
func freeOctet(t *testing.T, seed int) int {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		x := 100 + (seed+i)%100
		_, block, _ := net.ParseCIDR(fmt.Sprintf("10.%d.0.0/16", x))
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && block.Contains(ipn.IP) {
				used = true
			}
		}
		if !used {
			return x
		}
	}
	t.Fatal("no free 10.X.0.0/16 for the relay test's links")
	return 0
}

// firewall installs, in the relay's namespace, an nftables table whose forward chain drops
// everything: the nodes reach the relay host and nothing beyond it.
func (n *relayNet) firewall(t *testing.T) {
	t.Helper()
	f, err := os.Open(filepath.Join("/run/netns", n.relayNS))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nft.New(nft.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatalf("nftables in %s: %v", n.relayNS, err)
	}
	tbl := c.AddTable(&nft.Table{Family: nft.TableFamilyINet, Name: "berth_e2e_site"})
	drop := nft.ChainPolicyDrop
	c.AddChain(&nft.Chain{Name: "forward", Table: tbl, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookForward,
		Priority: nft.ChainPriorityFilter, Policy: &drop})
	if err := c.Flush(); err != nil {
		t.Fatalf("nftables in %s: install the forward drop: %v", n.relayNS, err)
	}
}

// dialFrom opens a TCP connection to addr from inside network namespace ns and closes it: nil
// when it connected. The dialling goroutine's thread switches namespace and is never handed back
// to the runtime (it ends with the goroutine).
func dialFrom(ns, addr string, timeout time.Duration) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread, in the node's namespace, exits with us
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err == nil {
			_ = c.Close()
		}
		errc <- err
	}()
	return <-errc
}

// selfSignedCert writes a self-signed ECDSA certificate (its own CA, as berthd's generated one)
// for ips to dir/relay.crt and dir/relay.key (0600) and returns the paths and the certificate's
// pin (sha256:...).
func selfSignedCert(t *testing.T, dir string, ips ...string) (certPath, keyPath, pin string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "berth-relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "relay.crt"), filepath.Join(dir, "relay.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, client.Fingerprint(der)
}
