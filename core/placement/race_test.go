package placement_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// raceRounds is how many times the two control planes race for a node's last unit by default
// (tens of milliseconds a round on the embedded store); BERTH_PLACEMENT_RACE_ROUNDS overrides it.
const raceRounds = 250

func rounds(t *testing.T) int {
	if v := os.Getenv("BERTH_PLACEMENT_RACE_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BERTH_PLACEMENT_RACE_ROUNDS=%q: want a positive integer", v)
		}
		return n
	}
	return raceRounds
}

// Environment of a child control plane started by TestTwoControlPlanesRaceForTheLastUnit.
const (
	envRaceURI  = "BERTH_PLACEMENT_RACE_URI"
	envRaceName = "BERTH_PLACEMENT_RACE_NAME"
	envRaceDB   = "BERTH_PLACEMENT_RACE_DB"
)

func TestMain(m *testing.M) {
	if uri := os.Getenv(envRaceURI); uri != "" {
		os.Exit(raceChild(uri, os.Getenv(envRaceDB), os.Getenv(envRaceName), os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// raceChild is one control plane: for every "N" line on in, it places project <name>-N in region
// "race" (whose single node has one unit) and answers "won N" or "lost N".
func raceChild(uri, db, name string, in io.Reader, out io.Writer) int {
	ctx := context.Background()
	st, err := store.Open(ctx, store.Config{URI: uri, Database: db})
	if err != nil {
		fmt.Fprintln(out, "error", err)
		return 1
	}
	defer st.Close(ctx)
	svc := placement.NewService(st, runners.NewRegistry(st, runners.Config{}), nil)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		round := sc.Text()
		p, err := svc.SetDesired(ctx, "prj_"+name+"_"+round, placement.DesiredRequest{Release: "r", Region: ptr("race")})
		switch {
		case err != nil:
			fmt.Fprintln(out, "error", round, err)
		case p.Status == placement.Assigned:
			fmt.Fprintln(out, "won", round)
		default:
			fmt.Fprintln(out, "lost", round)
		}
	}
	return 0
}

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// TestTwoControlPlanesRaceForTheLastUnit runs two control planes as two processes (this test binary
// re-run) on one store and makes them race, round after round, to place a project on a node that has
// one free unit left. Exactly one wins each round and no node is ever over-reserved. With
// BERTH_TEST_MONGO_URI the children share that MongoDB; without it, this process's embedded FerretDB
// through [storetest.SharedURI] (FerretDB v1 applies concurrent updates of one document atomically
// only over one connection; reached by two direct connections, this test fails in its first rounds).
func TestTwoControlPlanesRaceForTheLastUnit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	ctx := context.Background()
	st := storetest.Open(t)
	uri, db := os.Getenv("BERTH_TEST_MONGO_URI"), st.DB().Name()
	if uri == "" {
		uri = storetest.SharedURI(t, st)
	}
	// One node with one unit; every round empties its ledger and both control planes race for it.
	far := time.Now().Add(24 * time.Hour).UTC()
	nodes := runners.NodeCollection(st, "race")
	if _, err := nodes.InsertOne(ctx, runners.Node{ID: "race", Region: "race", Capacity: 1,
		ExpiresAt: far, LastHeartbeatAt: far, Reservations: map[string]runners.Reservation{}}); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var kids []*child
	for _, name := range []string{"a", "b"} {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), envRaceURI+"="+uri, envRaceName+"="+name, envRaceDB+"="+db)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		kids = append(kids, c)
		t.Cleanup(func() {
			_ = c.in.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("control plane %s: %v", name, err)
			}
		})
	}
	// A control plane that stops answering fails the test instead of hanging it.
	watchdog := time.AfterFunc(10*time.Minute, func() {
		for _, c := range kids {
			_ = c.cmd.Process.Kill()
		}
	})
	defer watchdog.Stop()
	wins := map[string]int{}
	total := rounds(t)
	for r := 0; r < total; r++ {
		for _, c := range kids {
			fmt.Fprintln(c.in, r)
		}
		won := 0
		for i, c := range kids {
			if !c.out.Scan() {
				t.Fatalf("round %d: control plane %d ended: %v", r, i, c.out.Err())
			}
			verdict, _, _ := strings.Cut(c.out.Text(), " ")
			switch verdict {
			case "won":
				won++
				wins[string(rune('a'+i))]++
			case "lost":
			default:
				t.Fatalf("round %d: %s", r, c.out.Text())
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d control planes won the last unit, want exactly 1", r, won)
		}
		var n runners.Node
		if err := store.FindByID(ctx, nodes, "race", &n); err != nil {
			t.Fatal(err)
		}
		if n.Reserved != 1 || len(n.Reservations) != 1 {
			t.Fatalf("round %d: node reserved %d units in %d reservations; capacity 1", r, n.Reserved, len(n.Reservations))
		}
		if _, err := nodes.UpdateOne(ctx, bson.M{"_id": "race"}, bson.M{"$set": bson.M{"reservations": bson.M{}, "reserved": 0},
			"$inc": bson.M{"revision": int64(1)}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds: wins %v", total, wins)
}
