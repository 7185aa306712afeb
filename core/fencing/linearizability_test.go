package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/store"
)

type opKind int

const (
	opGrant opKind = iota
	opRenew
	opRelease
	opLost
)

func (k opKind) String() string { return [...]string{"grant", "renew", "release", "lost"}[k] }

type linInput struct {
	kind  opKind
	node  string
	token int64 // renew, release
}

// linOutput is what the caller saw. outcome is "ok", "raced" (the authority gave up after lost
// compare-and-set races, so nothing was written) or the refusal's name.
type linOutput struct {
	outcome string
	holder  string
	token   int64
	changed int
}

func outcome(err error) string {
	for _, e := range []error{fencing.ErrHeld, fencing.ErrGate, fencing.ErrBlocked, fencing.ErrStale, fencing.ErrDeleted} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if err != nil {
		return "raced"
	}
	return "ok"
}

// leaseModel is the sequential specification: the pure decider of this package applied to one
// local lease on a clock that does not move.
func leaseModel(now time.Time) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return fencing.State{LeaseID: "lse_01TEST"} },
		Step: func(st, in, out interface{}) (bool, interface{}) {
			s, i, o := st.(fencing.State), in.(linInput), out.(linOutput)
			if o.outcome == "raced" {
				return true, s
			}
			switch i.kind {
			case opGrant:
				next, _, err := fencing.Grant(s, i.node, node.LeaseLocal, 0, now)
				return outcome(err) == o.outcome && (err != nil || next.Holder == o.holder && next.Token == o.token), next
			case opRenew:
				next, err := fencing.Renew(s, i.node, i.token, now)
				return outcome(err) == o.outcome && (err != nil || next.Token == o.token), next
			case opRelease:
				next, err := fencing.Release(s, i.node, i.token, now)
				return outcome(err) == o.outcome, next
			default:
				next, changed := fencing.Lost(s, i.node, now)
				n := 0
				if changed {
					n = 1
				}
				return n == o.changed, next
			}
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(fencing.State), b.(fencing.State)
			return x.Holder == y.Holder && x.Token == y.Token
		},
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(linInput), out.(linOutput)
			return fmt.Sprintf("%s(%s,%d) -> %s holder=%s token=%d changed=%d", i.kind, i.node, i.token, o.outcome, o.holder, o.token, o.changed)
		},
	}
}

// TestLinearizableOnTheRealStore runs concurrent grant, renew, release (a confirmed revoke) and
// lost calls against the embedded store and checks with porcupine that the history is
// linearizable with respect to the decider: every change is one compare-and-set, so no two
// callers ever see the lease granted under one token to two holders, or a token reused.
func TestLinearizableOnTheRealStore(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	nodeIDs := []string{"nod_a", "nod_b", "nod_c"}
	const clients, opsPerClient = 4, 30
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
	)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(c) + 1))
			lastToken := int64(0)
			for i := 0; i < opsPerClient; i++ {
				in := linInput{kind: opKind(r.Intn(4)), node: nodeIDs[r.Intn(len(nodeIDs))]}
				if r.Intn(3) == 0 {
					in.token = lastToken
				} else {
					in.token = int64(r.Intn(int(lastToken)+2)) + 0
				}
				call := time.Now().UnixNano()
				var out linOutput
				switch in.kind {
				case opGrant:
					l, _, err := f.auth.Grant(ctx, grant(node.LeaseLocal, 0, in.node))
					out.outcome = outcome(err)
					if err == nil {
						out.holder, out.token = l.Holder, l.FencingToken
					}
				case opRenew:
					l, err := f.auth.Renew(ctx, "lse_01TEST", in.node, in.token)
					out.outcome = outcome(err)
					if err == nil {
						out.token = l.FencingToken
					} else if errors.Is(err, store.ErrNotFound) {
						// the lease does not exist yet: the decider sees a never-granted lease
						out.outcome = fencing.ErrStale.Error()
					}
					_ = l
				case opRelease:
					l, err := f.auth.Release(ctx, "lse_01TEST", in.node, in.token)
					out.outcome = outcome(err)
					_ = l
					if errors.Is(err, store.ErrNotFound) {
						out.outcome = fencing.ErrStale.Error()
					}
				case opLost:
					changed, err := f.auth.Lost(ctx, in.node)
					if err != nil {
						out.outcome = "raced"
					}
					out.changed = len(changed)
				}
				ret := time.Now().UnixNano()
				if out.token > lastToken {
					lastToken = out.token
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	res, _ := porcupine.CheckOperationsVerbose(leaseModel(f.clock.Now()), history, time.Minute)
	if res != porcupine.Ok {
		for _, op := range history {
			t.Logf("client %d [%d,%d] %s", op.ClientId, op.Call, op.Return, leaseModel(f.clock.Now()).DescribeOperation(op.Input, op.Output))
		}
		t.Fatalf("history of %d operations is %s", len(history), res)
	}
	granted := 0
	for _, op := range history {
		if op.Input.(linInput).kind == opGrant && op.Output.(linOutput).outcome == "ok" {
			granted++
		}
	}
	t.Logf("%d operations linearizable, %d successful grants", len(history), granted)
}
