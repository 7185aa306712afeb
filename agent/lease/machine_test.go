package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berthhq/berth/abi/node"
)

const sec = time.Second

func expiring(id string, token, ms int64) node.LeaseGrant {
	return node.LeaseGrant{LeaseID: id, ResourceType: node.LeaseResourceService, ResourceID: "svc_" + id,
		Mode: node.LeaseExpiring, FencingToken: token, DurationMS: ms}
}

func local(id string, token int64) node.LeaseGrant {
	return node.LeaseGrant{LeaseID: id, ResourceType: node.LeaseResourceService, ResourceID: "svc_" + id,
		Mode: node.LeaseLocal, FencingToken: token}
}

// step is one input with what must hold after it, for lease "a".
type step struct {
	name    string
	do      func(m *Machine) Effects
	refused bool
	renew   bool
	fences  []FenceOrder
	state   node.LeaseState // "" skips
	token   int64           // 0 skips
	valid   Mono            // validity end; 0 skips, -1 means none
	failed  *bool
}

func grantAt(g node.LeaseGrant, re string, now Mono) func(*Machine) Effects {
	return func(m *Machine) Effects { return m.Grant(g, re, now) }
}

func renewSent(id string, token int64, now Mono) func(*Machine) Effects {
	return func(m *Machine) Effects {
		m.RenewSent(id, Renewal{LeaseID: "a", FencingToken: token}, now)
		return Effects{}
	}
}

func revokeAt(token int64, now Mono) func(*Machine) Effects {
	return func(m *Machine) Effects {
		e, _, _ := m.Revoke(node.LeaseRevoke{LeaseID: "a", FencingToken: token, Reason: node.RevokeMoved}, now)
		return e
	}
}

func tickAt(now Mono) func(*Machine) Effects {
	return func(m *Machine) Effects {
		e, _ := m.Tick(now)
		return e
	}
}

// fenceDone ends the newest fence ordered for lease a under token.
func fenceDone(token int64, ok bool) func(*Machine) Effects {
	return func(m *Machine) Effects {
		l, _ := m.Lease("a")
		return m.FenceDone(FenceOrder{LeaseID: "a", Token: token, Seq: l.FenceSeq}, ok, []string{"wl_1"}, time.Unix(0, 0))
	}
}

func bp(b bool) *bool { return &b }

// held15 takes lease a (D = 15 s, M = 1.5 s, token 7) to held with the
// renewal sent at 10 s: valid until 23.5 s, next renewal at 15 s.
var held15 = []step{
	{name: "first expiring grant", do: grantAt(expiring("a", 7, 15000), "", 10*sec), renew: true, state: node.LeaseUncertain, token: 7, valid: -1},
	{name: "renewal sent", do: renewSent("r1", 7, 10*sec), state: node.LeaseUncertain},
	{name: "renewal answered", do: grantAt(expiring("a", 7, 15000), "r1", 10*sec+200*time.Millisecond), state: node.LeaseHeld, token: 7, valid: 23500 * time.Millisecond},
}

func seq(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestMachineTransitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		steps []step
	}{
		{"local grant is held on receipt and never renewed", []step{
			{name: "grant", do: grantAt(local("a", 3), "", sec), state: node.LeaseHeld, token: 3, valid: -1},
			{name: "no renewal due", do: func(m *Machine) Effects {
				if r := m.DueRenewals(time.Hour); len(r) != 0 {
					t.Errorf("local lease renewals due: %v", r)
				}
				e, next := m.Tick(time.Hour)
				if next != 0 {
					t.Errorf("local lease has a deadline %v", next)
				}
				return e
			}, state: node.LeaseHeld},
		}},
		{"local grant repeated with the same token changes nothing", []step{
			{name: "grant", do: grantAt(local("a", 3), "", sec), state: node.LeaseHeld},
			{name: "again", do: grantAt(local("a", 3), "", 2*sec), state: node.LeaseHeld, token: 3},
		}},
		{"local grant with a lower token is refused", []step{
			{name: "grant", do: grantAt(local("a", 3), "", sec), state: node.LeaseHeld},
			{name: "lower", do: grantAt(local("a", 2), "", 2*sec), refused: true, state: node.LeaseHeld, token: 3},
		}},
		{"expiring first grant: uncertain, renew at once, held on the answer", held15},
		{"answer to an unknown renewal changes nothing", []step{
			held15[0], held15[1],
			{name: "wrong re", do: grantAt(expiring("a", 7, 15000), "r9", 11*sec), state: node.LeaseUncertain, valid: -1},
			{name: "no re", do: grantAt(expiring("a", 7, 15000), "", 11*sec), state: node.LeaseUncertain, valid: -1},
		}},
		{"an answer after its validity ended does not make the lease held", []step{
			held15[0], held15[1],
			{name: "late answer", do: grantAt(expiring("a", 7, 15000), "r1", 24*sec), state: node.LeaseUncertain, valid: -1},
		}},
		{"expiring duration below the floor is refused", []step{
			{name: "grant", do: grantAt(expiring("a", 7, 2999), "", sec), refused: true},
		}},
		{"renewal timing: every D/3 from the send time", seq(held15, []step{
			{name: "not yet due", do: func(m *Machine) Effects {
				if r := m.DueRenewals(15*sec - 1); len(r) != 0 {
					t.Errorf("renewal due before D/3: %v", r)
				}
				if r := m.DueRenewals(15 * sec); len(r) != 1 || r[0].FencingToken != 7 {
					t.Errorf("renewals at D/3 = %v, want one with token 7", r)
				}
				_, next := m.Tick(11 * sec)
				if next != 15*sec {
					t.Errorf("next deadline %v, want 15s", next)
				}
				// A due renewal waits for a session: the deadline is the expiry.
				if e, next := m.Tick(16 * sec); !e.RenewNow || next != 23500*time.Millisecond {
					t.Errorf("Tick with a renewal due = %v, next %v; want RenewNow and the expiry 23.5s", e.RenewNow, next)
				}
				return Effects{}
			}, state: node.LeaseHeld},
			{name: "renewed", do: renewSent("r2", 7, 15*sec)},
			{name: "answered", do: grantAt(expiring("a", 7, 15000), "r2", 15*sec+100*time.Millisecond), state: node.LeaseHeld, valid: 28500 * time.Millisecond},
		})},
		{"validity runs out: expired and fenced", seq(held15, []step{
			{name: "just before", do: tickAt(23500*time.Millisecond - 1), state: node.LeaseHeld},
			{name: "at valid_until", do: tickAt(23500 * time.Millisecond), state: node.LeaseExpired, valid: -1,
				fences: []FenceOrder{{LeaseID: "a", ResourceID: "svc_a", Token: 7, Reason: ReasonExpired}}},
			{name: "same token after expiry is refused", do: grantAt(expiring("a", 7, 15000), "", 24*sec), refused: true, state: node.LeaseExpired},
			{name: "fence done", do: fenceDone(7, true), state: node.LeaseExpired, failed: bp(false)},
			{name: "higher token after expiry", do: grantAt(expiring("a", 8, 15000), "", 25*sec), renew: true, state: node.LeaseUncertain, token: 8, valid: -1},
		})},
		{"higher-token grant while held keeps validity, never extends it", seq(held15, []step{
			{name: "higher", do: grantAt(expiring("a", 8, 15000), "", 12*sec), renew: true, state: node.LeaseUncertain, token: 8, valid: 23500 * time.Millisecond},
			{name: "answer of the old token's renewal is refused", do: grantAt(expiring("a", 7, 15000), "r1", 12*sec), refused: true, token: 8},
			{name: "renewal of the new token", do: renewSent("r3", 8, 13*sec)},
			{name: "answered", do: grantAt(expiring("a", 8, 15000), "r3", 13*sec), state: node.LeaseHeld, token: 8, valid: 26500 * time.Millisecond},
		})},
		{"uncertain lease expires at its kept validity", seq(held15, []step{
			{name: "higher", do: grantAt(expiring("a", 8, 15000), "", 12*sec), state: node.LeaseUncertain},
			{name: "no answer", do: tickAt(23500 * time.Millisecond), state: node.LeaseExpired, token: 8,
				fences: []FenceOrder{{LeaseID: "a", ResourceID: "svc_a", Token: 8, Reason: ReasonExpired}}},
		})},
		{"lower-token grant while held is refused and changes nothing", seq(held15, []step{
			{name: "lower", do: grantAt(expiring("a", 6, 15000), "", 12*sec), refused: true, state: node.LeaseHeld, token: 7, valid: 23500 * time.Millisecond},
		})},
		{"grant for another lease of the same resource with a lower token is refused", seq(held15, []step{
			{name: "other lease", do: func(m *Machine) Effects {
				g := expiring("b", 6, 15000)
				g.ResourceID = "svc_a"
				return m.Grant(g, "", 12*sec)
			}, refused: true, state: node.LeaseHeld},
		})},
		{"revoke with a lower token is refused", seq(held15, []step{
			{name: "lower", do: revokeAt(6, 12*sec), refused: true, state: node.LeaseHeld, token: 7, valid: 23500 * time.Millisecond},
		})},
		{"revoke with the current token fences", seq(held15, []step{
			{name: "revoke", do: revokeAt(7, 12*sec), state: node.LeaseRevoked, token: 7, valid: -1,
				fences: []FenceOrder{{LeaseID: "a", ResourceID: "svc_a", Token: 7, Reason: ReasonRevoked}}},
			{name: "no renewal of a revoked lease", do: func(m *Machine) Effects {
				if r := m.DueRenewals(time.Hour); len(r) != 0 {
					t.Errorf("renewals of a revoked lease: %v", r)
				}
				return Effects{}
			}},
			{name: "no start while fencing", do: func(m *Machine) Effects {
				if ok, _ := m.CanStart("a", 7, 12*sec); ok {
					t.Errorf("CanStart of a revoked lease")
				}
				return Effects{}
			}},
			{name: "fence done", do: fenceDone(7, true)},
			{name: "repeated revoke: already fenced", do: func(m *Machine) Effects {
				e, known, already := m.Revoke(node.LeaseRevoke{LeaseID: "a", FencingToken: 7}, 13*sec)
				if !known || !already || len(e.Fences) != 0 {
					t.Errorf("repeated revoke: known %v already %v fences %v", known, already, e.Fences)
				}
				return e
			}, state: node.LeaseRevoked},
		})},
		{"revoke with a higher token raises the token the next grant must beat", seq(held15, []step{
			{name: "revoke 9", do: revokeAt(9, 12*sec), state: node.LeaseRevoked, token: 9,
				fences: []FenceOrder{{LeaseID: "a", ResourceID: "svc_a", Token: 9, Reason: ReasonRevoked}}},
			{name: "grant 9 refused", do: grantAt(expiring("a", 9, 15000), "", 13*sec), refused: true, state: node.LeaseRevoked},
			{name: "grant 10 while the fence runs", do: grantAt(expiring("a", 10, 15000), "", 13*sec), renew: true, state: node.LeaseUncertain, token: 10},
			{name: "renew", do: renewSent("r5", 10, 13*sec)},
			{name: "held", do: grantAt(expiring("a", 10, 15000), "r5", 13*sec), state: node.LeaseHeld},
			{name: "no start before the old fence ended", do: func(m *Machine) Effects {
				if ok, _ := m.CanStart("a", 10, 13*sec); ok {
					t.Errorf("CanStart while the fence of token 9 runs")
				}
				return Effects{}
			}},
			{name: "old fence done", do: fenceDone(9, true), state: node.LeaseHeld},
			{name: "start allowed", do: func(m *Machine) Effects {
				if ok, why := m.CanStart("a", 10, 13*sec); !ok {
					t.Errorf("CanStart after the fence: %s", why)
				}
				return Effects{}
			}},
		})},
		{"revoke of an unknown lease", []step{
			{name: "revoke", do: func(m *Machine) Effects {
				e, known, _ := m.Revoke(node.LeaseRevoke{LeaseID: "zz", FencingToken: 1}, sec)
				if known || len(e.Fences) != 0 || e.Refused != "" {
					t.Errorf("revoke of unknown lease: known %v effects %+v", known, e)
				}
				return e
			}},
		}},
		{"failed fence marks the node failed until every failure is acknowledged", seq(held15, []step{
			{name: "revoke", do: revokeAt(7, 12*sec), state: node.LeaseRevoked,
				fences: []FenceOrder{{LeaseID: "a", ResourceID: "svc_a", Token: 7, Reason: ReasonRevoked}}},
			{name: "fence failed", do: fenceDone(7, false), failed: bp(true)},
			{name: "no stateful start at all", do: func(m *Machine) Effects {
				m.Grant(local("b", 1), "", 13*sec)
				if ok, _ := m.CanStart("b", 1, 13*sec); ok {
					t.Errorf("CanStart on a failed node")
				}
				return Effects{}
			}, failed: bp(true)},
			{name: "ack of another lease", do: func(m *Machine) Effects {
				cleared, remaining := m.Ack([]string{"zz"})
				if len(cleared) != 0 || !cmp.Equal(remaining, []string{"a"}) {
					t.Errorf("ack zz: cleared %v remaining %v", cleared, remaining)
				}
				return Effects{}
			}, failed: bp(true)},
			{name: "ack", do: func(m *Machine) Effects {
				cleared, remaining := m.Ack([]string{"a", "zz"})
				if !cmp.Equal(cleared, []string{"a"}) || len(remaining) != 0 {
					t.Errorf("ack a: cleared %v remaining %v", cleared, remaining)
				}
				return Effects{}
			}, failed: bp(false), state: node.LeaseRevoked},
			{name: "still nothing stateful under the fenced token", do: func(m *Machine) Effects {
				if ok, _ := m.CanStart("a", 7, 14*sec); ok {
					t.Errorf("CanStart of the acknowledged, revoked lease")
				}
				if ok, why := m.CanStart("b", 1, 14*sec); !ok {
					t.Errorf("CanStart of another held lease after the ack: %s", why)
				}
				return Effects{}
			}},
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := NewMachine()
			for _, s := range tc.steps {
				e := s.do(m)
				if (e.Refused != "") != s.refused {
					t.Fatalf("%s: refused = %q, want refused %v", s.name, e.Refused, s.refused)
				}
				if e.RenewNow != s.renew && s.renew {
					t.Errorf("%s: RenewNow = %v, want %v", s.name, e.RenewNow, s.renew)
				}
				if s.fences != nil || len(e.Fences) > 0 {
					if d := cmp.Diff(s.fences, e.Fences, cmpopts.IgnoreFields(FenceOrder{}, "Seq")); d != "" {
						t.Errorf("%s: fences (-want +got):\n%s", s.name, d)
					}
				}
				l, ok := m.Lease("a")
				if s.state != "" && (!ok || l.State != s.state) {
					t.Errorf("%s: state %q, want %q", s.name, l.State, s.state)
				}
				if s.token != 0 && l.Token != s.token {
					t.Errorf("%s: token %d, want %d", s.name, l.Token, s.token)
				}
				switch {
				case s.valid == -1 && l.HasValidity:
					t.Errorf("%s: validity until %v, want none", s.name, l.ValidUntil)
				case s.valid > 0 && (!l.HasValidity || l.ValidUntil != s.valid):
					t.Errorf("%s: validity %v (has %v), want %v", s.name, l.ValidUntil, l.HasValidity, s.valid)
				}
				if s.failed != nil && m.Failed() != *s.failed {
					t.Errorf("%s: failed %v, want %v", s.name, m.Failed(), *s.failed)
				}
			}
		})
	}
}

func TestCanStart(t *testing.T) {
	t.Parallel()
	m := NewMachine()
	m.Grant(expiring("a", 7, 15000), "", 10*sec)
	if ok, _ := m.CanStart("a", 7, 10*sec); ok {
		t.Errorf("CanStart of an uncertain lease")
	}
	m.RenewSent("r1", Renewal{LeaseID: "a", FencingToken: 7}, 10*sec)
	m.Grant(expiring("a", 7, 15000), "r1", 10*sec)
	for _, tc := range []struct {
		lease string
		token int64
		now   Mono
		want  bool
	}{
		{"a", 7, 11 * sec, true},
		{"a", 6, 11 * sec, false},
		{"a", 8, 11 * sec, false},
		{"a", 7, 23500 * time.Millisecond, false}, // validity over even before a tick
		{"b", 7, 11 * sec, false},
		{"", 0, 11 * sec, false},
	} {
		if ok, why := m.CanStart(tc.lease, tc.token, tc.now); ok != tc.want {
			t.Errorf("CanStart(%q, %d, %v) = %v (%s), want %v", tc.lease, tc.token, tc.now, ok, why, tc.want)
		}
	}
}

func TestRestore(t *testing.T) {
	t.Parallel()
	held := Lease{LeaseID: "a", ResourceType: "service", ResourceID: "svc_a", Mode: node.LeaseExpiring, Token: 7,
		State: node.LeaseHeld, Duration: 15 * sec, HasValidity: true, ValidUntil: 100 * sec}
	loc := Lease{LeaseID: "l", ResourceType: "service", ResourceID: "svc_l", Mode: node.LeaseLocal, Token: 2, State: node.LeaseHeld}
	tests := []struct {
		name     string
		in       []Lease
		sameBoot bool
		now      Mono
		state    node.LeaseState
		valid    Mono // 0 means none
		renew    bool
		fence    bool
	}{
		{"same boot, validity left: uncertain, renew at once", []Lease{held}, true, 90 * sec, node.LeaseUncertain, 100 * sec, true, false},
		{"same boot, validity run out: expired and fenced", []Lease{held}, true, 100 * sec, node.LeaseExpired, 0, false, true},
		{"other boot: expired and fenced", []Lease{held}, false, 1 * sec, node.LeaseExpired, 0, false, true},
		{"uncertain without validity: expired and fenced", []Lease{{LeaseID: "a", Mode: node.LeaseExpiring, Token: 7, State: node.LeaseUncertain, Duration: 15 * sec}}, true, sec, node.LeaseExpired, 0, false, true},
		{"crash mid-fence: fenced again", []Lease{{LeaseID: "a", Mode: node.LeaseExpiring, Token: 7, State: node.LeaseRevoked, Fence: FenceRunning, FenceReason: ReasonRevoked}}, true, sec, node.LeaseRevoked, 0, false, true},
		{"fenced lease stays fenced", []Lease{{LeaseID: "a", Mode: node.LeaseExpiring, Token: 7, State: node.LeaseExpired, Fence: FenceDone}}, true, sec, node.LeaseExpired, 0, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := NewMachine()
			e := m.Restore(append(tc.in, loc), nil, false, tc.sameBoot, tc.now)
			l, _ := m.Lease("a")
			if l.State != tc.state {
				t.Errorf("state %s, want %s", l.State, tc.state)
			}
			if (tc.valid != 0) != l.HasValidity || (l.HasValidity && l.ValidUntil != tc.valid) {
				t.Errorf("validity %v (has %v), want %v", l.ValidUntil, l.HasValidity, tc.valid)
			}
			if e.RenewNow != tc.renew {
				t.Errorf("RenewNow %v, want %v", e.RenewNow, tc.renew)
			}
			if got := len(e.Fences) == 1 && e.Fences[0].LeaseID == "a"; got != tc.fence {
				t.Errorf("fences %+v, want a fence of a: %v", e.Fences, tc.fence)
			}
			if ok, _ := m.CanStart("a", 7, tc.now); ok {
				t.Errorf("a restored expiring lease may start before a renewal is answered")
			}
			if l, _ := m.Lease("l"); l.State != node.LeaseHeld {
				t.Errorf("local lease restored as %s", l.State)
			}
			if ok, why := m.CanStart("l", 2, tc.now); !ok {
				t.Errorf("restored local lease may not start: %s", why)
			}
		})
	}
	t.Run("failed mark survives", func(t *testing.T) {
		t.Parallel()
		m := NewMachine()
		m.Restore([]Lease{loc}, []FailedFence{{LeaseID: "a", Token: 7}}, true, true, sec)
		if !m.Failed() {
			t.Fatalf("not failed after restoring a failed fence")
		}
		if ok, _ := m.CanStart("l", 2, sec); ok {
			t.Errorf("failed node may start a stateful workload")
		}
		if _, rem := m.Ack([]string{"a"}); len(rem) != 0 || m.Failed() {
			t.Errorf("ack: remaining %v failed %v", rem, m.Failed())
		}
	})
}

// BenchmarkRenewRoundTrip measures one renewal of a held expiring lease on
// the pure machine: due check, send record and answer.
func BenchmarkRenewRoundTrip(b *testing.B) {
	m := NewMachine()
	g := expiring("a", 7, 15000)
	m.Grant(g, "", sec)
	now := sec
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := ids[i%len(ids)]
		m.RenewSent(id, Renewal{LeaseID: "a", FencingToken: 7}, now)
		if e := m.Grant(g, id, now); e.Refused != "" {
			b.Fatal(e.Refused)
		}
		now += time.Millisecond
	}
}
