package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/client"
)

// changelogEntries reads berthd's whole change log through GET
// /api/v1/changelog, page by page.
func (cl *cluster) changelogEntries(t *testing.T) []node.LogEntry {
	t.Helper()
	tc, err := client.PinnedTLSConfig(cl.fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	var all []node.LogEntry
	for page := 0; ; page++ {
		if page == 1000 {
			t.Fatalf("change log still not read after %d pages", page)
		}
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/v1/changelog?from_seq=%d", cl.url, len(all)+1), nil)
		req.Header.Set("Authorization", "Bearer "+cl.token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Entries []node.LogEntry `json:"entries"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET changelog: %d %v", resp.StatusCode, err)
		}
		if len(out.Entries) == 0 {
			return all
		}
		all = append(all, out.Entries...)
	}
}

// TestChangelogSurvivesKill9UnderWriters: 64 writers apply and re-apply
// their own services against a real berthd, which is killed with SIGKILL
// after a random number of successful writes and restarted on the same data
// directory. Then the chain verifies from seq 1, every stored service has
// exactly one entry per committed write (one create at revision 1, one
// update for each later revision, in revision order), and no entry names a
// service that is not stored. Before, the entry was appended after the commit on the
// request's context, so writes committed just before the kill (or whose
// append lost a race) had none.
func TestChangelogSurvivesKill9UnderWriters(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pushBundle(t, env.helloDir, "hello")
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	killAfter := int64(64 + rng.IntN(192))
	t.Logf("seed %d: berthd is killed after %d successful writes", seed, killAfter)

	const writers = 64
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ok atomic.Int64
	reached := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 1000 && ctx.Err() == nil; k++ {
				_, err := cl.c.ApplyService(ctx, "default", fmt.Sprintf("w%02d", i), client.ServiceSpec{
					Bundle: "hello", Command: []string{"./hello"}, Env: map[string]string{"K": fmt.Sprint(k)}})
				if err != nil {
					return // berthd is gone: this writer stops
				}
				if ok.Add(1) == killAfter {
					once.Do(func() { close(reached) })
				}
			}
		}()
	}
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatalf("only %d writes succeeded before the deadline", ok.Load())
	}
	cl.berthd.Kill9()
	wg.Wait()
	t.Logf("%d writes answered before the kill", ok.Load())

	startBerthd(t, cl)
	svcs, err := cl.c.ListServices(context.Background(), "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) == 0 {
		t.Fatal("no service stored")
	}
	entries := cl.changelogEntries(t)
	if n, err := node.VerifyChain(0, "", entries); err != nil || n != len(entries) {
		t.Fatalf("chain verified %d of %d entries: %v", n, len(entries), err)
	}
	type key struct {
		id  string
		rev int64
	}
	seen := map[key]int{}
	lastRev := map[string]int64{}
	for _, e := range entries {
		if e.EntityType != "service" {
			continue
		}
		var p struct{ Revision int64 }
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatalf("entry %d payload: %v", e.Seq, err)
		}
		if want := node.OpUpdate; p.Revision == 1 {
			want = node.OpCreate
			if e.Op != want {
				t.Errorf("entry %d: %s of %s at revision 1, want create", e.Seq, e.Op, e.EntityID)
			}
		} else if e.Op != want {
			t.Errorf("entry %d: %s of %s at revision %d, want update", e.Seq, e.Op, e.EntityID, p.Revision)
		}
		seen[key{e.EntityID, p.Revision}]++
		if p.Revision <= lastRev[e.EntityID] {
			t.Errorf("entry %d: %s at revision %d after revision %d: entries out of write order", e.Seq, e.EntityID, p.Revision, lastRev[e.EntityID])
		}
		lastRev[e.EntityID] = p.Revision
	}
	stored := map[string]bool{}
	total := 0
	for _, s := range svcs {
		stored[s.ID] = true
		for rev := int64(1); rev <= s.Revision; rev++ {
			if c := seen[key{s.ID, rev}]; c != 1 {
				t.Errorf("service %s (%s) revision %d has %d entries, want 1", s.Name, s.ID, rev, c)
			}
		}
		total += int(s.Revision)
	}
	for k, c := range seen {
		if !stored[k.id] {
			t.Errorf("%d entries name service %s at revision %d, which is not stored", c, k.id, k.rev)
		}
	}
	t.Logf("%d services, %d committed writes, %d service entries; recovery: %s", len(svcs), total, len(seen), recoveryLine(cl))
}

// recoveryLine is what the restarted berthd logged about changes it found
// pending, or "none".
func recoveryLine(cl *cluster) string {
	b, _ := os.ReadFile(filepath.Join(cl.dir, "berthd.log"))
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "a previous run left pending") {
			return line
		}
	}
	return "none"
}
