package changelog

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/proctest"
)

// crashChildEnv names the data directory a re-run of this test binary appends
// to until it is killed (TestMain).
const crashChildEnv = "BERTH_CHANGELOG_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(crashChild(dir))
	}
	os.Exit(m.Run())
}

// crashChild opens the embedded store in dir and appends from 32 goroutines
// at once (so the log's batches hold many changes) until it is killed,
// printing "ok SEQ HASH" for every append the log acknowledged, after its
// batch was stored.
func crashChild(dir string) int {
	unlock, err := store.LockDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = unlock() }()
	ctx := context.Background()
	s, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l := New(s, 1, nil)
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				e, err := l.Append(ctx, Change{ActorType: "test", ActorID: "crash", EntityType: "service",
					EntityID: fmt.Sprintf("svc_%d_%d", g, i), Op: node.OpCreate, Payload: map[string]int{"g": g, "i": i}})
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					continue
				}
				mu.Lock()
				fmt.Fprintf(out, "ok %d %s\n", e.Seq, e.Hash)
				_ = out.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return 0
}

// TestBatchedAppendsSurviveKill9: a process appending from many goroutines at
// once (batches of many entries, each one insert command) is killed with
// SIGKILL at a random point, again and again on one data directory; after each
// kill the stored log is a valid chain from seq 1 (docs/node-protocol.md
// section 7.2: no seq skipped or used twice, every link and hash right) and
// holds every entry the dead process acknowledged, with the hash it
// acknowledged. Rounds are bounded (BERTH_TEST_CRASH_ROUNDS, default 5); the
// seed of the kill points is printed so a failing run can be repeated
// (BERTH_TEST_CRASH_SEED).
func TestBatchedAppendsSurviveKill9(t *testing.T) {
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("BERTH_TEST_CRASH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("BERTH_TEST_CRASH_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (BERTH_TEST_CRASH_SEED), %d rounds", seed, rounds)
	rng := rand.New(rand.NewPCG(seed, seed))
	dir := t.TempDir()
	acked := map[int64]string{}
	for round := range rounds {
		got := runAndKill(t, dir, time.Duration(200+rng.IntN(1500))*time.Millisecond)
		for seq, hash := range got {
			acked[seq] = hash
		}
		entries := readAll(t, dir)
		if _, err := node.VerifyChain(0, "", entries); err != nil {
			t.Fatalf("round %d (seed %d): the stored log is no valid chain: %v", round, seed, err)
		}
		for seq, hash := range acked {
			if seq > int64(len(entries)) || entries[seq-1].Hash != hash {
				t.Fatalf("round %d (seed %d): acknowledged entry %d (%s) is not in the log of %d entries", round, seed, seq, hash, len(entries))
			}
		}
		t.Logf("round %d: %d entries stored, %d acknowledged in this round", round, len(entries), len(got))
	}
	if len(acked) == 0 {
		t.Fatal("no append was acknowledged in any round: the kills came before the child appended")
	}
}

// runAndKill runs a crash child on dir, kills it with SIGKILL after it
// appended for d (counted from its first acknowledgement), and returns what
// it acknowledged.
func runAndKill(t *testing.T, dir string, d time.Duration) map[int64]string {
	t.Helper()
	child := proctest.StartChild(t, crashChildEnv+"="+dir)
	got := map[int64]string{}
	note := func(l string) {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "ok" {
			seq, _ := strconv.ParseInt(f[1], 10, 64)
			got[seq] = f[2]
		}
	}
	start := time.NewTimer(2 * time.Minute) // the child's store start, on a loaded machine
	defer start.Stop()
	var kill <-chan time.Time
	for {
		select {
		case l, ok := <-child.Lines():
			if !ok {
				t.Fatalf("crash child ended before it was killed: %v", child.Wait())
			}
			note(l)
			if kill == nil && len(got) > 0 {
				kill = time.After(d)
			}
		case <-start.C:
			if kill == nil {
				t.Fatal("crash child acknowledged no append within 2 min")
			}
		case <-kill:
			for _, l := range child.Kill9() { // what it printed before it died counts too
				note(l)
			}
			return got
		}
	}
}

// readAll opens dir's store and returns the whole log from seq 1.
func readAll(t *testing.T, dir string) []node.LogEntry {
	t.Helper()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unlock() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	l := New(s, 1, nil)
	var out []node.LogEntry
	for from := int64(1); ; {
		page, err := l.Range(ctx, from, node.MaxLogBatch)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		from = page[len(page)-1].Seq + 1
	}
}
