package api

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/internal/wasmtest"
)

// changelogCleared waits, bounded, until the change log has cleared from
// their outboxes the changes it appended so far (it does so after telling
// the requests).
func (f *fixture) changelogCleared() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.api.cfg.Changelog.Cleared(ctx); err != nil {
		f.t.Fatal(err)
	}
}

// changelogEntries reads the whole change log through GET /api/v1/changelog
// and checks that the chain verifies.
func (f *fixture) changelogEntries() []node.LogEntry {
	f.t.Helper()
	var all []node.LogEntry
	for from := 1; ; {
		code, out := f.json("GET", fmt.Sprintf("/api/v1/changelog?from_seq=%d", from), nil)
		if code != 200 {
			f.t.Fatalf("changelog: %d %v", code, out)
		}
		raw, _ := json.Marshal(out["entries"])
		var page []node.LogEntry
		if err := json.Unmarshal(raw, &page); err != nil {
			f.t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		from += len(page)
	}
	if n, err := node.VerifyChain(0, "", all); err != nil || n != len(all) {
		f.t.Fatalf("chain verified %d of %d: %v", n, len(all), err)
	}
	return all
}

func (f *fixture) pushApp() {
	f.t.Helper()
	good := tarGz(f.t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		f.t.Fatalf("push bundle: %d %v", code, out)
	}
}

// TestChangelogEveryConcurrentWrite: 64 concurrent PUTs of distinct services
// each leave exactly one create entry, and no service keeps a pending change
// in its outbox. Before, writers raced for each seq: most gave up
// ("change log is contended") and their committed writes had no entry.
func TestChangelogEveryConcurrentWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.pushApp()
	const n = 64
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := f.json("PUT", fmt.Sprintf("/api/v1/projects/default/services/w%d", i), map[string]any{"bundle": "app", "command": []string{"./app"}})
			codes <- code
		}()
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 201 {
			t.Fatalf("PUT answered %d, want 201", code)
		}
	}
	f.changelogCleared()
	var svcs []struct {
		ID     string              `bson:"_id"`
		Outbox []changelog.Pending `bson:"log_outbox"`
	}
	cur, err := f.st.Collection("services").Find(context.Background(), bson.M{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.All(context.Background(), &svcs); err != nil {
		t.Fatal(err)
	}
	if len(svcs) != n {
		t.Fatalf("%d services stored, want %d", len(svcs), n)
	}
	creates := map[string]int{}
	for _, e := range f.changelogEntries() {
		if e.EntityType == "service" {
			creates[e.EntityID+" "+e.Op]++
		}
	}
	for _, s := range svcs {
		if c := creates[s.ID+" create"]; c != 1 {
			t.Errorf("service %s has %d create entries, want 1", s.ID, c)
		}
		if len(s.Outbox) != 0 {
			t.Errorf("service %s keeps %d pending changes", s.ID, len(s.Outbox))
		}
	}
	if len(creates) != n {
		t.Errorf("%d services named by entries, want %d", len(creates), n)
	}
}

// TestChangelogRefusesChangeLargerThanAFrame: a service whose change-log
// entry would not fit in one log_entries frame is refused with 413
// change_too_large and nothing is stored, although its body is within the
// API's cap; the largest that is accepted makes an entry that fits in a
// frame. Before, such a service was stored and its entry stalled every
// node's follow.
func TestChangelogRefusesChangeLargerThanAFrame(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.pushApp()
	// Env values under 128 KiB each; '<' is one byte in the body and six in
	// the entry's JSON (\u003c).
	body := func(c byte, total int) []byte {
		env := map[string]string{}
		for i := 0; total > 0; i++ {
			k := min(total, 100_000)
			env[fmt.Sprintf("V%d", i)] = strings.Repeat(string(c), k)
			total -= k
		}
		raw, _ := json.Marshal(map[string]any{"bundle": "app", "command": []string{"./app"}, "env": env})
		return []byte(strings.ReplaceAll(string(raw), `\u003c`, "<"))
	}
	big := body('<', 200_000)
	if len(big) > DefaultMaxBodyBytes {
		t.Fatalf("test body %d bytes is over the API cap", len(big))
	}
	code, out := f.do(req{method: "PUT", path: "/api/v1/projects/default/services/big", ctype: "application/json", token: f.admin, body: big})
	if code != 413 || out["code"] != "change_too_large" {
		t.Fatalf("oversized change: %d %v, want 413 change_too_large", code, out)
	}
	if code, _ := f.json("GET", "/api/v1/projects/default/services/big", nil); code != 404 {
		t.Fatalf("refused service is stored: GET answered %d", code)
	}
	// A body at the API cap, plain bytes: the environment limits refuse it
	// before any entry is prepared, and it is not stored either.
	if code, out := f.do(req{method: "PUT", path: "/api/v1/projects/default/services/cap", ctype: "application/json", token: f.admin, body: body('a', DefaultMaxBodyBytes-200)}); code != 422 || out["code"] != "validation_failed" {
		t.Fatalf("body at the cap: %d %v, want 422 validation_failed", code, out)
	}
	// The largest accepted change: grow until refused. Each '<' takes six
	// bytes of the entry, so the environment stays under its limits while
	// the entry reaches its own.
	size, step := (changelog.MaxEntryBytes-4096)/6, 512/6
	grown := false
	for size+step < changelog.MaxEntryBytes/6 {
		code, out := f.do(req{method: "PUT", path: "/api/v1/projects/default/services/edge", ctype: "application/json", token: f.admin, body: body('<', size+step)})
		if code == 413 {
			break
		}
		if code != 201 && code != 200 {
			t.Fatalf("PUT of %d env bytes answered %d %v", size+step, code, out)
		}
		size, grown = size+step, true
	}
	if !grown {
		t.Fatalf("no change near the entry limit was accepted")
	}
	entries := f.changelogEntries()
	last := entries[len(entries)-1]
	if last.EntityType != "service" {
		t.Fatalf("newest entry is %s, want the service", last.EntityType)
	}
	frameBody, _ := json.Marshal(node.LogEntries{FromSeq: last.Seq, Entries: []node.LogEntry{last}})
	frame, _ := json.Marshal(node.Envelope{V: node.Version, Type: node.TypeLogEntries, ID: "msg_" + strings.Repeat("Z", 26), Body: frameBody})
	if len(frame) > node.MaxMessageBytes {
		t.Fatalf("largest accepted change makes a %d-byte frame, limit %d", len(frame), node.MaxMessageBytes)
	}
}

// TestPolicyBindingLargerThanAFrameRefused: a binding whose config makes a
// change-log entry too large for one frame is refused with 413
// change_too_large before it is stored. Before, it was stored and its entry
// failed to append.
func TestPolicyBindingLargerThanAFrameRefused(t *testing.T) {
	t.Parallel()
	f := newPolicyFixture(t)
	code, out := f.do(req{method: "POST", path: "/api/v1/modules", ctype: "application/wasm", token: f.admin, body: wasmtest.BuildGo(t, "examples/policies/require-digest")})
	if code != 201 {
		t.Fatalf("push module: %d %v", code, out)
	}
	// '<' is one byte in the body and six in the entry (\u003c), twice over
	// for a config held as a JSON string.
	body := `{"hook":"service.apply","module":"` + out["digest"].(string) + `","config":{"v":"` + strings.Repeat("<", 200_000) + `"}}`
	code, out = f.do(req{method: "POST", path: "/api/v1/policy-bindings", ctype: "application/json", token: f.admin, body: []byte(body)})
	if code != 413 || out["code"] != "change_too_large" {
		t.Fatalf("oversized binding: %d %v, want 413 change_too_large", code, out)
	}
	if code, out := f.json("GET", "/api/v1/policy-bindings", nil); code != 200 || len(out["items"].([]any)) != 0 {
		t.Fatalf("bindings after the refusal: %d %v, want none", code, out)
	}
}

// TestChangelogFilters reads the change log as an auditor with filters: the project entries
// alone, newest first, two at a time, going on from next_seq until the scan reached the start;
// a bad order or a range upside down is refused (422 validation_failed).
func TestChangelogFilters(t *testing.T) {
	f := newFixture(t)
	for _, p := range []string{"alpha", "beta", "gamma"} {
		if code, out := f.json("PUT", "/api/v1/projects/"+p, nil); code != 201 {
			t.Fatalf("create project %s: %d %v", p, code, out)
		}
		// A token between them: an entry of another kind.
		if code, out := f.json("POST", "/api/v1/tokens", map[string]any{"name": "t-" + p, "scopes": []string{"services:read"}}); code != 201 {
			t.Fatalf("create a token: %d %v", code, out)
		}
	}
	f.changelogCleared()
	var want []int64
	all := f.changelogEntries()
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].EntityType == "project" {
			want = append(want, all[i].Seq)
		}
	}
	if len(want) < 3 || len(want) == len(all) {
		t.Fatalf("the log holds %d project entries of %d: the filter would not be seen working", len(want), len(all))
	}
	var got []int64
	until := int64(0)
	for range 10 {
		path := "/api/v1/changelog?entity_type=project&order=desc&limit=2"
		if until > 0 {
			path += fmt.Sprintf("&until_seq=%d", until)
		}
		code, out := f.json("GET", path, nil)
		if code != 200 {
			t.Fatalf("GET %s: %d %v", path, code, out)
		}
		raw, _ := json.Marshal(out["entries"])
		var page []node.LogEntry
		if err := json.Unmarshal(raw, &page); err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			if e.EntityType != "project" {
				t.Fatalf("a %s entry passed the project filter", e.EntityType)
			}
			got = append(got, e.Seq)
		}
		next, _ := out["next_seq"].(float64)
		if next == 0 {
			break
		}
		until = int64(next)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("project entries newest first, two a page: %v, want %v", got, want)
	}
	for _, q := range []string{"order=sideways", "from_seq=5&until_seq=2"} {
		if code, out := f.json("GET", "/api/v1/changelog?"+q, nil); code != 422 || out["code"] != "validation_failed" {
			t.Errorf("GET /api/v1/changelog?%s: %d %v, want 422 validation_failed", q, code, out)
		}
	}
}
