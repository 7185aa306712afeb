package placement_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/plans"
	"github.com/berthhq/berth/core/plans/planstest"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/proctest"
)

// The crash test runs a berthd's placement service on the plan applier, on the real embedded
// store, in a child process (this test binary started again with crashChildEnv set): four
// goroutines place projects of 1 to 3 units, a fourth removes some of them again and a fifth
// heartbeats the nodes with declarations that lower and raise their capacity (refused while the
// reservations need it): the direct writes run beside the applier's. The parent kills
// the child with SIGKILL at a random point, opens the store again (the applier replays what was
// not materialized) and checks the documents as stored: every acknowledged placement is there,
// on its node, with its reservation; no project is reserved on two nodes; no node holds more
// than its capacity or a sum other than its reservations'.

const (
	crashChildEnv = "BERTH_PLACEMENT_CRASH_DIR"
	crashSeedEnv  = "BERTH_PLACEMENT_CRASH_SEED"
	crashCredEnv  = "BERTH_PLACEMENT_CRASH_CRED"
	crashRounds   = 20
	crashNodes    = 8
	crashCapacity = 24
	// crashChildLife bounds a child that no one kills.
	crashChildLife = 20 * time.Second
)

func crashNodeID(i int) string { return fmt.Sprintf("crash-%02d", i) }

// crashChild is the child: it prints "ready", then "place PROJECT NODE" for each placement the
// service answered as assigned and "removing PROJECT" before it removes one, until killed.
func crashChild(dir string) int {
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	cred := os.Getenv(crashCredEnv)
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
	reg := runners.NewRegistry(st, runners.Config{NodeTTL: time.Hour})
	svc := placement.NewService(st, reg, nil, placement.WithPlans(a))
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // unbuffered: one write per line
	}
	var mine []string // placed, by this child or the ones before it, and not removed
	ps, err := svc.List(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, p := range ps {
		mine = append(mine, p.ProjectID)
	}
	say("ready")
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for i := 0; i < 500 && ctx.Err() == nil; i++ {
				id := fmt.Sprintf("prj_s%d_g%d_%d", seed, g, i)
				units := 1 + rng.IntN(3)
				p, err := svc.SetDesired(ctx, id, placement.DesiredRequest{Release: "r", Region: ptr("crash"), CapacityUnits: &units})
				if err == nil && p.Status == placement.Assigned {
					say("place %s %s", id, p.NodeID)
					mu.Lock()
					mine = append(mine, id)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // removes placements (direct writes beside the applier's) to make room again
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 98))
		for i := 0; i < 1000 && ctx.Err() == nil; i++ {
			mu.Lock()
			if len(mine) == 0 {
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // nothing placed yet: bounded by i
				continue
			}
			k := rng.IntN(len(mine))
			id := mine[k]
			mine = append(mine[:k], mine[k+1:]...)
			mu.Unlock()
			say("removing %s", id)
			if err := svc.Remove(ctx, id); err == nil {
				say("removed %s", id)
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 99))
		for i := 0; i < 2000 && ctx.Err() == nil; i++ {
			capacity := crashCapacity - 4*rng.IntN(2)
			d := runners.Declaration{Region: "crash", Capacity: capacity}
			_, _ = reg.Heartbeat(ctx, crashNodeID(rng.IntN(crashNodes)), cred, runners.HeartbeatRequest{Declaration: &d})
		}
	}()
	wg.Wait()
	return 0
}

func TestCrashKeepsAcknowledgedPlacements(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (set %s to repeat)", seed, crashSeedEnv)
	rng := rand.New(rand.NewPCG(seed, 0))
	cred, digest, err := identity.NewToken(identity.PrefixNode)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	planstest.Replayed(t, dir, func(st *store.Store) {
		far := time.Now().Add(24 * time.Hour).UTC()
		for i := 0; i < crashNodes; i++ {
			id := crashNodeID(i)
			if _, err := runners.NodeCollection(st, id).InsertOne(context.Background(), runners.Node{ID: id, Region: "crash", Capacity: crashCapacity,
				CredentialDigest: digest, ExpiresAt: far, LastHeartbeatAt: far, Reservations: map[string]runners.Reservation{}}); err != nil {
				t.Fatal(err)
			}
		}
		colls := placement.Collections(st).All()
		names := make([]string, 0, len(colls))
		for _, c := range colls {
			names = append(names, c.Name())
		}
		if err := st.EnsureCollections(context.Background(), names...); err != nil {
			t.Fatal(err)
		}
	})
	placed := map[string]string{} // acknowledged: project -> node
	for round := 1; round <= crashRounds; round++ {
		child := proctest.StartChild(t, crashChildEnv+"="+dir, fmt.Sprintf("%s=%d", crashSeedEnv, seed+uint64(round)), crashCredEnv+"="+cred)
		// Kill after a random number of acknowledgements (1 to 150), or a random time (20 ms to
		// 1.5 s) after the child is ready, whichever comes first; the child's own bound ends the rest.
		killAfter := 1 + rng.IntN(150)
		killIn := time.Duration(20+rng.IntN(1480)) * time.Millisecond
		guard := time.AfterFunc(crashChildLife+10*time.Second, child.Signal9)
		var timer *time.Timer
		acks := 0
		for l := range child.Lines() {
			f := strings.Fields(l)
			switch {
			case len(f) == 1 && f[0] == "ready" && timer == nil:
				timer = time.AfterFunc(killIn, child.Signal9)
			case len(f) == 3 && f[0] == "place":
				if prev, ok := placed[f[1]]; ok {
					t.Fatalf("round %d: %s acknowledged twice (%s, %s)", round, f[1], prev, f[2])
				}
				placed[f[1]] = f[2]
				acks++
			case len(f) == 2 && f[0] == "removing":
				delete(placed, f[1]) // removed or not: no longer a promise
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
		t.Logf("round %d: killed after %d acknowledgements (%d placed so far)", round, acks, len(placed))
		planstest.Replayed(t, dir, func(st *store.Store) { checkPlacements(t, round, st, placed) })
	}
}

// checkPlacements checks the documents as stored (read from the store, not the view).
func checkPlacements(t *testing.T, round int, st *store.Store, placed map[string]string) {
	t.Helper()
	ctx := context.Background()
	on := map[string]string{}
	for i := 0; i < crashNodes; i++ {
		id := crashNodeID(i)
		var n runners.Node
		if err := store.FindByID(ctx, runners.NodeCollection(st, id), id, &n); err != nil {
			t.Fatal(err)
		}
		sum := 0
		for key, r := range n.Reservations {
			if prev, ok := on[key]; ok {
				t.Fatalf("round %d: %s is reserved on %s and %s", round, key, prev, id)
			}
			on[key] = id
			sum += r.Units
		}
		if sum != n.Reserved || n.Reserved > n.Capacity {
			t.Fatalf("round %d: node %s holds %d units (reserved %d) of %d", round, id, sum, n.Reserved, n.Capacity)
		}
	}
	for project, node := range placed {
		var p placement.Placement
		err := store.FindByID(ctx, placement.Collections(st).For(project), project, &p)
		if errors.Is(err, store.ErrNotFound) {
			t.Fatalf("round %d: acknowledged placement %s on %s is not stored", round, project, node)
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.Status != placement.Assigned || p.NodeID != node || on[project] != node {
			t.Fatalf("round %d: acknowledged placement %s on %s is stored as %s on %q, reserved on %q", round, project, node, p.Status, p.NodeID, on[project])
		}
	}
}
