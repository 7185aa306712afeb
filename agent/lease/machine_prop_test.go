package lease

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// TestMachineSafetyRandomized drives one lease through random grants,
// renewals, answers, revokes, fences and clock advances and checks, after
// every input, the safety properties of docs/node-protocol.md section 8
// against a simple reference:
//
//   - a stateful start is allowed only when the node was answered a renewal
//     under exactly that token whose send time + D - M is still ahead;
//   - the node's token never decreases and equals the highest token it
//     accepted;
//   - a refused input changes nothing;
//   - nothing starts while a fence ordered for the lease is unfinished.
func TestMachineSafetyRandomized(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runSafety(t, rand.New(rand.NewPCG(seed, seed*7919)))
		})
	}
}

type sentRenew struct {
	token  int64
	sentAt Mono
}

func runSafety(t *testing.T, rng *rand.Rand) {
	m := NewMachine()
	now := time.Hour
	var highest int64   // highest token accepted (grant or revoke)
	var provenEnd Mono  // latest t_send + D - M answered under the current token
	var provenTok int64 // the token provenEnd belongs to
	sent := map[string]sentRenew{}
	var sentIDs []string
	var fencing []FenceOrder // unfinished fences, in the order given
	mode := node.LeaseExpiring
	if rng.IntN(4) == 0 {
		mode = node.LeaseLocal
	}
	dur := []int64{3000, 15000, 60000}[rng.IntN(3)]
	for step := 0; step < 300; step++ {
		before, _ := m.Lease("a")
		var e Effects
		op := ""
		switch rng.IntN(7) {
		case 0: // grant, maybe answering a renewal
			tok := max(highest+int64(rng.IntN(3))-1, 1)
			re := ""
			if len(sentIDs) > 0 && rng.IntN(3) > 0 {
				re = sentIDs[rng.IntN(len(sentIDs))]
			}
			g := node.LeaseGrant{LeaseID: "a", ResourceType: "service", ResourceID: "svc_a", Mode: mode, FencingToken: tok, DurationMS: dur}
			op = fmt.Sprintf("grant %d re=%q", tok, re)
			e = m.Grant(g, re, now)
			if e.Refused == "" {
				if tok > highest {
					highest = tok
				}
				if s, ok := sent[re]; ok && s.token == tok && mode == node.LeaseExpiring {
					d := time.Duration(dur) * time.Millisecond
					if end := s.sentAt + d - node.LeaseMargin(d); end > now && (provenTok != tok || end > provenEnd) {
						provenEnd, provenTok = end, tok
					}
				}
			}
		case 1: // send due renewals
			for _, r := range m.DueRenewals(now) {
				id := fmt.Sprintf("r%d", step)
				m.RenewSent(id, r, now)
				sent[id] = sentRenew{token: r.FencingToken, sentAt: now}
				sentIDs = append(sentIDs, id)
			}
			op = "renew"
		case 2: // revoke
			tok := max(highest+int64(rng.IntN(3))-1, 1)
			op = fmt.Sprintf("revoke %d", tok)
			var known bool
			e, known, _ = m.Revoke(node.LeaseRevoke{LeaseID: "a", FencingToken: tok}, now)
			if known && e.Refused == "" && tok > highest {
				highest = tok
			}
		case 3: // the oldest running fence ends (the manager runs a lease's fences in order)
			if len(fencing) == 0 {
				break
			}
			o := fencing[0]
			fencing = fencing[1:]
			ok := rng.IntN(5) > 0
			op = fmt.Sprintf("fence %d (token %d) done ok=%v", o.Seq, o.Token, ok)
			e = m.FenceDone(o, ok, nil, time.Time{})
			if !ok {
				m.Ack([]string{"a"})
			}
		default: // time passes
			now += time.Duration(rng.IntN(3000)) * time.Millisecond
			op = "tick"
			e, _ = m.Tick(now)
		}
		fencing = append(fencing, e.Fences...)
		after, ok := m.Lease("a")
		if e.Refused != "" && after != before {
			t.Fatalf("step %d %s: refused (%s) but the lease changed:\n before %+v\n after  %+v", step, op, e.Refused, before, after)
		}
		if ok && after.Token != highest {
			t.Fatalf("step %d %s: token %d, highest accepted %d", step, op, after.Token, highest)
		}
		if ok && after.Token < before.Token {
			t.Fatalf("step %d %s: token went down from %d to %d", step, op, before.Token, after.Token)
		}
		if start, _ := m.CanStart("a", after.Token, now); start {
			if len(fencing) > 0 {
				t.Fatalf("step %d %s: start allowed while a fence runs (%v)", step, op, fencing)
			}
			if mode == node.LeaseExpiring && (provenTok != after.Token || now >= provenEnd) {
				t.Fatalf("step %d %s: start allowed at %v under token %d, but the answered validity is %v under token %d",
					step, op, now, after.Token, provenEnd, provenTok)
			}
			if after.State != node.LeaseHeld {
				t.Fatalf("step %d %s: start allowed in state %s", step, op, after.State)
			}
		}
		for _, tok := range []int64{after.Token - 1, after.Token + 1} {
			if start, _ := m.CanStart("a", tok, now); start {
				t.Fatalf("step %d %s: start allowed with token %d while the lease has %d", step, op, tok, after.Token)
			}
		}
	}
}
