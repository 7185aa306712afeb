package proctest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Ports handed to tests come from outside the kernel's ephemeral range: a port
// that the kernel may give to an outgoing connection or to a bind of port 0 (a
// workload of the process driver, a test server, any client socket of a
// parallel test) can be taken between the moment a test learns it and the
// moment its server binds it. A port is also locked for this machine's test
// processes (a lock file per port under the temporary directory), so two test
// binaries running in parallel never hand out the same one.

// reservations keeps the lock files of the ports this process handed out open
// until it exits: closing one would release its port to another test process.
var reservations struct {
	sync.Mutex
	files []*os.File
}

// FreeAddr returns a loopback address ("127.0.0.1:port") nothing listens on now,
// whose port no outgoing connection and no other test process of this machine
// can take before the test binds it (ReserveAddr). It fails t when none is found.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := ReserveAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// ReserveAddr is FreeAddr for callers without a testing.TB: a loopback address
// whose port is free for TCP now, lies outside the kernel's ephemeral port range
// and stays reserved for this process until it exits.
func ReserveAddr() (string, error) { return reserve(false) }

// ReserveAddrTCPUDP is ReserveAddr for servers that bind the port for both TCP
// and UDP (a DNS server).
func ReserveAddrTCPUDP() (string, error) { return reserve(true) }

func reserve(udp bool) (string, error) {
	lo, hi := reservablePorts()
	dir := filepath.Join(os.TempDir(), "berth-test-ports")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("proctest: port locks: %w", err)
	}
	span := hi - lo
	start := rand.IntN(span)
	for i := range min(span, 4096) {
		port := lo + (start+i)%span
		f, ok := lockPort(dir, port)
		if !ok {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if !bindable(addr, udp) {
			_ = f.Close()
			continue
		}
		reservations.Lock()
		reservations.files = append(reservations.files, f)
		reservations.Unlock()
		return addr, nil
	}
	return "", errors.New("proctest: no free loopback port outside the ephemeral range")
}

// reservablePorts is the range [lo, hi) tests take ports from: the ports below
// the kernel's ephemeral range down to 10000, or those above it when the range
// starts too low to leave room.
func reservablePorts() (lo, hi int) {
	eLo, eHi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if a, err := strconv.Atoi(f[0]); err == nil {
				eLo = a
			}
			if a, err := strconv.Atoi(f[1]); err == nil {
				eHi = a
			}
		}
	}
	if eLo-10000 >= 2000 {
		return 10000, eLo
	}
	return eHi + 1, 65536
}

// lockPort takes the machine-wide lock of port without waiting.
func lockPort(dir string, port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return f, true
}

// bindable reports whether addr can be listened on now (for TCP, and for UDP
// too when udp is set).
func bindable(addr string, udp bool) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = ln.Close()
	if !udp {
		return true
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	_ = pc.Close()
	return true
}
