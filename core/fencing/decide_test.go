package fencing

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/abi/node"
)

var t0 = time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)

const d15 = 15 * time.Second

// gate15 is D + 2M for D = 15 s: 15 s + 2 * 1.5 s.
const gate15 = 18 * time.Second

func held(holder string, token int64, mode node.LeaseMode, d time.Duration, at time.Time) State {
	return State{LeaseID: "lse_1", Holder: holder, Token: token, Mode: mode, Duration: d, GrantedAt: at}
}

func TestGrantTransitions(t *testing.T) {
	free := State{LeaseID: "lse_1"}
	tests := []struct {
		name    string
		cur     State
		to      string
		mode    node.LeaseMode
		d       time.Duration
		now     time.Time
		want    State
		moved   string
		wantErr error
	}{
		{name: "first grant, local", cur: free, to: "n1", mode: node.LeaseLocal, d: d15, now: t0,
			want: held("n1", 1, node.LeaseLocal, 0, t0)},
		{name: "first grant, expiring", cur: free, to: "n1", mode: node.LeaseExpiring, d: d15, now: t0,
			want: held("n1", 1, node.LeaseExpiring, d15, t0)},
		{name: "expiring below the floor refused", cur: free, to: "n1", mode: node.LeaseExpiring, d: 2999 * time.Millisecond, now: t0,
			want: free, wantErr: ErrDurationTooShort},
		{name: "expiring at the floor", cur: free, to: "n1", mode: node.LeaseExpiring, d: node.MinLeaseDuration, now: t0,
			want: held("n1", 1, node.LeaseExpiring, node.MinLeaseDuration, t0)},
		{name: "unknown mode refused", cur: free, to: "n1", mode: "forever", now: t0, want: free, wantErr: errUnknownModeForTest},
		{name: "same holder: unchanged, same token", cur: held("n1", 4, node.LeaseLocal, 0, t0), to: "n1", mode: node.LeaseLocal, now: t0.Add(time.Hour),
			want: held("n1", 4, node.LeaseLocal, 0, t0)},
		{name: "local held by another: never by time", cur: held("n1", 4, node.LeaseLocal, 0, t0), to: "n2", mode: node.LeaseLocal, now: t0.Add(1000 * time.Hour),
			want: held("n1", 4, node.LeaseLocal, 0, t0), wantErr: ErrHeld},
		{name: "expiring held by another, 1 ns before the gate", cur: held("n1", 4, node.LeaseExpiring, d15, t0), to: "n2", mode: node.LeaseExpiring, d: d15,
			now: t0.Add(gate15 - time.Nanosecond), want: held("n1", 4, node.LeaseExpiring, d15, t0), wantErr: ErrHeld},
		{name: "expiring held by another, at the gate: moves with a higher token", cur: held("n1", 4, node.LeaseExpiring, d15, t0), to: "n2", mode: node.LeaseExpiring, d: d15,
			now: t0.Add(gate15), want: held("n2", 5, node.LeaseExpiring, d15, t0.Add(gate15)), moved: "n1"},
		{name: "free before its gate", cur: State{LeaseID: "lse_1", Token: 4, GateAt: t0.Add(time.Second)}, to: "n2", mode: node.LeaseLocal, now: t0,
			want: State{LeaseID: "lse_1", Token: 4, GateAt: t0.Add(time.Second)}, wantErr: ErrGate},
		{name: "free after release: the same node gets a higher token", cur: State{LeaseID: "lse_1", Token: 4, GateAt: t0}, to: "n1", mode: node.LeaseLocal, now: t0,
			want: held("n1", 5, node.LeaseLocal, 0, t0)},
		{name: "blocked by a failed fence", cur: State{LeaseID: "lse_1", Token: 4, FenceFailed: []string{"n1"}}, to: "n2", mode: node.LeaseLocal, now: t0,
			want: State{LeaseID: "lse_1", Token: 4, FenceFailed: []string{"n1"}}, wantErr: ErrBlocked},
		{name: "blocked even for its holder's grant", cur: State{LeaseID: "lse_1", Holder: "n1", Token: 4, Mode: node.LeaseLocal, FenceFailed: []string{"n1"}}, to: "n1", mode: node.LeaseLocal, now: t0,
			want: State{LeaseID: "lse_1", Holder: "n1", Token: 4, Mode: node.LeaseLocal, FenceFailed: []string{"n1"}}, wantErr: ErrBlocked},
		{name: "deleted", cur: State{LeaseID: "lse_1", Token: 4, Deleted: true}, to: "n1", mode: node.LeaseLocal, now: t0,
			want: State{LeaseID: "lse_1", Token: 4, Deleted: true}, wantErr: ErrDeleted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, moved, err := Grant(tt.cur, tt.to, tt.mode, tt.d, tt.now)
			if tt.wantErr == errUnknownModeForTest {
				if err == nil {
					t.Fatal("unknown mode accepted")
				}
			} else if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("state (-want +got):\n%s", diff)
			}
			if moved != tt.moved {
				t.Fatalf("moved %q, want %q", moved, tt.moved)
			}
		})
	}
}

var errUnknownModeForTest = errors.New("any error")

func TestRenewReleaseLostFenceTransitions(t *testing.T) {
	h := held("n1", 4, node.LeaseExpiring, d15, t0)
	later := t0.Add(10 * time.Second)
	tests := []struct {
		name    string
		op      func(State) (State, error)
		cur     State
		want    State
		wantErr error
	}{
		{name: "renew by holder keeps the token, moves T_grant", cur: h,
			op: func(s State) (State, error) { return Renew(s, "n1", 4, later) }, want: held("n1", 4, node.LeaseExpiring, d15, later)},
		{name: "renew past the gate while nobody took it", cur: h,
			op: func(s State) (State, error) { return Renew(s, "n1", 4, t0.Add(time.Hour)) }, want: held("n1", 4, node.LeaseExpiring, d15, t0.Add(time.Hour))},
		{name: "renew with a lower token is stale", cur: h,
			op: func(s State) (State, error) { return Renew(s, "n1", 3, later) }, want: h, wantErr: ErrStale},
		{name: "renew with a higher token is stale", cur: h,
			op: func(s State) (State, error) { return Renew(s, "n1", 5, later) }, want: h, wantErr: ErrStale},
		{name: "renew by another node is stale", cur: h,
			op: func(s State) (State, error) { return Renew(s, "n2", 4, later) }, want: h, wantErr: ErrStale},
		{name: "renew of a blocked lease", cur: State{LeaseID: "lse_1", Holder: "n1", Token: 4, FenceFailed: []string{"n1"}},
			op:   func(s State) (State, error) { return Renew(s, "n1", 4, later) },
			want: State{LeaseID: "lse_1", Holder: "n1", Token: 4, FenceFailed: []string{"n1"}}, wantErr: ErrBlocked},
		{name: "renew of a deleted lease", cur: State{LeaseID: "lse_1", Token: 5, Deleted: true},
			op: func(s State) (State, error) { return Renew(s, "n1", 4, later) }, want: State{LeaseID: "lse_1", Token: 5, Deleted: true}, wantErr: ErrDeleted},
		{name: "release by holder frees with the gate open now", cur: h,
			op:   func(s State) (State, error) { return Release(s, "n1", 4, later) },
			want: State{LeaseID: "lse_1", Token: 4, Mode: node.LeaseExpiring, Duration: d15, GrantedAt: t0, GateAt: later}},
		{name: "release under an old token changes nothing", cur: h,
			op: func(s State) (State, error) { return Release(s, "n1", 3, later) }, want: h, wantErr: ErrStale},
		{name: "release by another node changes nothing", cur: h,
			op: func(s State) (State, error) { return Release(s, "n2", 4, later) }, want: h, wantErr: ErrStale},
		{name: "lost holder: token up, free at once", cur: h,
			op:   func(s State) (State, error) { n, _ := Lost(s, "n1", later); return n, nil },
			want: State{LeaseID: "lse_1", Token: 5, Mode: node.LeaseExpiring, Duration: d15, GrantedAt: t0, GateAt: later}},
		{name: "lost of another node changes nothing", cur: h,
			op: func(s State) (State, error) { n, _ := Lost(s, "n2", later); return n, nil }, want: h},
		{name: "lost keeps a failed fence outstanding", cur: State{LeaseID: "lse_1", Holder: "n1", Token: 4, FenceFailed: []string{"n1"}},
			op:   func(s State) (State, error) { n, _ := Lost(s, "n1", later); return n, nil },
			want: State{LeaseID: "lse_1", Token: 5, GateAt: later, FenceFailed: []string{"n1"}}},
		{name: "fence failure blocks, holder and token kept", cur: h,
			op:   func(s State) (State, error) { n, _ := FenceFailed(s, "n1"); return n, nil },
			want: func() State { s := h; s.FenceFailed = []string{"n1"}; return s }()},
		{name: "fence failure recorded once", cur: State{LeaseID: "lse_1", Token: 4, FenceFailed: []string{"n1"}},
			op:   func(s State) (State, error) { n, _ := FenceFailed(s, "n1"); return n, nil },
			want: State{LeaseID: "lse_1", Token: 4, FenceFailed: []string{"n1"}}},
		{name: "ack: token up, free at once, unblocked", cur: func() State { s := h; s.FenceFailed = []string{"n1"}; return s }(),
			op:   func(s State) (State, error) { n, _ := Ack(s, "n1", later); return n, nil },
			want: State{LeaseID: "lse_1", Token: 5, Mode: node.LeaseExpiring, Duration: d15, GrantedAt: t0, GateAt: later, FenceFailed: []string{}}},
		{name: "ack of one of two failures stays blocked", cur: State{LeaseID: "lse_1", Token: 4, FenceFailed: []string{"n1", "n2"}},
			op:   func(s State) (State, error) { n, _ := Ack(s, "n1", later); return n, nil },
			want: State{LeaseID: "lse_1", Token: 5, GateAt: later, FenceFailed: []string{"n2"}}},
		{name: "repeated ack changes nothing", cur: State{LeaseID: "lse_1", Token: 5},
			op: func(s State) (State, error) { n, _ := Ack(s, "n1", later); return n, nil }, want: State{LeaseID: "lse_1", Token: 5}},
		{name: "delete: token up, deleted", cur: h,
			op:   func(s State) (State, error) { return Delete(s), nil },
			want: State{LeaseID: "lse_1", Token: 5, Mode: node.LeaseExpiring, Duration: d15, GrantedAt: t0, Deleted: true}},
		{name: "delete is idempotent", cur: State{LeaseID: "lse_1", Token: 5, Deleted: true},
			op: func(s State) (State, error) { return Delete(s), nil }, want: State{LeaseID: "lse_1", Token: 5, Deleted: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.op(tt.cur)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTokenNeverReused walks random operation sequences and checks the token rules of section
// 8.6: it never decreases, it increases on every change of holder, and a renewal keeps it.
func TestTokenNeverReused(t *testing.T) {
	nodesIDs := []string{"n1", "n2", "n3"}
	for seed := int64(0); seed < 200; seed++ {
		s := State{LeaseID: "lse_1"}
		now := t0
		seen := map[int64]string{} // token -> the one holder it was granted to
		r := newRand(seed)
		for step := 0; step < 60; step++ {
			n := nodesIDs[r.Intn(len(nodesIDs))]
			now = now.Add(time.Duration(r.Intn(20_000)) * time.Millisecond)
			prev := s
			switch r.Intn(7) {
			case 0, 1:
				mode := node.LeaseLocal
				if r.Intn(2) == 0 {
					mode = node.LeaseExpiring
				}
				s, _, _ = Grant(s, n, mode, d15, now)
			case 2:
				s, _ = Renew(s, n, s.Token, now)
			case 3:
				s, _ = Release(s, n, s.Token, now)
			case 4:
				s, _ = Lost(s, n, now)
			case 5:
				s, _ = FenceFailed(s, n)
			case 6:
				s, _ = Ack(s, n, now)
			}
			if s.Token < prev.Token {
				t.Fatalf("seed %d step %d: token went down %d -> %d", seed, step, prev.Token, s.Token)
			}
			if s.Holder != "" && s.Holder != prev.Holder && s.Token == prev.Token {
				t.Fatalf("seed %d step %d: holder changed %q -> %q without a new token", seed, step, prev.Holder, s.Holder)
			}
			if s.Holder != "" {
				if h, ok := seen[s.Token]; ok && h != s.Holder {
					t.Fatalf("seed %d step %d: token %d reused for %s (was %s)", seed, step, s.Token, s.Holder, h)
				}
				seen[s.Token] = s.Holder
			}
		}
	}
}
