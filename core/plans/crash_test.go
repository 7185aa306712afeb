package plans_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/plans/planstest"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/proctest"
)

// The crash test runs a real applier on the real embedded store in a child process (this test
// binary started again with crashChildEnv set), under a bounded load of placements and claims,
// and kills it with SIGKILL at a random point. The child prints each decision the moment its
// submitter is answered; after each kill the parent opens the store again (the applier replays
// what was not materialized) and checks every acknowledged decision against the documents.

const (
	crashChildEnv = "BERTH_PLANS_CRASH_CHILD"
	crashSeedEnv  = "BERTH_PLANS_CRASH_SEED"
	crashRounds   = 20
	crashNodes    = 12
	crashCapacity = 30
	crashOps      = 400
	// crashChildLife bounds a child that no one kills.
	crashChildLife = 20 * time.Second
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(crashChild(dir))
	}
	os.Exit(m.Run())
}

// crashChild is the child: it opens the store in dir and submits placements and claims from
// six goroutines until killed (or crashChildLife passes), printing "place KEY NODE SEQ" and
// "claim OP HOLDER SEQ" for each acknowledged one.
func crashChild(dir string) int {
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), crashChildLife)
	defer cancel()
	unlock, err := store.LockDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = unlock() }()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = st.Close(context.Background()) }()
	a, err := plans.Open(ctx, st)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // unbuffered: one write per line
	}
	say("ready")
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for i := 0; i < 2000 && ctx.Err() == nil; i++ {
				if g%2 == 0 {
					key := fmt.Sprintf("s%d-g%d-%d", seed, g, i)
					node, seq, err := place(ctx, st, a, rng, key)
					if err == nil && node != "" {
						say("place %s %s %d", key, node, seq)
					}
					continue
				}
				op, holder := fmt.Sprintf("op-%04d", rng.IntN(crashOps)), fmt.Sprintf("s%d-g%d", seed, g)
				if rc, err := a.Submit(ctx, claimPlan(op, holder)); err == nil {
					say("claim %s %s %d", op, holder, rc.Seq)
				}
			}
		}()
	}
	wg.Wait()
	return 0
}

func TestCrashKeepsAcknowledgedDecisions(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (set %s to repeat)", seed, crashSeedEnv)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	planstest.Replayed(t, dir, func(st *store.Store) {
		seedNodes(t, st, crashNodes, crashCapacity)
		seedOps(t, st, crashOps)
		if err := st.EnsureCollections(context.Background(), "test_placements"); err != nil {
			t.Fatal(err)
		}
	})
	placed := map[string]string{}  // acknowledged: key -> node
	claimed := map[string]string{} // acknowledged: op -> holder
	for round := 1; round <= crashRounds; round++ {
		child := proctest.StartChild(t, crashChildEnv+"="+dir, fmt.Sprintf("%s=%d", crashSeedEnv, seed+uint64(round)))
		// Kill after a random number of acknowledgements (1 to 200), or a random time (20 ms
		// to 1.5 s) after the child is ready, whichever comes first; the child's own bound ends
		// the rest.
		killAfter := 1 + rng.IntN(200)
		killIn := time.Duration(20+rng.IntN(1480)) * time.Millisecond
		guard := time.AfterFunc(crashChildLife+10*time.Second, child.Signal9)
		var timer *time.Timer
		acks := 0
		for l := range child.Lines() {
			f := strings.Fields(l)
			switch {
			case len(f) == 1 && f[0] == "ready" && timer == nil:
				timer = time.AfterFunc(killIn, child.Signal9)
			case len(f) == 4 && f[0] == "place":
				if prev, ok := placed[f[1]]; ok {
					t.Fatalf("round %d: %s acknowledged twice (%s, %s)", round, f[1], prev, f[2])
				}
				placed[f[1]] = f[2]
				acks++
			case len(f) == 4 && f[0] == "claim":
				if prev, ok := claimed[f[1]]; ok {
					t.Fatalf("round %d: %s claimed twice (by %s, then %s)", round, f[1], prev, f[2])
				}
				claimed[f[1]] = f[2]
				acks++
			}
			if acks >= killAfter {
				child.Signal9()
			}
		}
		guard.Stop()
		if timer != nil {
			timer.Stop()
		}
		child.Kill9()
		t.Logf("round %d: killed after %d acknowledgements (%d placed, %d claimed so far)", round, acks, len(placed), len(claimed))
		planstest.Replayed(t, dir, func(st *store.Store) { checkCrashState(t, round, st, placed, claimed) })
	}
}

// checkCrashState checks the documents as stored: every acknowledged placement and claim is
// there, no key is reserved on two nodes, no node holds more than its capacity or a sum other
// than its reservations', and every acknowledged claim has the holder acknowledged.
func checkCrashState(t *testing.T, round int, st *store.Store, placed, claimed map[string]string) {
	t.Helper()
	ctx := context.Background()
	var nodes []testNode
	cur, err := st.Collection(nodesColl).Find(ctx, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	on := map[string]string{}
	for _, n := range nodes {
		sum := 0
		for key, u := range n.Reservations {
			if prev, ok := on[key]; ok {
				t.Fatalf("round %d: %s is placed twice (%s and %s)", round, key, prev, n.ID)
			}
			on[key] = n.ID
			sum += u
		}
		if sum != n.Reserved || n.Reserved > n.Capacity {
			t.Fatalf("round %d: node %s holds %d units (reserved %d) of %d", round, n.ID, sum, n.Reserved, n.Capacity)
		}
	}
	for key, node := range placed {
		if on[key] != node {
			t.Fatalf("round %d: acknowledged placement %s on %s is stored on %q", round, key, node, on[key])
		}
	}
	for op, holder := range claimed {
		var o testOp
		if err := store.FindByID(ctx, st.Collection(opsColl), op, &o); err != nil {
			t.Fatal(err)
		}
		if o.Holder != holder {
			t.Fatalf("round %d: acknowledged claim of %s by %s is stored as held by %q", round, op, holder, o.Holder)
		}
	}
}
