package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/operations"
)

// commitBackup runs one backup of service's binding db in project default to its commit, as
// the Corestore executor does (claim, begin, upload, commit), and returns the backup id.
func commitBackup(t *testing.T, f *fixture, service, key string) string {
	t.Helper()
	ctx := context.Background()
	p, err := f.api.cfg.Catalog.GetProject(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	m, q := f.api.cfg.Backups.Manager, f.api.cfg.Orchestration.Operations
	rec, _, err := m.Request(ctx, backups.BackupRequest{ProjectID: p.ID, Service: service, Binding: "db", Kind: "postgres", IdempotencyKey: key})
	if err != nil {
		t.Fatal(err)
	}
	got, err := q.Claim(ctx, "provider:corestore", 1, func(o *operations.Operation) bool { return o.ID == rec.OperationID })
	if err != nil || len(got) != 1 {
		t.Fatalf("claim the backup: %v %v", got, err)
	}
	h := operations.Holder{NodeID: got[0].Operation.NodeID, Token: got[0].LeaseToken, Fence: got[0].Operation.Fence}
	archive := []byte("PGDMP an archive of " + service)
	if _, err := m.Begin(ctx, rec.OperationID, h); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Upload(ctx, rec.OperationID, h, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive)
	if _, err := m.Commit(ctx, rec.OperationID, h, backups.Declared{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(archive))}, 24); err != nil {
		t.Fatal(err)
	}
	return rec.ID
}

// TestBackupRoutes drives backup create, ls, get and restore through the HTTP API: a
// binding the service does not declare is 422 backup_nothing_to_back, a backup that did not
// succeed is not restorable, a running target is refused unless while_running or
// into_scratch, and an unknown backup is 404.
func TestBackupRoutes(t *testing.T) {
	t.Parallel()
	f := newFullFixture(t)
	seedServiceAndNode(t, f)
	const svc = "/api/v1/projects/default/services/"
	if code, out := f.json("POST", svc+"web/backups", map[string]any{"binding": "files"}); code != 422 || out["code"] != "backup_nothing_to_back" {
		t.Fatalf("unknown binding: %d %v", code, out)
	}
	if code, out := f.json("POST", svc+"nope/backups", nil); code != 404 || out["code"] != "service_not_found" {
		t.Fatalf("unknown service: %d %v", code, out)
	}
	code, out := f.json("POST", svc+"web/backups", nil)
	if code != 202 {
		t.Fatalf("create: %d %v", code, out)
	}
	items := out["items"].([]any)
	pending := items[0].(map[string]any)
	if len(items) != 1 || pending["state"] != "pending" || pending["binding"] != "db" || pending["operation_id"] == "" {
		t.Fatalf("created %v", items)
	}
	if code, out := f.json("POST", "/api/v1/projects/default/backups/"+pending["id"].(string)+"/restore", map[string]any{"into_scratch": true}); code != 409 || out["code"] != "backup_not_restorable" {
		t.Fatalf("restore of a pending backup: %d %v", code, out)
	}
	id := commitBackup(t, f, "web", "k1")
	code, out = f.json("GET", "/api/v1/projects/default/backups?service=web", nil)
	if code != 200 || len(out["items"].([]any)) != 2 {
		t.Fatalf("ls: %d %v", code, out)
	}
	if code, out := f.json("GET", "/api/v1/projects/default/backups/"+id, nil); code != 200 || out["state"] != "succeeded" || out["digest"] == "" {
		t.Fatalf("get: %d %v", code, out)
	}
	if code, out := f.json("GET", "/api/v1/projects/default/backups/bkp_nope", nil); code != 404 || out["code"] != "backup_not_found" {
		t.Fatalf("get unknown: %d %v", code, out)
	}
	restore := "/api/v1/projects/default/backups/" + id + "/restore"
	if code, out := f.json("POST", restore, map[string]any{}); code != 409 || out["code"] != "restore_target_running" {
		t.Fatalf("restore into the running service: %d %v", code, out)
	}
	if code, out := f.json("POST", restore, map[string]any{"into": "worker"}); code != 404 || out["code"] != "service_not_found" {
		t.Fatalf("restore into a missing service: %d %v", code, out)
	}
	if code, out := f.json("POST", restore, map[string]any{"while_running": true}); code != 202 || out["kind"] != "restore" {
		t.Fatalf("restore while running: %d %v", code, out)
	}
	if code, out := f.json("POST", restore, map[string]any{"into_scratch": true}); code != 202 {
		t.Fatalf("restore into scratch: %d %v", code, out)
	}
}

// TestServiceBackupBlock: an apply carries the service's backup block and answers it back; a
// bad cron, keep or drill is 422 backup_schedule_invalid and changes nothing; a backup
// requested on demand keeps the service's keep on its record; and a drill of one backup is
// queued for that backup (404 for an unknown one, 409 for one that did not succeed).
func TestServiceBackupBlock(t *testing.T) {
	t.Parallel()
	f := newFullFixture(t)
	seedServiceAndNode(t, f)
	const svc = "/api/v1/projects/default/services/"
	for _, bad := range []map[string]any{
		{"cron": "every day"}, {"cron": "0 3 * * *", "keep": -1}, {"keep": 1001}, {"drill": "hourly"},
	} {
		code, out := f.json("PUT", svc+"sched", map[string]any{"bundle": "app", "command": []string{"./app"}, "backup": bad})
		if code != 422 || out["code"] != "backup_schedule_invalid" {
			t.Fatalf("backup %v: %d %v", bad, code, out)
		}
	}
	if code, out := f.json("GET", svc+"sched", nil); code != 404 {
		t.Fatalf("a refused apply made the service: %d %v", code, out)
	}
	block := map[string]any{"cron": "0 3 * * *", "keep": 3, "drill": "weekly"}
	code, out := f.json("PUT", svc+"sched", map[string]any{"bundle": "app", "command": []string{"./app"}, "backup": block})
	if code != 201 {
		t.Fatalf("apply: %d %v", code, out)
	}
	if code, out = f.json("GET", svc+"sched", nil); code != 200 || fmt.Sprint(out["backup"]) != fmt.Sprint(map[string]any{"cron": "0 3 * * *", "keep": float64(3), "drill": "weekly"}) {
		t.Fatalf("get: %d %v", code, out["backup"])
	}
	// The fixture's web service declares the binding db; give it a block and back it up.
	code, out = f.json("GET", svc+"web", nil)
	if code != 200 {
		t.Fatalf("get web: %d %v", code, out)
	}
	spec := map[string]any{"bundle": out["bundle"], "command": out["command"], "bindings": out["bindings"], "backup": map[string]any{"keep": 2}}
	if code, out := f.json("PUT", svc+"web", spec); code != 200 {
		t.Fatalf("apply web: %d %v", code, out)
	}
	code, out = f.json("POST", svc+"web/backups", nil)
	if code != 202 {
		t.Fatalf("create: %d %v", code, out)
	}
	id := out["items"].([]any)[0].(map[string]any)["id"].(string)
	rec, err := f.api.cfg.Backups.Manager.Get(context.Background(), out["items"].([]any)[0].(map[string]any)["project_id"].(string), id)
	if err != nil || rec.Keep != 2 {
		t.Fatalf("record keep %+v, %v; want 2", rec, err)
	}
	if code, out := f.json("POST", "/api/v1/projects/default/backups/"+id+"/drill", nil); code != 409 || out["code"] != "backup_not_restorable" {
		t.Fatalf("drill of a pending backup: %d %v", code, out)
	}
	if code, out := f.json("POST", "/api/v1/projects/default/backups/bkp_nope/drill", nil); code != 404 || out["code"] != "backup_not_found" {
		t.Fatalf("drill of an unknown backup: %d %v", code, out)
	}
	done := commitBackup(t, f, "web", "drilled")
	code, out = f.json("POST", "/api/v1/projects/default/backups/"+done+"/drill", nil)
	if code != 202 || out["kind"] != "drill" {
		t.Fatalf("drill: %d %v", code, out)
	}
}
