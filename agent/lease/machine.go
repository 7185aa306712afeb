// Package lease is the node side of leases and fencing tokens: a pure state
// machine of the node's leases (held, uncertain, expired, revoked) and the
// manager that persists it, renews leases and self-fences (docs/node-protocol.md section 8).
package lease

import (
	"fmt"
	"slices"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Mono is an instant on the node's monotonic clock, as a duration since an
// arbitrary origin. The agent uses CLOCK_BOOTTIME, which keeps counting
// while the machine is suspended, so a suspend can only shorten a validity.
type Mono = time.Duration

// FenceState is where the fence of a lease's current token stands.
type FenceState string

// Fence states of a lease row.
const (
	FenceNone    FenceState = ""        // no fence for the current token
	FenceRunning FenceState = "fencing" // stopping the bound workloads
	FenceDone    FenceState = "fenced"  // every bound workload confirmed stopped or gone
	FenceFailed  FenceState = "failed"  // a forced stop could not be confirmed
)

// Fence reasons (docs/node-protocol.md section 8.5), carried in the fence
// record and in node.fenced / node.fence_failed.
const (
	ReasonExpired = "expired"
	ReasonRevoked = "revoked"
)

// maxPendingPerLease bounds the unanswered renewals remembered per lease;
// an answer to an older one is then ignored (it would not extend anything).
const maxPendingPerLease = 8

// Lease is the node's view of one lease. ValidUntil is meaningful only when
// HasValidity; NextRenew only for expiring leases held or uncertain.
type Lease struct {
	LeaseID      string
	ResourceType string
	ResourceID   string
	Mode         node.LeaseMode
	Token        int64
	State        node.LeaseState
	Duration     time.Duration // D, expiring only
	HasValidity  bool          // reports whether ValidUntil holds a validity
	ValidUntil   Mono          // t_send + D - M of the newest answered renewal
	NextRenew    Mono          // when the next lease_renew is due
	Fence        FenceState    // the newest fence ordered for the lease
	FenceReason  string        // ReasonExpired or ReasonRevoked while Fence is set
	FenceSeq     uint64        // the Seq of the newest fence ordered
}

// active reports whether l is held or uncertain.
func (l *Lease) active() bool {
	return l.State == node.LeaseHeld || l.State == node.LeaseUncertain
}

// FailedFence is a fence whose forced stop could not be confirmed. It stays
// until an operator acknowledges it (command fence_ack); while any remains
// the node is failed and starts no stateful workload.
type FailedFence struct {
	LeaseID     string
	Token       int64
	WorkloadIDs []string
	At          time.Time
}

// FenceOrder asks the I/O layer to fence a lease: stop every stateful
// workload bound to LeaseID, then report [Machine.FenceDone] with Token.
type FenceOrder struct {
	LeaseID    string
	ResourceID string
	Token      int64
	Reason     string
	Seq        uint64 // orders the fences of one machine; the I/O layer runs a lease's fences in Seq order
}

// Effects is what one input asks of the I/O layer, in this order:
//
//  1. Persist every lease named in Changed (and drop those in Removed).
//  2. Start every fence in Fences, concurrently.
//  3. When RenewNow, send the due renewals ([Machine.DueRenewals]) now.
//
// Refused is set when the input was refused: the node answers error
// bad_message with it, and the input changed nothing (the other effects then
// come only from validities that ran out at that instant).
type Effects struct {
	Refused  string
	Changed  []string
	Fences   []FenceOrder
	RenewNow bool
}

func (e *Effects) changed(id string) {
	if !slices.Contains(e.Changed, id) {
		e.Changed = append(e.Changed, id)
	}
}

type pendingRenew struct {
	id     string
	token  int64
	sentAt Mono
}

// Machine is the node's leases as a pure state machine: every input takes
// the current instant and returns [Effects]; it does no I/O, keeps no clock
// and starts no goroutine. Not safe for concurrent use: the caller
// serialises inputs.
type Machine struct {
	leases  map[string]*Lease
	pending map[string][]pendingRenew // unanswered renewals by lease id, oldest first
	failed  map[string]FailedFence    // unacknowledged failed fences by lease id
	marked  bool                      // the node's failed mark
	seq     uint64                    // the last FenceOrder.Seq given
}

// order records a new fence of l for reason and returns its order.
func (m *Machine) order(l *Lease, reason string) FenceOrder {
	m.seq++
	l.Fence, l.FenceReason, l.FenceSeq = FenceRunning, reason, m.seq
	return FenceOrder{LeaseID: l.LeaseID, ResourceID: l.ResourceID, Token: l.Token, Reason: reason, Seq: m.seq}
}

// NewMachine returns a machine with no lease.
func NewMachine() *Machine {
	return &Machine{leases: map[string]*Lease{}, pending: map[string][]pendingRenew{}, failed: map[string]FailedFence{}}
}

// Lease returns a copy of the lease id and whether there is one.
func (m *Machine) Lease(id string) (Lease, bool) {
	l, ok := m.leases[id]
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

// Leases returns copies of every lease, by lease id.
func (m *Machine) Leases() []Lease {
	out := make([]Lease, 0, len(m.leases))
	for _, l := range m.leases {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Lease) int {
		switch {
		case a.LeaseID < b.LeaseID:
			return -1
		case a.LeaseID > b.LeaseID:
			return 1
		}
		return 0
	})
	return out
}

// Failed reports whether the node is failed: a failed fence is recorded and
// not acknowledged, or the failed mark is set.
func (m *Machine) Failed() bool { return m.marked || len(m.failed) > 0 }

// FailedFences returns the unacknowledged failed fences, by lease id.
func (m *Machine) FailedFences() []FailedFence {
	out := make([]FailedFence, 0, len(m.failed))
	for _, f := range m.failed {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b FailedFence) int {
		switch {
		case a.LeaseID < b.LeaseID:
			return -1
		case a.LeaseID > b.LeaseID:
			return 1
		}
		return 0
	})
	return out
}

// highest returns the highest token the node saw for l's resource or lease id.
func (m *Machine) highest(leaseID, resType, resID string) (int64, bool) {
	var h int64
	seen := false
	for _, l := range m.leases {
		if l.LeaseID == leaseID || (resID != "" && l.ResourceType == resType && l.ResourceID == resID) {
			if !seen || l.Token > h {
				h = l.Token
			}
			seen = true
		}
	}
	return h, seen
}

// Grant applies a lease_grant (docs/node-protocol.md sections 5.12 and 8.4).
// re is the envelope's re: the id of the lease_renew it answers, if any.
//
//   - A token lower than the highest seen for the resource, or equal to it
//     while the node does not hold the lease under that token, an expiring
//     duration below [node.MinLeaseDuration], or a malformed body is refused.
//   - A local grant with a higher token is held on receipt; repeated with the
//     same token while held it changes nothing.
//   - An expiring grant answering an outstanding renewal with the same token
//     makes the lease held, valid until that renewal's send time + D - M.
//   - Any other expiring grant with a higher token records the token, puts
//     the lease in uncertain (keeping, never extending, a validity it had
//     while held or uncertain) and asks for a renewal at once. With the same
//     token it changes nothing but makes sure a renewal is outstanding.
func (m *Machine) Grant(g node.LeaseGrant, re string, now Mono) Effects {
	var e Effects
	m.expire(now, &e)
	refuse := func(format string, args ...any) Effects {
		e.Refused = fmt.Sprintf(format, args...)
		return e
	}
	switch {
	case g.LeaseID == "":
		return refuse("lease_grant has no lease_id")
	case g.Mode != node.LeaseLocal && g.Mode != node.LeaseExpiring:
		return refuse("lease_grant mode %q is neither local nor expiring", g.Mode)
	case g.Mode == node.LeaseExpiring && time.Duration(g.DurationMS)*time.Millisecond < node.MinLeaseDuration:
		return refuse("lease_grant duration_ms %d is below the %d ms floor", g.DurationMS, node.MinLeaseDuration.Milliseconds())
	}
	h, seen := m.highest(g.LeaseID, g.ResourceType, g.ResourceID)
	l := m.leases[g.LeaseID]
	if seen && g.FencingToken < h {
		return refuse("lease_grant token %d is lower than %d, the highest this node saw for %s", g.FencingToken, h, g.LeaseID)
	}
	if seen && g.FencingToken == h {
		if l == nil || l.Token != g.FencingToken || !l.active() {
			return refuse("lease_grant token %d equals the highest this node saw for %s, which it does not hold under that token", g.FencingToken, g.LeaseID)
		}
		if l.Mode == node.LeaseLocal || g.Mode == node.LeaseLocal {
			return e // a repeated local grant changes nothing
		}
		if p, ok := m.takePending(l.LeaseID, re, g.FencingToken); ok {
			d := time.Duration(g.DurationMS) * time.Millisecond
			vu := p.sentAt + d - node.LeaseMargin(d)
			if now >= vu {
				return e // answered too late: the validity it proves is over
			}
			l.State = node.LeaseHeld
			l.Duration = d
			if !l.HasValidity || vu > l.ValidUntil {
				l.ValidUntil, l.HasValidity = vu, true
			}
			l.NextRenew = max(l.NextRenew, p.sentAt+d/3)
			e.changed(l.LeaseID)
			return e
		}
		if len(m.pending[l.LeaseID]) == 0 && l.NextRenew > now {
			l.NextRenew = now
			e.changed(l.LeaseID)
			e.RenewNow = true
		}
		return e
	}
	// A new lease or a higher token.
	if l == nil {
		l = &Lease{LeaseID: g.LeaseID}
		m.leases[g.LeaseID] = l
	}
	keepValidity := l.active() && l.HasValidity && l.Mode == node.LeaseExpiring
	l.ResourceType, l.ResourceID, l.Mode, l.Token = g.ResourceType, g.ResourceID, g.Mode, g.FencingToken
	if l.Fence != FenceRunning {
		// A running fence of the older token keeps its state so that
		// nothing starts before it ends ([Machine.CanStart]).
		l.Fence, l.FenceReason = FenceNone, ""
	}
	delete(m.pending, l.LeaseID)
	if g.Mode == node.LeaseLocal {
		l.State, l.Duration, l.HasValidity, l.ValidUntil, l.NextRenew = node.LeaseHeld, 0, false, 0, 0
		e.changed(l.LeaseID)
		return e
	}
	l.State = node.LeaseUncertain
	l.Duration = time.Duration(g.DurationMS) * time.Millisecond
	if !keepValidity {
		l.HasValidity, l.ValidUntil = false, 0
	}
	l.NextRenew = now
	e.changed(l.LeaseID)
	e.RenewNow = true
	return e
}

// takePending removes and returns the outstanding renewal id of lease with
// token, and every older one.
func (m *Machine) takePending(leaseID, id string, token int64) (pendingRenew, bool) {
	if id == "" {
		return pendingRenew{}, false
	}
	ps := m.pending[leaseID]
	for i, p := range ps {
		if p.id == id && p.token == token {
			m.pending[leaseID] = slices.Clone(ps[i+1:])
			return p, true
		}
	}
	return pendingRenew{}, false
}

// Revoke applies a lease_revoke (docs/node-protocol.md section 5.13). A
// token lower than the lease's current one is refused. Otherwise the lease
// becomes revoked under the revoke's token (when higher) and a fence is
// ordered, unless the lease was already fenced under that same token
// (alreadyFenced: answer ok at once). known is false for a lease the node has
// no row for: nothing is bound to it, answer ok.
func (m *Machine) Revoke(r node.LeaseRevoke, now Mono) (e Effects, known, alreadyFenced bool) {
	m.expire(now, &e)
	if r.LeaseID == "" {
		e.Refused = "lease_revoke has no lease_id"
		return e, false, false
	}
	l, ok := m.leases[r.LeaseID]
	if !ok {
		return e, false, false
	}
	if r.FencingToken < l.Token {
		e.Refused = fmt.Sprintf("lease_revoke token %d is lower than the node's token %d of %s", r.FencingToken, l.Token, r.LeaseID)
		return e, true, false
	}
	wasFenced := !l.active() && l.Fence == FenceDone && r.FencingToken == l.Token
	l.Token = r.FencingToken
	l.State = node.LeaseRevoked
	l.HasValidity, l.ValidUntil, l.NextRenew = false, 0, 0
	delete(m.pending, l.LeaseID)
	e.changed(l.LeaseID)
	if wasFenced {
		return e, true, true
	}
	e.Fences = append(e.Fences, m.order(l, ReasonRevoked))
	return e, true, false
}

// Tick moves every expiring lease whose validity ran out at now to expired
// and orders its fence, and sets RenewNow when a renewal is due. It returns
// the effects and the instant of the next deadline (an expiry, or a renewal
// not yet due), zero when none.
func (m *Machine) Tick(now Mono) (Effects, Mono) {
	var e Effects
	m.expire(now, &e)
	for _, l := range m.leases {
		if l.Mode == node.LeaseExpiring && l.active() && l.NextRenew <= now {
			e.RenewNow = true
		}
	}
	return e, m.nextDeadline(now)
}

// nextDeadline is the earliest validity end, or renewal time still ahead of
// now: a renewal already due waits for a session, which reports it sent.
func (m *Machine) nextDeadline(now Mono) Mono {
	var next Mono
	set := func(t Mono) {
		if next == 0 || t < next {
			next = t
		}
	}
	for _, l := range m.leases {
		if l.Mode != node.LeaseExpiring || !l.active() {
			continue
		}
		if l.HasValidity {
			set(l.ValidUntil)
		}
		if l.NextRenew > now {
			set(l.NextRenew)
		}
	}
	return next
}

// expire moves leases whose validity is over at now to expired.
func (m *Machine) expire(now Mono, e *Effects) {
	for _, l := range m.leases {
		if l.Mode != node.LeaseExpiring || !l.active() || !l.HasValidity || now < l.ValidUntil {
			continue
		}
		l.State = node.LeaseExpired
		l.HasValidity, l.ValidUntil, l.NextRenew = false, 0, 0
		delete(m.pending, l.LeaseID)
		e.changed(l.LeaseID)
		e.Fences = append(e.Fences, m.order(l, ReasonExpired))
	}
}

// Renewal is one lease_renew to send.
type Renewal = node.LeaseRenew

// DueRenewals returns the renewals due at now: expiring leases, held or
// uncertain, whose next renewal time has come. Local leases are never renewed.
func (m *Machine) DueRenewals(now Mono) []Renewal {
	var out []Renewal
	for _, l := range m.Leases() {
		if l.Mode == node.LeaseExpiring && l.active() && l.NextRenew <= now {
			out = append(out, Renewal{LeaseID: l.LeaseID, FencingToken: l.Token})
		}
	}
	return out
}

// RenewSent records that the lease_renew with envelope id msgID for r is
// about to be written at now (call it before the write, so that an answer
// can never arrive first). The next renewal is due D/3 later.
func (m *Machine) RenewSent(msgID string, r Renewal, now Mono) {
	l, ok := m.leases[r.LeaseID]
	if !ok || l.Token != r.FencingToken || !l.active() || l.Mode != node.LeaseExpiring {
		return
	}
	ps := append(m.pending[l.LeaseID], pendingRenew{id: msgID, token: r.FencingToken, sentAt: now})
	if len(ps) > maxPendingPerLease {
		ps = ps[len(ps)-maxPendingPerLease:]
	}
	m.pending[l.LeaseID] = ps
	l.NextRenew = now + l.Duration/3
}

// FenceDone records the end of the fence o: ok when
// every bound workload is confirmed stopped or gone, otherwise a failed
// fence naming workloads that may still run, which marks the node failed.
// Only the end of the newest fence ordered for the lease ends its fencing
// state; the end of an older one still records a failure.
// It returns the effects (the lease to persist).
func (m *Machine) FenceDone(o FenceOrder, ok bool, workloads []string, at time.Time) Effects {
	var e Effects
	leaseID := o.LeaseID
	if !ok {
		m.failed[leaseID] = FailedFence{LeaseID: leaseID, Token: o.Token, WorkloadIDs: slices.Clone(workloads), At: at}
		m.marked = true
	}
	l, found := m.leases[leaseID]
	if !found || l.Fence != FenceRunning || l.FenceSeq != o.Seq {
		return e // an older fence: the newest one still runs
	}
	if ok {
		l.Fence = FenceDone
	} else {
		l.Fence = FenceFailed
	}
	e.changed(leaseID)
	return e
}

// Ack applies command fence_ack (docs/node-protocol.md section 5.17): it
// clears the failed fences of the listed leases (an unlisted or unknown id
// is not an error) and the failed mark once none remains. It returns the
// lease ids whose failed fences it cleared and those that remain.
func (m *Machine) Ack(leaseIDs []string) (cleared, remaining []string) {
	for _, id := range leaseIDs {
		if _, ok := m.failed[id]; ok {
			delete(m.failed, id)
			cleared = append(cleared, id)
		}
	}
	for _, f := range m.FailedFences() {
		remaining = append(remaining, f.LeaseID)
	}
	if len(remaining) == 0 {
		m.marked = false
	}
	return cleared, remaining
}

// CanStart reports whether a stateful workload bound to leaseID with token
// may start at now (docs/node-protocol.md section 6.4): the node is not
// failed, the lease is held, its token equals token, its validity (when
// expiring) has not run out and no fence of it is running. reason says why
// not.
func (m *Machine) CanStart(leaseID string, token int64, now Mono) (ok bool, reason string) {
	if m.Failed() {
		return false, "the node is failed after a failed fence; an operator must acknowledge it"
	}
	l, found := m.leases[leaseID]
	switch {
	case leaseID == "":
		return false, "the stateful workload names no lease"
	case !found:
		return false, fmt.Sprintf("lease %s is not held by this node", leaseID)
	case l.State != node.LeaseHeld:
		return false, fmt.Sprintf("lease %s is %s, not held", leaseID, l.State)
	case l.Token != token:
		return false, fmt.Sprintf("lease %s is held with token %d, the workload wants %d", leaseID, l.Token, token)
	case l.Fence == FenceRunning:
		return false, fmt.Sprintf("lease %s is still being fenced", leaseID)
	case l.Mode == node.LeaseExpiring && (!l.HasValidity || now >= l.ValidUntil):
		return false, fmt.Sprintf("lease %s has no validity left", leaseID)
	}
	return true, ""
}

// Restore loads persisted leases and failed fences after an agent restart
// (docs/node-protocol.md section 8.4). sameBoot reports whether the kernel
// boot id equals the one the leases were stored under; now is on the same
// clock as their ValidUntil. Local leases come back as they were. An
// expiring lease held or uncertain comes back uncertain with its validity
// and a renewal due at once when sameBoot and validity is left, otherwise
// expired with a fence ordered. A lease whose fence was running when the
// agent stopped gets its fence ordered again. marked is the node's
// persisted failed mark.
func (m *Machine) Restore(leases []Lease, failed []FailedFence, marked, sameBoot bool, now Mono) Effects {
	var e Effects
	for _, in := range leases {
		l := in
		m.leases[l.LeaseID] = &l
		if l.Mode == node.LeaseExpiring && l.active() {
			if sameBoot && l.HasValidity && now < l.ValidUntil {
				l.State = node.LeaseUncertain
				l.NextRenew = now
				e.RenewNow = true
			} else {
				l.State = node.LeaseExpired
				l.HasValidity, l.ValidUntil, l.NextRenew = false, 0, 0
				l.Fence, l.FenceReason = FenceRunning, ReasonExpired
			}
			e.changed(l.LeaseID)
		}
		if l.Fence == FenceRunning {
			reason := l.FenceReason
			if reason == "" {
				reason = ReasonExpired
			}
			e.Fences = append(e.Fences, m.order(&l, reason))
		}
	}
	for _, f := range failed {
		m.failed[f.LeaseID] = f
	}
	m.marked = marked || len(failed) > 0
	slices.SortFunc(e.Fences, func(a, b FenceOrder) int {
		switch {
		case a.LeaseID < b.LeaseID:
			return -1
		case a.LeaseID > b.LeaseID:
			return 1
		}
		return 0
	})
	return e
}

// Hello returns the leases for hello (docs/node-protocol.md section 5.1).
func (m *Machine) Hello() []node.HelloLease {
	var out []node.HelloLease
	for _, l := range m.Leases() {
		out = append(out, node.HelloLease{LeaseID: l.LeaseID, ResourceType: l.ResourceType, ResourceID: l.ResourceID,
			Mode: l.Mode, FencingToken: l.Token, State: l.State})
	}
	return out
}
