package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"testing"

	"google.golang.org/grpc"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/network"
	"github.com/berthhq/berth/abi/pluginapi"
	networkv1 "github.com/berthhq/berth/abi/proto/network/v1"
)

// DefaultNetworkSubnet is the pool the network suite sets up when
// NetworkConfig.Subnet is empty.
const DefaultNetworkSubnet = "10.213.0.0/24"

// NetworkConfig says which node-network plugin to check (abi/network,
// docs/plugins.md section 7). Exactly one of Binary and Factory is set. The
// plugin changes the node (namespaces, links, rules), so the suite needs the
// privileges the plugin needs, and removes what each case made: it detaches
// every attachment at the end of the case, then calls Teardown.
type NetworkConfig struct {
	// Binary is a built plugin. Each case launches it afresh over go-plugin
	// (subprocess mode), with a fresh state directory.
	Binary string
	// Args returns the binary's arguments for a case's state directory;
	// nil means none.
	Args func(stateDir string) []string
	// Factory returns a fresh in-process plugin on stateDir, served over a
	// real gRPC connection. Cases that need a process are skipped.
	Factory func(stateDir string) (network.Network, error)
	// Subnet is the pool every case sets up, an IPv4 prefix with room for
	// three workloads; empty means DefaultNetworkSubnet. It must not be in
	// use on the node.
	Subnet string
	// Teardown, when set, runs at the end of each case on its state
	// directory, after the suite detached every attachment, to remove what
	// the plugin keeps by design (a bridge, tables). nil leaves them.
	Teardown func(stateDir string) error
	// Stderr receives the plugin's stderr in subprocess mode; nil discards it.
	Stderr io.Writer
}

func (c NetworkConfig) validate() error {
	if (c.Binary == "") == (c.Factory == nil) {
		return errors.New("conformance: set exactly one of Binary and Factory")
	}
	if _, err := netip.ParsePrefix(c.subnet()); err != nil {
		return fmt.Errorf("conformance: Subnet: %w", err)
	}
	return nil
}

func (c NetworkConfig) subnet() string {
	if c.Subnet == "" {
		return DefaultNetworkSubnet
	}
	return c.Subnet
}

var networkKind = kind{
	cookie:  pluginapi.NetworkCookieValue,
	name:    pluginapi.NetworkPluginName,
	version: network.APIVersion,
	newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
		return network.NewClient(life, conn)
	},
	register: func(s *grpc.Server, impl any) {
		networkv1.RegisterNodeNetworkServer(s, network.NewServer(impl.(network.Network)))
	},
}

// RunNetwork runs the node-network suite as subtests of t.
func RunNetwork(t *testing.T, cfg NetworkConfig) {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	runTesting(t, cfg.cases())
}

// CheckNetwork runs the node-network suite outside `go test` and returns
// the report; the error is for an invalid cfg only.
func CheckNetwork(ctx context.Context, cfg NetworkConfig) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return runReport(ctx, "network", cfg.Binary, cfg.cases()), nil
}

// NetworkCaseNames lists the node-network suite's cases in order, without
// the launch case of a binary.
func NetworkCaseNames() []string {
	var out []string
	for _, c := range networkCases(NetworkConfig{}) {
		out = append(out, c.name)
	}
	return out
}

func (cfg NetworkConfig) cases() []testCase {
	if cfg.Binary == "" {
		return networkCases(cfg)
	}
	return gated(func(t T) error {
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(t.TempDir())
		}
		return probe(t, cfg.Binary, args, networkKind, cfg.Stderr)
	}, networkCases(cfg))
}

// netSession is one launched network plugin of a case, set up on the pool.
type netSession struct {
	in   *instance
	n    *network.Client
	gw   netip.Addr
	next int
}

// launch starts the plugin on stateDir and sets it up on the pool, as the
// agent does. With owner set, the end of the case detaches every attachment
// through this session and runs cfg.Teardown on stateDir.
func (cfg NetworkConfig) launch(t T, stateDir string, owner bool) *netSession {
	t.Helper()
	var in *instance
	var err error
	if cfg.Factory != nil {
		var impl network.Network
		if impl, err = cfg.Factory(stateDir); err != nil {
			t.Fatalf("%s", failure("create the plugin in process", "a plugin", gotErr(err)))
		}
		if c, ok := impl.(interface{ Close() error }); ok {
			t.Cleanup(func() { _ = c.Close() })
		}
		in, err = startInProcess(t, impl, networkKind)
	} else {
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(stateDir)
		}
		in, err = startBinary(t, cfg.Binary, args, networkKind, networkKind.cookie, cfg.Stderr)
	}
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	s := &netSession{in: in, n: in.raw.(*network.Client)}
	if owner {
		t.Cleanup(func() { cfg.cleanup(t, s, stateDir) })
	}
	ctx, cancel := context.WithTimeout(t.Context(), callBudget)
	defer cancel()
	r, err := s.n.Setup(ctx, &network.SetupRequest{Subnet: cfg.subnet()})
	if err != nil {
		t.Fatalf("%s", failure("Setup "+cfg.subnet()+" after launch", "success", gotErr(err)))
	}
	if s.gw, err = netip.ParseAddr(r.Gateway); err != nil {
		t.Fatalf("%s", failure("Setup "+cfg.subnet()+" after launch", "the gateway in force, an address", fmt.Sprintf("%q", r.Gateway)))
	}
	return s
}

// cleanup detaches what the case left and tears the network down. It runs
// after the case, so it reports through Logf only.
func (cfg NetworkConfig) cleanup(t T, s *netSession, stateDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), callBudget)
	defer cancel()
	if list, err := s.n.List(ctx); err == nil {
		for _, a := range list {
			if err := s.n.Detach(ctx, &network.DetachRequest{WorkloadID: a.WorkloadID,
				Mutation: pluginapi.Mutation{IdempotencyKey: "conformance-cleanup-" + a.WorkloadID, FencingToken: math.MaxUint32}}); err != nil {
				t.Logf("cleanup: Detach %s: %v", a.WorkloadID, err)
			}
		}
	}
	if cfg.Teardown != nil {
		if err := cfg.Teardown(stateDir); err != nil {
			t.Logf("cleanup: teardown: %v", err)
		}
	}
}

func (s *netSession) ctx(t T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callBudget)
	t.Cleanup(cancel)
	return ctx
}

func (s *netSession) key(p string) string {
	s.next++
	return fmt.Sprintf("conformance-%s-%d", p, s.next)
}

func (s *netSession) attach(t T, id, group string, token uint64, ports ...network.Port) (*network.Attachment, error) {
	t.Helper()
	return s.n.Attach(s.ctx(t), &network.AttachRequest{WorkloadID: id, Group: group, Ports: ports,
		Mutation: pluginapi.Mutation{IdempotencyKey: s.key("attach"), FencingToken: token}})
}

func (s *netSession) mustAttach(t T, pool netip.Prefix, id, group string, token uint64, ports ...network.Port) *network.Attachment {
	t.Helper()
	did := fmt.Sprintf("Attach %s (group %s, token %d)", id, group, token)
	a, err := s.attach(t, id, group, token, ports...)
	if err != nil {
		t.Fatalf("%s", failure(did, "an attachment", gotErr(err)))
	}
	checkAttachment(t, did, pool, s.gw, a, id, group, ports)
	return a
}

// checkAttachment checks what Attach answered against what was asked.
func checkAttachment(t T, did string, pool netip.Prefix, gw netip.Addr, a *network.Attachment, id, group string, ports []network.Port) {
	t.Helper()
	if a == nil {
		t.Fatalf("%s", failure(did, "an attachment", "none"))
	}
	if a.WorkloadID != id || a.Group != group {
		t.Errorf("%s", failure(did, "workload "+id+" in group "+group, fmt.Sprintf("workload %s in group %s", a.WorkloadID, a.Group)))
	}
	addr, err := netip.ParseAddr(a.Address)
	if err != nil || !pool.Contains(addr) || addr == gw || addr == pool.Masked().Addr() {
		t.Errorf("%s", failure(did, fmt.Sprintf("an address of %s other than the network and the gateway %s", pool, gw), fmt.Sprintf("%q", a.Address)))
	}
	if _, err := os.Stat(a.NetNSPath); a.NetNSPath == "" || err != nil {
		t.Errorf("%s", failure(did, "the path of an existing network namespace", fmt.Sprintf("%q (%v)", a.NetNSPath, err)))
	}
	if !slices.Equal(normPorts(a.Ports), normPorts(ports)) {
		t.Errorf("%s", failure(did, fmt.Sprintf("ports %v", ports), fmt.Sprintf("%v", a.Ports)))
	}
}

func normPorts(ps []network.Port) []network.Port {
	out := make([]network.Port, len(ps))
	for i, p := range ps {
		if p.Protocol == "" {
			p.Protocol = "tcp"
		}
		out[i] = p
	}
	return out
}

func (s *netSession) list(t T) map[string]*network.Attachment {
	t.Helper()
	list, err := s.n.List(s.ctx(t))
	if err != nil {
		t.Fatalf("%s", failure("List", "the attachments", gotErr(err)))
	}
	out := map[string]*network.Attachment{}
	for i, a := range list {
		if i > 0 && list[i-1].WorkloadID >= a.WorkloadID {
			t.Errorf("%s", failure("List", "attachments sorted by workload id, each once", fmt.Sprintf("%s after %s", a.WorkloadID, list[i-1].WorkloadID)))
		}
		out[a.WorkloadID] = a
	}
	return out
}

func networkCases(cfg NetworkConfig) []testCase {
	pool, _ := netip.ParsePrefix(cfg.subnet()) // checked by validate
	needProcess := func(t T) {
		if cfg.Factory != nil {
			t.Skipf("needs a plugin process; run the suite on the binary")
		}
	}
	web := network.Port{HostPort: 18080, ContainerPort: 8080, Protocol: "tcp"}
	return []testCase{
		{"handshake", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir(), true)
			if s.in.negotiated != network.APIVersion {
				t.Errorf("%s", failure("the go-plugin handshake", fmt.Sprintf("API version %d negotiated", network.APIVersion), fmt.Sprintf("version %d", s.in.negotiated)))
			}
			if _, err := startBinary(t, cfg.Binary, cfg.args(t), networkKind, pluginapi.RuntimeCookieValue, nil); err == nil {
				t.Errorf("%s", failure("a handshake with the runtime drivers' cookie", "the plugin refuses another kind's cookie", "the handshake completed"))
			}
		}},
		{"describe", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			d, err := s.n.Describe(s.ctx(t))
			if err != nil {
				t.Fatalf("%s", failure("Describe", "a description", gotErr(err)))
			}
			if !dnsLabel.MatchString(d.Name) {
				t.Errorf("%s", failure("Describe", "a name that is a DNS label", fmt.Sprintf("name %q", d.Name)))
			}
			if d.Version == "" {
				t.Errorf("%s", failure("Describe", "a version", "none"))
			}
			if !slices.Contains(d.APIVersions, s.in.negotiated) {
				t.Errorf("%s", failure("Describe", fmt.Sprintf("API versions listing the negotiated %d", s.in.negotiated), fmt.Sprintf("%v", d.APIVersions)))
			}
		}},
		{"health", func(t T) { checkHealth(t, cfg.launch(t, t.TempDir(), true).n) }},
		{"setup_idempotent", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			if !pool.Contains(s.gw) {
				t.Errorf("%s", failure("Setup "+pool.String(), "a gateway in the pool", s.gw.String()))
			}
			r, err := s.n.Setup(s.ctx(t), &network.SetupRequest{Subnet: pool.String()})
			if err != nil {
				t.Fatalf("%s", failure("Setup "+pool.String()+" a second time", "success", gotErr(err)))
			}
			if r.Gateway != s.gw.String() {
				t.Errorf("%s", failure("Setup "+pool.String()+" a second time", "the same gateway "+s.gw.String(), r.Gateway))
			}
		}},
		{"attach_list", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			a := s.mustAttach(t, pool, "wl_conf_a", "prj_a", 1, web)
			b := s.mustAttach(t, pool, "wl_conf_b", "prj_b", 1)
			if a.Address == b.Address {
				t.Errorf("%s", failure("Attach two workloads", "two addresses", "both "+a.Address))
			}
			got := s.list(t)
			if len(got) != 2 || got[a.WorkloadID] == nil || got[b.WorkloadID] == nil || got[a.WorkloadID].Address != a.Address {
				t.Errorf("%s", failure("List after two Attach calls", "wl_conf_a at "+a.Address+" and wl_conf_b", fmt.Sprintf("%v", keysOf(got))))
			}
		}},
		{"attach_idempotent", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			req := &network.AttachRequest{WorkloadID: "wl_conf_a", Group: "prj_a", Ports: []network.Port{web},
				Mutation: pluginapi.Mutation{IdempotencyKey: s.key("attach"), FencingToken: 1}}
			first, err := s.n.Attach(s.ctx(t), req)
			if err != nil {
				t.Fatalf("%s", failure("Attach wl_conf_a", "an attachment", gotErr(err)))
			}
			again, err := s.n.Attach(s.ctx(t), req)
			if err != nil || again.Address != first.Address || again.NetNSPath != first.NetNSPath {
				t.Errorf("%s", failure("Attach wl_conf_a again with the same idempotency key", "the recorded attachment at "+first.Address, readAttach(again, err)))
			}
			// A new request for the same workload keeps its address and
			// replaces its group's ports.
			moved := s.mustAttach(t, pool, "wl_conf_a", "prj_a", 1)
			if moved.Address != first.Address {
				t.Errorf("%s", failure("Attach wl_conf_a again without ports, with a new key", "the same address "+first.Address, moved.Address))
			}
		}},
		{"stale_fencing_token", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			a := s.mustAttach(t, pool, "wl_conf_a", "prj_a", 10, web)
			if _, err := s.attach(t, "wl_conf_a", "prj_other", 5); err == nil {
				t.Errorf("%s", failure("Attach wl_conf_a to another group with fencing token 5 after 10", "a refusal of code stale_fencing_token", "success"))
			} else if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Attach wl_conf_a to another group with fencing token 5 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			err := s.n.Detach(s.ctx(t), &network.DetachRequest{WorkloadID: "wl_conf_a", Mutation: pluginapi.Mutation{IdempotencyKey: s.key("detach"), FencingToken: 4}})
			if err == nil {
				t.Errorf("%s", failure("Detach wl_conf_a with fencing token 4 after 10", "a refusal of code stale_fencing_token", "success"))
			} else if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Detach wl_conf_a with fencing token 4 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			got := s.list(t)[a.WorkloadID]
			if got == nil || got.Group != "prj_a" || got.Address != a.Address || !slices.Equal(normPorts(got.Ports), normPorts(a.Ports)) {
				t.Errorf("%s", failure("List after the refused Attach and Detach", fmt.Sprintf("wl_conf_a as attached with token 10: group prj_a at %s, ports %v", a.Address, a.Ports), readAttach(got, nil)))
			}
			if _, err := os.Stat(a.NetNSPath); err != nil {
				t.Errorf("%s", failure("look at wl_conf_a's namespace after the refused Detach", "it exists", err.Error()))
			}
		}},
		{"detach", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			a := s.mustAttach(t, pool, "wl_conf_a", "prj_a", 1, web)
			detach := func(id string) error {
				return s.n.Detach(s.ctx(t), &network.DetachRequest{WorkloadID: id, Mutation: pluginapi.Mutation{IdempotencyKey: s.key("detach"), FencingToken: 2}})
			}
			if err := detach("wl_conf_a"); err != nil {
				t.Fatalf("%s", failure("Detach wl_conf_a", "success", gotErr(err)))
			}
			if _, err := os.Stat(a.NetNSPath); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s", failure("look at wl_conf_a's namespace after Detach", "it is gone", fmt.Sprintf("%s: %v", a.NetNSPath, err)))
			}
			if got := s.list(t); len(got) != 0 {
				t.Errorf("%s", failure("List after Detach", "no attachment", fmt.Sprintf("%v", keysOf(got))))
			}
			if err := detach("wl_conf_a"); err != nil {
				t.Errorf("%s", failure("Detach wl_conf_a again, now absent", "success", gotErr(err)))
			}
			if err := detach("wl_conf_never"); err != nil {
				t.Errorf("%s", failure("Detach a workload never attached", "success", gotErr(err)))
			}
		}},
		{"setup_other_pool", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			s.mustAttach(t, pool, "wl_conf_a", "prj_a", 1)
			other := otherPool(pool)
			_, err := s.n.Setup(s.ctx(t), &network.SetupRequest{Subnet: other.String()})
			if abierrors.CodeOf(err) != abierrors.ValidationFailed {
				t.Errorf("%s", failure("Setup "+other.String()+" while pool "+pool.String()+" holds an attachment", "a refusal of code validation_failed", gotErr(err)))
			}
		}},
		{"deadline", func(t T) {
			s := cfg.launch(t, t.TempDir(), true)
			checkDeadline(t, func(ctx context.Context) error {
				_, err := s.n.List(ctx)
				return err
			})
		}},
		{"crash_mid_call", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir(), true)
			checkCrash(t, s.in, s.n, func(ctx context.Context) error {
				_, err := s.n.List(ctx)
				return err
			})
		}},
		{"durable_allocations", func(t T) {
			needProcess(t)
			dir := t.TempDir()
			first := cfg.launch(t, dir, true) // its cleanup tears down what survives a failure
			a := first.mustAttach(t, pool, "wl_conf_a", "prj_a", 7, web)
			if err := first.in.crash(); err != nil {
				t.Fatalf("kill the plugin: %v", err)
			}
			<-first.n.Done()
			s := cfg.launch(t, dir, true)
			got := s.list(t)[a.WorkloadID]
			if got == nil || got.Address != a.Address {
				t.Errorf("%s", failure("List after a kill and relaunch", "wl_conf_a at "+a.Address, readAttach(got, nil)))
			}
			if _, err := s.attach(t, "wl_conf_a", "prj_a", 6); !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("after a relaunch, Attach wl_conf_a with fencing token 6 after 7", "a refusal of code stale_fencing_token", gotErr(err)))
			}
		}},
	}
}

func (cfg NetworkConfig) args(t T) []string {
	if cfg.Args == nil {
		return nil
	}
	return cfg.Args(t.TempDir())
}

// otherPool is a pool of p's size right after p.
func otherPool(p netip.Prefix) netip.Prefix {
	a := p.Masked().Addr().As4()
	step := uint32(1) << (32 - p.Bits())
	n := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) + step
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), p.Bits())
}

func readAttach(a *network.Attachment, err error) string {
	if err != nil {
		return gotErr(err)
	}
	if a == nil {
		return "no attachment"
	}
	return fmt.Sprintf("workload %s in group %s at %s, ports %v", a.WorkloadID, a.Group, a.Address, a.Ports)
}

func keysOf(m map[string]*network.Attachment) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
