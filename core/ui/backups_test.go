package ui_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
)

// backupsFixture is the fixture with the API's bindings and backups served: the service web
// declares the postgres binding db (a binding document as the Corestore provider leaves it),
// and one backup of it is committed and drilled (passed), as the executor would.
type backupsFixture struct {
	*fixture
	ops      *operations.Queue
	manager  *backups.Manager
	backupID string
}

func newBackupsFixture(t *testing.T) *backupsFixture {
	t.Helper()
	bf := &backupsFixture{}
	var st *store.Store
	bf.fixture = newFixtureAPI(t, false, nil, func(s *store.Store, _ *bundles.Store, c *api.Config) {
		fs, err := blobs.NewFS(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		st, bf.ops = s, c.Orchestration.Operations
		bf.manager = backups.New(backups.Config{Store: s, Queue: bf.ops, Blobs: fs})
		c.Backups = &api.BackupsConfig{Manager: bf.manager,
			Bindings: api.BindingKindsFunc(func(_ context.Context, _, service string) (map[string]abibackups.Kind, error) {
				if service == "web" {
					return map[string]abibackups.Kind{"db": abibackups.KindPostgres}, nil
				}
				return map[string]abibackups.Kind{}, nil
			})}
		c.Bindings = bindings.New(bindings.Config{Store: s, Queue: bf.ops})
	})
	ctx := context.Background()
	p, err := bf.cat.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, bindings.Collection, bindings.Binding{ID: p.ID + "/web/db", ProjectID: p.ID, Project: "default", Service: "web", Name: "db",
		Kind: "postgres", Generation: 1, State: "ready", Endpoint: "10.0.0.5:5432", Database: "default_web_db", User: "default_web_db", UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	rec, _, err := bf.manager.Request(ctx, backups.BackupRequest{ProjectID: p.ID, Service: "web", Binding: "db", Kind: "postgres", IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	h := bf.claim(t, rec.OperationID)
	archive := bytes.Repeat([]byte("PGDMP "), 1000)
	if _, err := bf.manager.Begin(ctx, rec.OperationID, h); err != nil {
		t.Fatal(err)
	}
	if _, err := bf.manager.Upload(ctx, rec.OperationID, h, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive)
	if _, err := bf.manager.Commit(ctx, rec.OperationID, h, backups.Declared{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(archive))}, 24); err != nil {
		t.Fatal(err)
	}
	op, err := bf.manager.DrillBackup(ctx, p.ID, rec.ID, "d1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bf.manager.RecordDrill(ctx, op.ID, bf.claim(t, op.ID), abibackups.DrillResult{Passed: true, Scratch: "db_drill", Dropped: true}); err != nil {
		t.Fatal(err)
	}
	bf.backupID = rec.ID
	return bf
}

// claim claims operation id as the Corestore executor would and returns its lease.
func (bf *backupsFixture) claim(t *testing.T, id string) operations.Holder {
	t.Helper()
	got, err := bf.ops.Claim(context.Background(), "provider:corestore", 1, func(o *operations.Operation) bool { return o.ID == id })
	if err != nil || len(got) != 1 {
		t.Fatalf("claim operation %s: %v %v", id, got, err)
	}
	return operations.Holder{NodeID: got[0].Operation.NodeID, Token: got[0].LeaseToken, Fence: got[0].Operation.Fence}
}

var idemRE = regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)

// TestBackupsPage sees the binding with its kind, state and user, its backup with size, state
// and passed drill, and a restore link; no credential or secret value.
func TestBackupsPage(t *testing.T) {
	bf := newBackupsFixture(t)
	checkReadOnlyPage(t, bf.fixture, readOnlyPage{path: "/ui/backups", nav: "/ui/backups",
		want: []string{"default/web · db", "<strong>postgres</strong>", `class="state ok">ready<`, `used by <a href="/ui/services/default/web">default/web</a>`,
			"<td>" + bf.backupID + "</td>", "5.9 KiB", `class="state ok">succeeded<`, `class="state ok">passed<`,
			`href="/ui/backups/default/` + bf.backupID + `/restore"`}})
}

// TestRestoreThroughTheAPI posts the restore form: into the running service it shows the
// API's restore_target_running beside the form as typed and queues nothing; into a scratch
// resource it shows the operation the API queued, and the same form posted again is the API's
// replay of it (one operation). Without the CSRF token nothing is queued; without a session
// the page is the login's.
func TestRestoreThroughTheAPI(t *testing.T) {
	bf := newBackupsFixture(t)
	path := "/ui/backups/default/" + bf.backupID + "/restore"
	anon := bf.browser(t)
	if resp, _ := get(t, anon, bf.srv.URL, path); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
		t.Fatalf("the restore page without a session answered %d, want 303 to /ui/login", resp.StatusCode)
	}
	hc := bf.browser(t)
	login(t, hc, bf.srv.URL, url.Values{"token": {bf.admin}})
	countRestores := func() int {
		ops, err := bf.api(t, bf.admin).ListOperations(context.Background(), "default")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range ops {
			if o.Kind == backups.KindRestore {
				n++
			}
		}
		return n
	}
	resp, body := get(t, hc, bf.srv.URL, path)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="restore-form"`) || !strings.Contains(body, `aria-current="page">Backups<`) {
		t.Fatalf("the restore page answered %d:\n%s", resp.StatusCode, body)
	}
	csrf := csrfRE.FindStringSubmatch(body)[1]
	if resp, _ := post(t, hc, bf.srv.URL, path, url.Values{"mode": {"running"}}); resp.StatusCode != http.StatusForbidden || countRestores() != 0 {
		t.Fatalf("a restore without its CSRF token answered %d and queued %d restores", resp.StatusCode, countRestores())
	}
	resp, body = post(t, hc, bf.srv.URL, path, url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]}, "into": {"web"}, "mode": {""}})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "<code>restore_target_running</code>") || !strings.Contains(body, `id="into" name="into" value="web"`) {
		t.Fatalf("a restore into the running service answered %d, want 409 with restore_target_running and the form as typed:\n%s", resp.StatusCode, body)
	}
	if n := countRestores(); n != 0 {
		t.Fatalf("a refused restore queued %d operations", n)
	}
	form := url.Values{"csrf": {csrf}, "idempotency_key": {idemRE.FindStringSubmatch(body)[1]}, "mode": {"scratch"}}
	resp, body = post(t, hc, bf.srv.URL, path, form)
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(body, `id="restore-accepted"`) {
		t.Fatalf("a restore into scratch answered %d:\n%s", resp.StatusCode, body)
	}
	first := regexp.MustCompile(`operation <code>([^<]+)</code>`).FindStringSubmatch(body)
	resp, body = post(t, hc, bf.srv.URL, path, form)
	again := regexp.MustCompile(`operation <code>([^<]+)</code>`).FindStringSubmatch(body)
	if resp.StatusCode != http.StatusAccepted || first == nil || again == nil || first[1] != again[1] || countRestores() != 1 {
		t.Fatalf("the same form posted twice answered %d with %v then %v and %d restore operations, want one", resp.StatusCode, first, again, countRestores())
	}
	for _, secret := range []string{envSecret, secretValue, bf.admin} {
		if strings.Contains(body, secret) {
			t.Fatalf("the restore page renders a secret value (%.8s...)", secret)
		}
	}
}
