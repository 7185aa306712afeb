package proctest

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestReservedPortsStayOutOfTheEphemeralRange checks that reserved ports are distinct, outside the
// kernel's ephemeral range, and locked against every other taker on this machine.
func TestReservedPortsStayOutOfTheEphemeralRange(t *testing.T) {
	lo, hi := reservablePorts()
	seen := map[int]bool{}
	for range 50 {
		addr := FreeAddr(t)
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Fatalf("reserved port %d is outside [%d, %d)", port, lo, hi)
		}
		if seen[port] {
			t.Fatalf("port %d reserved twice", port)
		}
		seen[port] = true
		// Another process's lock attempt is a second open file description: it must fail.
		if f, ok := lockPort(filepath.Join(os.TempDir(), "berth-test-ports"), port); ok {
			_ = f.Close()
			t.Fatalf("port %d could be locked again while reserved", port)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("reserved %s cannot be listened on: %v", addr, err)
		}
		_ = ln.Close()
	}
}
