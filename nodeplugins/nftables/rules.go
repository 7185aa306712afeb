package nftables

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Bits of conntrack state and status the rules test.
const (
	ctStateEstablished = 1 << 1 // NF_CT_STATE_BIT(IP_CT_ESTABLISHED)
	ctStateRelated     = 1 << 2 // NF_CT_STATE_BIT(IP_CT_RELATED)
	ctStatusDstNAT     = 1 << 5 // IPS_DST_NAT
	rtnLocal           = 2      // RTN_LOCAL, the fib address type of a local address
)

// loopback is the node's loopback network.
var loopback = netip.MustParsePrefix("127.0.0.0/8")

// ifname is an interface name as nftables compares it: NUL-padded to 16 bytes.
func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func u32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// ipv4Only matches IPv4 packets in an inet table.
func ipv4Only() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// inPrefix matches an IPv4 source (src true) or destination address in p.
func inPrefix(p netip.Prefix, src bool) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	m := make([]byte, 4)
	for i := 0; i < p.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	network := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network[:]},
	}
}

func ctBits(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: u32(bits), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: u32(0)},
	}
}

func iif(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	verdictReturn = []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}
	verdictDrop   = []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
)

// addGuard queues the guard table: a forward chain that only ever drops.
// Traffic to the address pool is dropped unless it comes from the bridge (the
// main table decides that), is a published port (destination NAT) or belongs
// to an established connection. Re-applying replaces the chain's rules in
// the same batch.
func addGuard(c *nft.Conn, table, bridge string, pool netip.Prefix) {
	t := c.AddTable(&nft.Table{Family: nft.TableFamilyINet, Name: table})
	// Add-then-delete-then-add: the batch works whether or not the table exists.
	c.DelTable(t)
	t = c.AddTable(&nft.Table{Family: nft.TableFamilyINet, Name: table})
	policy := nft.ChainPolicyAccept
	ch := c.AddChain(&nft.Chain{Name: "forward", Table: t, Type: nft.ChainTypeFilter,
		Hooknum: nft.ChainHookForward, Priority: nft.ChainPriorityRef(-10), Policy: &policy})
	c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: cat(iif(bridge), verdictReturn)})
	c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: cat(ipv4Only(), inPrefix(pool, false), ctBits(expr.CtKeySTATUS, ctStatusDstNAT), verdictReturn)})
	c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: cat(ipv4Only(), inPrefix(pool, false), ctBits(expr.CtKeySTATE, ctStateEstablished|ctStateRelated), verdictReturn)})
	c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: cat(ipv4Only(), inPrefix(pool, false), verdictDrop)})
}

// addRuleset queues the main tables, rebuilt whole from atts: an inet table
// with the published ports (DNAT from any local address, for packets from
// outside and from the node itself) and masquerade of the pool's egress, and
// a bridge table that isolates projects (a frame from a workload's veth may
// only leave through a veth of the same project).
func addRuleset(c *nft.Conn, table, bridge string, pool netip.Prefix, atts []Attachment) error {
	t := c.AddTable(&nft.Table{Family: nft.TableFamilyINet, Name: table})
	c.DelTable(t)
	t = c.AddTable(&nft.Table{Family: nft.TableFamilyINet, Name: table})
	published := c.AddChain(&nft.Chain{Name: "published", Table: t})
	for _, hook := range []struct {
		name string
		hook *nft.ChainHook
	}{{"prerouting", nft.ChainHookPrerouting}, {"output", nft.ChainHookOutput}} {
		ch := c.AddChain(&nft.Chain{Name: hook.name, Table: t, Type: nft.ChainTypeNAT, Hooknum: hook.hook, Priority: nft.ChainPriorityNATDest})
		c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: u32(rtnLocal)},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: published.Name},
		}})
	}
	post := c.AddChain(&nft.Chain{Name: "postrouting", Table: t, Type: nft.ChainTypeNAT, Hooknum: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
	// A published port reached from the node's loopback address: the reply
	// must come back to the node, so the source becomes the gateway.
	c.AddRule(&nft.Rule{Table: t, Chain: post, Exprs: cat(ipv4Only(), inPrefix(loopback, true), ctBits(expr.CtKeySTATUS, ctStatusDstNAT),
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
			&expr.Masq{},
		})})
	c.AddRule(&nft.Rule{Table: t, Chain: post, Exprs: cat(ipv4Only(), inPrefix(pool, true),
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(bridge)},
			&expr.Masq{},
		})})
	for _, a := range atts {
		addr := a.Address.As4()
		for _, p := range a.Ports {
			proto := byte(unix.IPPROTO_TCP)
			if p.Protocol == "udp" {
				proto = unix.IPPROTO_UDP
			}
			c.AddRule(&nft.Rule{Table: t, Chain: published, UserData: []byte(a.WorkloadID), Exprs: cat(ipv4Only(), []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(p.HostPort)},
				&expr.Immediate{Register: 1, Data: addr[:]},
				&expr.Immediate{Register: 2, Data: be16(p.ContainerPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
			})})
		}
	}

	bt := c.AddTable(&nft.Table{Family: nft.TableFamilyBridge, Name: table})
	c.DelTable(bt)
	bt = c.AddTable(&nft.Table{Family: nft.TableFamilyBridge, Name: table})
	policy := nft.ChainPolicyAccept
	fwd := c.AddChain(&nft.Chain{Name: "forward", Table: bt, Type: nft.ChainTypeFilter,
		Hooknum: nft.ChainHookForward, Priority: nft.ChainPriorityFilter, Policy: &policy})
	groups := map[string][]nft.SetElement{}
	var order []string
	for _, a := range atts {
		if _, ok := groups[a.Group]; !ok {
			order = append(order, a.Group)
		}
		groups[a.Group] = append(groups[a.Group], nft.SetElement{Key: ifname(a.HostVeth)})
	}
	for i, g := range order {
		set := &nft.Set{Table: bt, Name: "group" + strconv.Itoa(i), KeyType: nft.TypeIFName}
		if err := c.AddSet(set, groups[g]); err != nil {
			return err
		}
		c.AddRule(&nft.Rule{Table: bt, Chain: fwd, UserData: []byte(g), Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	return nil
}

// delTables queues the removal of the named tables (created first, so the
// batch works whether they exist or not).
func delTables(c *nft.Conn, names ...string) {
	for _, n := range names {
		for _, fam := range []nft.TableFamily{nft.TableFamilyINet, nft.TableFamilyBridge} {
			t := c.AddTable(&nft.Table{Family: fam, Name: n})
			c.DelTable(t)
		}
	}
}
