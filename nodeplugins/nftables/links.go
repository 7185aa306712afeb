package nftables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ip runs iproute2's ip with args (and stdin for -batch), returning its
// combined output in the error.
func ip(ctx context.Context, stdin string, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// ensureBridge makes the bridge with addr, up.
func ensureBridge(ctx context.Context, name string, addr netip.Prefix) error {
	if !linkExists(name) {
		if err := ip(ctx, "", "link", "add", name, "type", "bridge"); err != nil {
			return err
		}
	}
	if err := ip(ctx, "", "addr", "replace", addr.String(), "dev", name); err != nil {
		return err
	}
	// Published ports answer on 127.0.0.1 too: packets from the loopback
	// address may be routed out of the bridge (after DNAT and masquerade).
	if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", name, "route_localnet"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("allow published ports on the loopback address: %w", err)
	}
	return ip(ctx, "", "link", "set", name, "up")
}

// ensureWorkloadLinks makes a's namespace and veth pair, configured. A part
// already in place is kept.
func ensureWorkloadLinks(ctx context.Context, bridge string, a Attachment, bits int, gw netip.Addr) error {
	if _, err := os.Stat(a.NetNSPath()); err != nil {
		if err := ip(ctx, "", "netns", "add", a.NetNS); err != nil {
			return err
		}
	}
	if !linkExists(a.HostVeth) {
		peer := "bp" + a.HostVeth[2:]
		if err := ip(ctx, "", "link", "add", a.HostVeth, "type", "veth", "peer", "name", peer, "netns", a.NetNS); err != nil {
			return err
		}
		inside := fmt.Sprintf("link set %s name eth0\naddr add %s dev eth0\nlink set eth0 up\nlink set lo up\nroute add default via %s dev eth0\n",
			peer, netip.PrefixFrom(a.Address, bits), gw)
		if err := ip(ctx, inside, "-n", a.NetNS, "-batch", "-"); err != nil {
			return err
		}
	}
	return ip(ctx, "", "link", "set", a.HostVeth, "master", bridge, "up")
}

// removeWorkloadLinks deletes a's namespace (which deletes the veth end in
// it, and so the pair) and the node end if it is still there.
func removeWorkloadLinks(ctx context.Context, a Attachment) error {
	if _, err := os.Stat(a.NetNSPath()); err == nil {
		if err := ip(ctx, "", "netns", "delete", a.NetNS); err != nil {
			return err
		}
	}
	return removeLink(ctx, a.HostVeth)
}

// removeLink deletes a link; an absent one is success.
func removeLink(ctx context.Context, name string) error {
	if !linkExists(name) {
		return nil
	}
	if err := ip(ctx, "", "link", "delete", name); err != nil && linkExists(name) {
		return err // still there: a real failure, not the pair vanishing meanwhile
	}
	return nil
}

// flushNeighbour removes the node's neighbour entries of addr on dev (none
// is success), so the next packet to addr asks for its hardware address
// again instead of using one a previous holder of addr had.
func flushNeighbour(ctx context.Context, dev string, addr netip.Addr) error {
	return ip(ctx, "", "neigh", "flush", "to", addr.String(), "dev", dev)
}
