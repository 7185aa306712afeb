// Package nftables is the node network of container workloads: a bridge per
// node, a veth pair and network namespace per workload, project isolation,
// published ports and the address-pool guard, all in nftables.
//
// Layout (docs/plugins.md section 7):
//
//   - The bridge (Config.Bridge) holds the gateway address of the desired
//     state's network (Config.Subnet, Config.Gateway).
//   - Each workload gets a network namespace ("ip netns", under /run/netns),
//     a veth pair whose node end is a port of the bridge and whose other end
//     is eth0 inside the namespace, an address of the subnet and a default
//     route through the gateway. The container driver joins that namespace.
//   - nftables, one batch per change: an inet table with the published ports
//     (DNAT from any local address), masquerade of the pool's egress, and a
//     bridge table that lets a workload's frames leave only through ports of
//     the same isolation group (the project).
//   - The guard: a separate inet table that only drops, protecting the pool
//     from traffic that is neither a published port nor an established
//     connection. [Network.Guard] restores it, and must run at agent start
//     before any workload starts; it stays when the agent is down.
//
// Allocations (address, veth, namespace, ports per workload) are kept in one
// JSON file under Config.StateDir, written atomically, so a restarted agent
// keeps every workload's address. Addresses are handed out round robin (the
// cursor in a second file), so a released address is not reused at once, and
// Attach flushes the node's neighbour entries of the address it hands out.
//
// [Plugin] serves a Network as the node-network plugin contract (abi/network)
// for cmd/berth-plugin-nftables.
package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	nft "github.com/google/nftables"

	"github.com/berthhq/berth/internal/securefile"
)

// Defaults of [Config].
const (
	DefaultBridge      = "berth0"
	DefaultTablePrefix = "berth"
	// NetNSDir is where "ip netns" keeps named network namespaces.
	NetNSDir = "/run/netns"
)

// stateFile is the allocations file under Config.StateDir.
const stateFile = "network.json"

// poolFile keeps the pool's cursor under Config.StateDir: the address last
// handed out. It is a file of its own so that an older plugin, which reads
// only stateFile, still reads what this one writes.
const poolFile = "pool.json"

// poolState is the content of poolFile.
type poolState struct {
	// Last is the address most recently handed out; the next attachment
	// gets the first free address after it, wrapping around the pool.
	Last netip.Addr `json:"last"`
}

// ErrInvalid is returned (wrapped) for a configuration or request that
// cannot be applied: a bad subnet or gateway, a bad workload id, a host port
// already published by another workload, a full subnet.
var ErrInvalid = errors.New("berth network: invalid request")

// Config configures a Network.
type Config struct {
	// Subnet is the workload address pool (IPv4), from the desired state's
	// network.subnet. Required.
	Subnet netip.Prefix
	// Gateway is the bridge's address inside Subnet; the zero value means the
	// subnet's first address.
	Gateway netip.Addr
	// Bridge names the bridge; empty means DefaultBridge. At most 15 bytes.
	Bridge string
	// TablePrefix names the nftables tables: PREFIX (inet and bridge) and
	// PREFIX_guard (inet); empty means DefaultTablePrefix.
	TablePrefix string
	// StateDir holds the allocations file (created 0700). Required.
	StateDir string
	// Logger receives the network's logs; nil discards them.
	Logger *slog.Logger
}

// Port is one published port: HostPort on every local address of the node
// forwards to ContainerPort of the workload. Protocol is "tcp" (empty) or "udp".
type Port struct {
	HostPort      uint16 `json:"host_port"`
	ContainerPort uint16 `json:"container_port"`
	Protocol      string `json:"protocol,omitempty"`
}

// AttachRequest asks for a workload's network. Group is the isolation group
// (the project id): workloads reach each other only within a group.
type AttachRequest struct {
	WorkloadID string
	Group      string
	Ports      []Port
}

// Attachment is a workload's network as applied.
type Attachment struct {
	WorkloadID string     `json:"workload_id"`
	Group      string     `json:"group"`
	Address    netip.Addr `json:"address"`
	HostVeth   string     `json:"host_veth"`
	NetNS      string     `json:"netns"` // name under NetNSDir
	Ports      []Port     `json:"ports,omitempty"`
}

// NetNSPath is the path of the workload's network namespace, for
// runtime.StartRequest.NetworkNamespace.
func (a Attachment) NetNSPath() string { return filepath.Join(NetNSDir, a.NetNS) }

// Network is one node's container network. Safe for concurrent use.
type Network struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	atts map[string]Attachment // by workload id; mu must be held
	last netip.Addr            // the address last handed out, invalid when none; mu must be held
}

// New validates cfg, loads the allocations a previous agent left and returns
// the network. It changes nothing on the node: call [Network.Guard] then
// [Network.Ensure].
func New(cfg Config) (*Network, error) {
	if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 30 {
		return nil, fmt.Errorf("subnet %s: an IPv4 prefix of at most /30 is required: %w", cfg.Subnet, ErrInvalid)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if !cfg.Gateway.IsValid() {
		cfg.Gateway = cfg.Subnet.Addr().Next()
	}
	if !cfg.Subnet.Contains(cfg.Gateway) || cfg.Gateway == cfg.Subnet.Addr() {
		return nil, fmt.Errorf("gateway %s is not a host address of %s: %w", cfg.Gateway, cfg.Subnet, ErrInvalid)
	}
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if len(cfg.Bridge) > 15 {
		return nil, fmt.Errorf("bridge name %q is longer than 15 bytes: %w", cfg.Bridge, ErrInvalid)
	}
	if cfg.TablePrefix == "" {
		cfg.TablePrefix = DefaultTablePrefix
	}
	if cfg.StateDir == "" {
		return nil, errors.New("berth network: StateDir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("berth network: state directory: %w", err)
	}
	n := &Network{cfg: cfg, log: cfg.Logger, atts: map[string]Attachment{}}
	raw, err := os.ReadFile(filepath.Join(cfg.StateDir, stateFile))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("berth network: read allocations: %w", err)
	}
	if err == nil {
		var list []Attachment
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("berth network: allocations file: %w", err)
		}
		for _, a := range list {
			n.atts[a.WorkloadID] = a
		}
	}
	raw, err = os.ReadFile(filepath.Join(cfg.StateDir, poolFile))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("berth network: read the pool's cursor: %w", err)
	}
	if err == nil {
		var ps poolState
		if err := json.Unmarshal(raw, &ps); err != nil {
			return nil, fmt.Errorf("berth network: pool file: %w", err)
		}
		if cfg.Subnet.Contains(ps.Last) {
			n.last = ps.Last
		}
	}
	return n, nil
}

func (n *Network) guardTable() string { return n.cfg.TablePrefix + "_guard" }

// Guard applies (or re-applies) the deny-only guard of the address pool in
// one nftables batch. Idempotent; call it first at agent start, before any
// workload starts.
func (n *Network) Guard(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("guard: nftables: %w", err)
	}
	defer c.CloseLasting()
	addGuard(c, n.guardTable(), n.cfg.Bridge, n.cfg.Subnet)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("guard: apply: %w", err)
	}
	return nil
}

// Ensure makes the bridge (with the gateway address, up) and applies the
// ruleset of every known attachment in one batch. Idempotent; call it at
// agent start after Guard, and on every reconcile pass.
func (n *Network) Ensure(ctx context.Context) error {
	if err := ensureBridge(ctx, n.cfg.Bridge, netip.PrefixFrom(n.cfg.Gateway, n.cfg.Subnet.Bits())); err != nil {
		return fmt.Errorf("ensure bridge %s: %w", n.cfg.Bridge, err)
	}
	return n.Reapply(ctx)
}

// Reapply applies the ruleset of every known attachment again, in one
// nftables batch that replaces the tables atomically. Idempotent.
func (n *Network) Reapply(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.applyLocked()
}

// applyLocked rebuilds the main tables from n.atts in one batch. mu must be held.
func (n *Network) applyLocked() error {
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if err := addRuleset(c, n.cfg.TablePrefix, n.cfg.Bridge, n.cfg.Subnet, n.listLocked()); err != nil {
		return fmt.Errorf("build ruleset: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("apply ruleset: %w", err)
	}
	return nil
}

func (n *Network) listLocked() []Attachment {
	out := make([]Attachment, 0, len(n.atts))
	for _, a := range n.atts {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].WorkloadID < out[j].WorkloadID })
	return out
}

// Attachments returns every workload's attachment, sorted by workload id.
func (n *Network) Attachments() []Attachment {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listLocked()
}

// Attach gives a workload its network: namespace, veth pair, address and
// rules (one batch). Attaching an attached workload with the same group and
// ports returns its attachment; with other ports or group, its rules are
// replaced and its address kept. Errors wrap ErrInvalid for a bad request.
func (n *Network) Attach(ctx context.Context, req AttachRequest) (Attachment, error) {
	if req.WorkloadID == "" || req.Group == "" {
		return Attachment{}, fmt.Errorf("attach: workload id and group are required: %w", ErrInvalid)
	}
	for i := range req.Ports {
		if req.Ports[i].Protocol == "" {
			req.Ports[i].Protocol = "tcp"
		}
		if p := req.Ports[i].Protocol; p != "tcp" && p != "udp" {
			return Attachment{}, fmt.Errorf("attach %s: protocol %q: %w", req.WorkloadID, p, ErrInvalid)
		}
		if req.Ports[i].HostPort == 0 || req.Ports[i].ContainerPort == 0 {
			return Attachment{}, fmt.Errorf("attach %s: port 0: %w", req.WorkloadID, ErrInvalid)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range n.atts {
		if a.WorkloadID == req.WorkloadID {
			continue
		}
		for _, p := range a.Ports {
			for _, q := range req.Ports {
				if p.HostPort == q.HostPort && p.Protocol == q.Protocol {
					return Attachment{}, fmt.Errorf("attach %s: host port %d/%s is published by %s: %w", req.WorkloadID, q.HostPort, q.Protocol, a.WorkloadID, ErrInvalid)
				}
			}
		}
	}
	a, known := n.atts[req.WorkloadID]
	if !known {
		addr, err := n.freeAddressLocked()
		if err != nil {
			return Attachment{}, fmt.Errorf("attach %s: %w", req.WorkloadID, err)
		}
		sum := sha256.Sum256([]byte(n.cfg.Bridge + "/" + req.WorkloadID))
		h := hex.EncodeToString(sum[:])
		a = Attachment{WorkloadID: req.WorkloadID, Address: addr, HostVeth: "bv" + h[:12], NetNS: "berth-" + h[:16]}
		n.last = addr
	}
	a.Group = req.Group
	a.Ports = slices.Clone(req.Ports)
	// Record first, so that a crash before the links exist is cleaned up by Detach.
	n.atts[a.WorkloadID] = a
	if err := n.saveLocked(); err != nil {
		return Attachment{}, fmt.Errorf("attach %s: %w", req.WorkloadID, err)
	}
	if err := ensureWorkloadLinks(ctx, n.cfg.Bridge, a, n.cfg.Subnet.Bits(), n.cfg.Gateway); err != nil {
		return Attachment{}, fmt.Errorf("attach %s: %w", req.WorkloadID, err)
	}
	// The node may still hold a neighbour entry of the address with the
	// hardware address of the workload that had it before (or of this
	// workload's veth before it was made again): traffic from the node
	// would go to that address until the entry fails, tens of seconds.
	if err := flushNeighbour(ctx, n.cfg.Bridge, a.Address); err != nil {
		return Attachment{}, fmt.Errorf("attach %s: %w", req.WorkloadID, err)
	}
	if err := n.applyLocked(); err != nil {
		return Attachment{}, fmt.Errorf("attach %s: %w", req.WorkloadID, err)
	}
	n.log.Info("attached workload", "workload", a.WorkloadID, "address", a.Address, "group", a.Group, "ports", len(a.Ports))
	return a, nil
}

// freeAddressLocked returns the first free host address of the subnet
// after the one last handed out, wrapping around (round robin): an address
// just released is handed out again only once every other one was, so a
// replica's successor does not inherit its predecessor's address (and the
// stale neighbour entries of other hosts that talked to it). The gateway is
// never free. mu must be held.
func (n *Network) freeAddressLocked() (netip.Addr, error) {
	used := map[netip.Addr]bool{n.cfg.Gateway: true}
	for _, a := range n.atts {
		used[a.Address] = true
	}
	var hosts []netip.Addr // every host address: neither the network's nor the broadcast address
	for addr := n.cfg.Subnet.Addr().Next(); n.cfg.Subnet.Contains(addr.Next()); addr = addr.Next() {
		hosts = append(hosts, addr)
	}
	start := 0
	if i := slices.Index(hosts, n.last); i >= 0 {
		start = i + 1
	}
	for k := range hosts {
		if addr := hosts[(start+k)%len(hosts)]; !used[addr] {
			return addr, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("subnet %s is full: %w", n.cfg.Subnet, ErrInvalid)
}

// Detach removes a workload's rules (one batch), veth pair and namespace.
// Detaching an unknown workload is success.
func (n *Network) Detach(ctx context.Context, workloadID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.atts[workloadID]
	if !ok {
		return nil
	}
	delete(n.atts, workloadID)
	if err := n.applyLocked(); err != nil {
		n.atts[workloadID] = a
		return fmt.Errorf("detach %s: %w", workloadID, err)
	}
	if err := removeWorkloadLinks(ctx, a); err != nil {
		n.atts[workloadID] = a
		return fmt.Errorf("detach %s: %w", workloadID, err)
	}
	// Attach flushes it again; this only spares the node a dead entry.
	if err := flushNeighbour(ctx, n.cfg.Bridge, a.Address); err != nil {
		n.log.Warn("flush the neighbour entry of a detached workload", "workload", workloadID, "address", a.Address, "error", err)
	}
	if err := n.saveLocked(); err != nil {
		return fmt.Errorf("detach %s: %w", workloadID, err)
	}
	n.log.Info("detached workload", "workload", workloadID)
	return nil
}

// Teardown detaches every workload and removes the tables (guard included)
// and the bridge: what removing the node from Berth leaves behind is nothing.
// It goes on past a failure and returns every failure joined.
func (n *Network) Teardown(ctx context.Context) error {
	var errs []error
	for _, a := range n.Attachments() {
		if err := n.Detach(ctx, a.WorkloadID); err != nil {
			errs = append(errs, err)
		}
	}
	c, err := nft.New()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("teardown: nftables: %w", err))...)
	}
	defer c.CloseLasting()
	delTables(c, n.cfg.TablePrefix, n.guardTable())
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("teardown: remove tables: %w", err))
	}
	if err := removeLink(ctx, n.cfg.Bridge); err != nil {
		errs = append(errs, fmt.Errorf("teardown: %w", err))
	}
	return errors.Join(errs...)
}

// saveLocked writes the allocations and the pool's cursor, each file
// atomically. mu must be held.
func (n *Network) saveLocked() error {
	raw, err := json.MarshalIndent(n.listLocked(), "", "  ")
	if err != nil {
		return err
	}
	if err := n.writeLocked(stateFile, raw); err != nil {
		return err
	}
	if !n.last.IsValid() {
		return nil
	}
	raw, err = json.Marshal(poolState{Last: n.last})
	if err != nil {
		return err
	}
	return n.writeLocked(poolFile, raw)
}

// writeLocked replaces the file name under the state directory with raw,
// atomically and durably. mu must be held.
func (n *Network) writeLocked(name string, raw []byte) error {
	if err := securefile.WriteFile(filepath.Join(n.cfg.StateDir, name), raw); err != nil {
		return fmt.Errorf("save %s: %w", name, err)
	}
	return nil
}
