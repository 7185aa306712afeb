package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// backupAPI serves the backup routes of project shop for `berth backup`.
type backupAPI struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (f *backupAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	switch p := r.URL.Path; {
	case r.Method == "POST" && p == "/api/v1/projects/shop/services/web/backups":
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		answer(w, 202, client.List[client.Backup]{Items: []client.Backup{{ID: "bkp_1", Service: "web", Binding: "db", State: "pending", OperationID: "op_1"}}})
	case r.Method == "GET" && p == "/api/v1/projects/shop/backups" && r.URL.Query().Get("service") == "web":
		answer(w, 200, client.List[client.Backup]{Items: []client.Backup{
			{ID: "bkp_2", Service: "web", Binding: "db", Kind: "postgres", State: "succeeded", Size: 4096, Digest: "sha256:" + strings.Repeat("ab", 32), CreatedAt: at,
				Drill: &client.BackupDrill{Result: "failed", At: at.Add(time.Hour), Table: "public.orders"}},
			{ID: "bkp_1", Service: "web", Binding: "db", Kind: "postgres", State: "failed", FailedStep: "upload", CreatedAt: at.Add(-time.Hour)},
		}})
	case r.Method == "POST" && p == "/api/v1/projects/shop/backups/bkp_2/restore":
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := r.Body.Read(buf)
		b.Write(buf[:n])
		f.bodies = append(f.bodies, b.String())
		if strings.Contains(b.String(), `"while_running"`) || strings.Contains(b.String(), `"into_scratch"`) {
			answer(w, 202, client.RestoreAccepted{OperationID: "op_9", State: "queued", Kind: "restore"})
			return
		}
		problem(w, 409, "restore_target_running", "the target service is running; stop it or pass while_running")
	default:
		problem(w, 404, "not_found", p)
	}
}

// TestBackupCommands: create sends the idempotency key, ls prints state with the failed
// step, digest and the last drill with its table, restore refuses a running target by code
// and passes --into-scratch.
func TestBackupCommands(t *testing.T) {
	t.Parallel()
	f := &backupAPI{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c := newCLI(t)
	c.env["BERTH_SERVER"], c.env["BERTH_TOKEN"] = srv.URL, "brt_good"
	if out := c.ok("", "backup", "create", "shop/web", "--binding", "db", "--idempotency-key", "nightly-1"); !strings.Contains(out, "bkp_1\tweb/db\tpending\toperation op_1") {
		t.Errorf("create: %q", out)
	}
	out := c.ok("", "backup", "ls", "shop/web")
	if !strings.Contains(out, "bkp_2   web       db        postgres   succeeded        4096   sha256:abababababab   2026-12-01T03:00:00Z   failed 2026-12-01T04:00:00Z (public.orders)\n") ||
		!strings.Contains(out, "bkp_1   web       db        postgres   failed(upload)   0      -                     2026-12-01T02:00:00Z   -\n") {
		t.Errorf("ls: %q", out)
	}
	if _, errOut, code := c.run("", "backup", "restore", "bkp_2", "--into", "shop/web"); code == 0 || !strings.Contains(errOut, "restore_target_running") ||
		!strings.Contains(errOut, "--while-running") {
		t.Errorf("restore into a running service: exit %d, %q; want the code and the flag --while-running", code, errOut)
	}
	// Under -o json the refusal is JSON on stdout too, with the problem's code.
	out, _, code := c.run("", "-o", "json", "backup", "restore", "bkp_2", "--into", "shop/web")
	var refusal struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
			Status  int    `json:"status"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &refusal); code == 0 || err != nil || refusal.Error.Code != "restore_target_running" ||
		refusal.Error.Status != 409 || !strings.Contains(refusal.Error.Message, "--while-running") {
		t.Errorf("-o json restore into a running service: exit %d, stdout %q (%v)", code, out, err)
	}
	if out := c.ok("", "backup", "restore", "bkp_2", "--into", "shop/web", "--into-scratch"); out != "restore of bkp_2 queued: operation op_9\n" {
		t.Errorf("restore into scratch: %q", out)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) != 1 || f.keys[0] != "nightly-1" {
		t.Errorf("Idempotency-Key of create: %q", f.keys)
	}
	if len(f.bodies) != 3 || !strings.Contains(f.bodies[2], `"into":"web"`) || !strings.Contains(f.bodies[2], `"into_scratch":true`) {
		t.Errorf("restore bodies: %q", f.bodies)
	}
}
