package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/dirlock"
)

// gatewayStopGrace is how long a gateway being taken over has to stop after
// SIGTERM before it is killed.
const gatewayStopGrace = 10 * time.Second

// foreignGateway is a gateway process launched for another data directory
// whose listen addresses overlap this berthd's.
type foreignGateway struct {
	pid     int
	dataDir string // the data directory its --state-dir lies in
	addr    string // the address of ours it holds
}

// takeOverGatewayAddrs runs before the gateway is launched or reattached: it
// makes sure no gateway of another data directory holds the addresses this
// berthd's gateway listens on. The case is a core restored beside the data
// directory it was backed up from (a backup leaves plugins/ out, and a gateway
// outlives its berthd on purpose; docs/operating.md section 5.2). Such a gateway
// is stopped when it is verifiably that directory's (its reattach record
// names it), the directory holds this cluster's id and its berthd is not
// running (its lock is free, and held here meanwhile, so it cannot start
// while its gateway is stopped). Otherwise startup is refused with an error
// that names the process and what to do. A port held by anything else is left
// to the gateway's own listen error.
func takeOverGatewayAddrs(ctx context.Context, cfg Config, log *slog.Logger) error {
	addrs := []string{cfg.GatewayListen}
	if cfg.GatewayTLSListen != "" && cfg.GatewayTLSListen != "off" {
		addrs = append(addrs, cfg.GatewayTLSListen)
	}
	own, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("gateway: data directory: %w", err)
	}
	for _, g := range findForeignGateways(own, addrs) {
		if err := takeOverGateway(ctx, own, g, log); err != nil {
			return err
		}
	}
	return nil
}

// takeOverGateway stops g when it is a gateway of a stopped core of this
// cluster, or explains why it will not.
func takeOverGateway(ctx context.Context, own string, g foreignGateway, log *slog.Logger) error {
	held := fmt.Sprintf("the gateway listen address %s is held by a Berth gateway (pid %d) of data directory %s", g.addr, g.pid, g.dataDir)
	rec, ok, err := plugin.ReadRecorded(filepath.Join(g.dataDir, "plugins", gatewayReattachFile))
	if err != nil || !ok || rec.PID != g.pid {
		return fmt.Errorf("%s, which that directory does not record as its gateway; stop it (kill %d) and start berthd again", held, g.pid)
	}
	ours, err1 := readClusterID(own)
	theirs, err2 := readClusterID(g.dataDir)
	if err1 != nil || err2 != nil || ours != theirs {
		return fmt.Errorf("%s, which belongs to another cluster; stop that gateway (kill %d) or give this berthd another --gateway-listen", held, g.pid)
	}
	release, holder, err := dirlock.Hold(g.dataDir)
	if errors.Is(err, dirlock.ErrLocked) {
		who := ""
		if holder > 0 {
			who = fmt.Sprintf(" (pid %d)", holder)
		}
		return fmt.Errorf("the gateway listen address %s is held by the gateway (pid %d) of the berthd that still runs on data directory %s%s: "+
			"stop that berthd first, as two cores of one cluster must not run at once; this berthd then stops that gateway and starts its own",
			g.addr, g.pid, g.dataDir, who)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", held, err)
	}
	defer func() { _ = release() }()
	log.Warn("stopping the gateway of another data directory of this cluster, whose berthd is stopped, to take over its listen address",
		"pid", g.pid, "data_dir", g.dataDir, "addr", g.addr)
	if err := rec.Stop(ctx, gatewayStopGrace); err != nil {
		return fmt.Errorf("%s: %w", held, err)
	}
	return nil
}

// readClusterID reads the cluster id of a data directory without creating it.
func readClusterID(dataDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dataDir, identity.ClusterIDFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(raw)), nil
}

// findForeignGateways lists the gateway processes (found by their command
// lines: a --state-dir DIR/plugins/gateway) of data directories other than
// own whose --listen or --tls-listen overlaps one of addrs.
func findForeignGateways(own string, addrs []string) []foreignGateway {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []foreignGateway
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		state := flagValue(args, "state-dir")
		if state == "" || filepath.Base(state) != gatewayStateDir || filepath.Base(filepath.Dir(state)) != "plugins" {
			continue
		}
		if !filepath.IsAbs(state) {
			// Relative to the working directory berthd gave it.
			cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
			if err != nil {
				continue
			}
			state = filepath.Join(cwd, state)
		}
		dir := filepath.Dir(filepath.Dir(state))
		if dir == own {
			continue // this data directory's own gateway: reattached or replaced as usual
		}
		for _, theirs := range []string{flagValue(args, "listen"), flagValue(args, "tls-listen")} {
			for _, a := range addrs {
				if theirs != "" && addrsOverlap(theirs, a) {
					out = append(out, foreignGateway{pid: pid, dataDir: dir, addr: a})
				}
			}
		}
	}
	return out
}

// flagValue returns the value of --name (or -name) in args, as "--name v" or
// "--name=v"; "" when absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// addrsOverlap reports whether listeners on TCP addresses a and b conflict:
// the same port, and the same IP or either unspecified.
func addrsOverlap(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil {
		return false
	}
	na, err1 := net.LookupPort("tcp", pa)
	nb, err2 := net.LookupPort("tcp", pb)
	if err1 != nil || err2 != nil || na != nb || na == 0 {
		return false
	}
	if ha == hb {
		return true
	}
	ia, erra := netip.ParseAddr(ha)
	ib, errb := netip.ParseAddr(hb)
	wild := func(h string, ip netip.Addr, err error) bool { return h == "" || err == nil && ip.IsUnspecified() }
	if wild(ha, ia, erra) || wild(hb, ib, errb) {
		return true
	}
	return erra == nil && errb == nil && ia.Unmap() == ib.Unmap()
}
