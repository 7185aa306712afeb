package corestore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/internal/s3test"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// TestThirdPartyAppSurvivesLosingItsDatabase runs miniflux (a feed reader nobody here wrote)
// on a postgres binding through berthd, its agent and the corestore plugin, whose process
// also runs the backup executor. A category made through miniflux's API survives: berth
// backup create, the app's database dropped under it, berth backup restore --into
// --while-running, and miniflux serves the category again. Then berth backup drill proves
// the backup (berth backup ls shows passed), and a second backup whose archive is altered in
// the blob store drills failed.
func TestThirdPartyAppSurvivesLosingItsDatabase(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, map[string]any{"postgres": map[string]any{"admin_url": env.pg.URL("postgres")},
		"mongodb": map[string]any{"admin_url": env.ferret.URI()},
		"s3":      map[string]any{"endpoint": env.s3.Addr, "access_key": s3test.AccessKey, "secret_key": s3test.SecretKey, "admin_api": true}})
	c, ctx, data := p.c, t.Context(), p.data
	cli := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(filepath.Join(env.bin, "berth"), append([]string{"--server", p.url, "--token", p.berthd.Token, "--fingerprint", p.berthd.Fingerprint}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("berth %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
		}
		return out
	}
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, env.minifluxDir, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(ctx, "default", "miniflux", &buf); err != nil {
		t.Fatal(err)
	}
	// The binding's env mapped to miniflux's own variables in the command.
	spec := client.ServiceSpec{Bundle: "miniflux",
		Command:     []string{"/bin/sh", "-c", `DATABASE_URL="$BERTH_BINDING_DB_URL" LISTEN_ADDR="127.0.0.1:$PORT" exec ./miniflux.app`},
		Env:         map[string]string{"RUN_MIGRATIONS": "1", "CREATE_ADMIN": "1", "ADMIN_USERNAME": "admin", "ADMIN_PASSWORD": "correct-horse-battery"},
		HealthCheck: client.HealthCheck{Path: "/healthcheck"},
		Bindings:    []client.BindingSpec{{Name: "db", Kind: "postgres"}},
		// Nightly backups keeping 5; drills here are asked for by hand, so no drill schedule.
		Backup: &client.BackupSpec{Cron: "0 3 * * *", Keep: 5}}
	bad := spec
	bad.Backup = &client.BackupSpec{Cron: "0 3 * *"}
	if _, err := c.ApplyService(ctx, "default", "reader", bad); !client.IsCode(err, "backup_schedule_invalid") {
		t.Fatalf("apply with a four-field cron: %v, want backup_schedule_invalid", err)
	}
	if _, err := c.ApplyService(ctx, "default", "reader", spec); err != nil {
		t.Fatal(err)
	}
	var vars map[string]string
	proctest.WaitFor(t, 2*converge, "miniflux running on its binding", func() (bool, string) {
		for _, v := range workloadEnv(t, p.dir) {
			if v["BERTH_BINDING_DB_URL"] != "" {
				vars = v
				return true, ""
			}
		}
		return false, fmt.Sprint(len(workloadEnv(t, p.dir)), " workloads without the binding")
	})
	app := "http://127.0.0.1:" + vars["PORT"]
	hc := &http.Client{Timeout: 10 * time.Second}
	call := func(method, path string, body any) (int, []byte) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, app+path, rd)
		req.SetBasicAuth("admin", "correct-horse-battery")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, b
	}
	hasCategory := func() (bool, string) {
		code, b := call("GET", "/v1/categories", nil)
		return code == 200 && strings.Contains(string(b), `"title":"Kept across a lost database"`), fmt.Sprintf("%d %.200s", code, b)
	}
	proctest.WaitFor(t, converge, "miniflux answers its API", func() (bool, string) {
		code, b := call("GET", "/v1/me", nil)
		return code == 200, fmt.Sprintf("%d %.200s", code, b)
	})
	if code, b := call("POST", "/v1/categories", map[string]any{"title": "Kept across a lost database"}); code != 201 {
		t.Fatalf("create a category: %d %s", code, b)
	}
	if ok, why := hasCategory(); !ok {
		t.Fatalf("category not listed: %s", why)
	}

	// berth backup create, waited on through berth backup ls.
	var made []client.Backup
	if err := json.Unmarshal(cli("backup", "create", "default/reader", "-o", "json", "--idempotency-key", "first"), &made); err != nil || len(made) != 1 {
		t.Fatalf("backup create: %v %v", made, err)
	}
	first := made[0].ID
	waitBackupOf := func(service, id, what string, done func(b client.Backup) bool) client.Backup {
		t.Helper()
		var got client.Backup
		// Each look starts a CLI process, so it looks once a second rather than every
		// 100 ms: on a loaded machine those processes took the CPU the backup waited for.
		proctest.WaitForEvery(t, 3*time.Minute, time.Second, what, func() (bool, string) {
			var list []client.Backup
			if err := json.Unmarshal(cli("backup", "ls", service, "-o", "json"), &list); err != nil {
				return false, err.Error()
			}
			for _, b := range list {
				if b.ID == id {
					got = b
					return done(b), fmt.Sprintf("%s %s %s drill=%v", b.State, b.FailedStep, b.Error, b.Drill)
				}
			}
			return false, id + " not listed"
		})
		return got
	}
	waitBackup := func(id, what string, done func(b client.Backup) bool) client.Backup {
		t.Helper()
		return waitBackupOf("default/reader", id, what, done)
	}
	b1 := waitBackup(first, "first backup settled", func(b client.Backup) bool { return b.State == "succeeded" || b.State == "failed" })
	if b1.State != "succeeded" || b1.Size == 0 || len(b1.Figures.Items) == 0 {
		t.Fatalf("first backup: %+v", b1)
	}

	// The app's database is dropped while it runs.
	admin, err := pgx.Connect(ctx, env.pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := vars["BERTH_BINDING_DB_DATABASE"]
	if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := hasCategory(); ok {
		t.Fatal("miniflux still lists the category with its database dropped")
	}

	// berth backup restore --into, the app running.
	var acc client.RestoreAccepted
	if err := json.Unmarshal(cli("backup", "restore", first, "--into", "default/reader", "--while-running", "--idempotency-key", "r1", "-o", "json"), &acc); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 3*time.Minute, "restore operation settled", func() (bool, string) {
		ops, err := c.ListOperations(ctx, "default")
		if err != nil {
			return false, err.Error()
		}
		for _, o := range ops {
			if o.ID == acc.OperationID {
				return o.State == "succeeded" || o.State == "failed", o.State + " " + o.LastError
			}
		}
		return false, "operation not listed"
	})
	proctest.WaitFor(t, converge, "miniflux serves the category again", hasCategory)

	// berth backup drill proves the first backup.
	cli("backup", "drill", first, "--idempotency-key", "d1")
	b1 = waitBackup(first, "first backup drilled", func(b client.Backup) bool { return b.Drill != nil })
	if b1.Drill.Result != "passed" {
		t.Fatalf("drill of an intact backup: %+v", b1.Drill)
	}
	table := string(cli("backup", "ls", "default/reader"))
	if !strings.Contains(table, first) || !strings.Contains(table, "passed") {
		t.Fatalf("berth backup ls shows no passed drill for %s:\n%s", first, table)
	}

	// A second backup whose archive is altered in the blob store drills failed.
	if err := json.Unmarshal(cli("backup", "create", "default/reader", "-o", "json", "--idempotency-key", "second"), &made); err != nil || len(made) != 1 {
		t.Fatalf("backup create: %v %v", made, err)
	}
	second := made[0].ID
	if b := waitBackup(second, "second backup settled", func(b client.Backup) bool { return b.State == "succeeded" || b.State == "failed" }); b.State != "succeeded" {
		t.Fatalf("second backup: %+v", b)
	}
	corruptArchive(t, data, second)
	cli("backup", "drill", second, "--idempotency-key", "d2")
	b2 := waitBackup(second, "altered backup drilled", func(b client.Backup) bool { return b.Drill != nil })
	if b2.Drill.Result != "failed" {
		t.Fatalf("drill of an altered archive: %+v", b2.Drill)
	}
	table = string(cli("backup", "ls", "default/reader"))
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, second) && !strings.Contains(line, "failed") {
			t.Fatalf("berth backup ls does not show the altered backup's failed drill:\n%s", table)
		}
	}
	// The app is untouched by the drills.
	if ok, why := hasCategory(); !ok {
		t.Fatalf("after the drills: %s", why)
	}

	// A second service with a MongoDB and an S3 binding: each kind is backed up and drilled.
	buf.Reset()
	if _, _, err := bundle.Create(ctx, env.helloDir, &buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		t.Fatal(err)
	}
	assets := client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"},
		Bindings: []client.BindingSpec{{Name: "cache", Kind: "mongodb"}, {Name: "files", Kind: "s3"}}}
	if _, err := c.ApplyService(ctx, "default", "assets", assets); err != nil {
		t.Fatal(err)
	}
	byName := map[string]client.ServiceBinding{}
	proctest.WaitFor(t, 2*converge, "mongodb and s3 bindings ready", func() (bool, string) {
		bs, err := c.ListServiceBindings(ctx, "default", "assets")
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, b := range bs {
			byName[b.Name] = b
			if b.State == "ready" {
				ready++
			}
		}
		return ready == 2, fmt.Sprint(bs)
	})
	mc, err := mongo.Connect(options.Client().ApplyURI(env.ferret.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mc.Disconnect(context.Background()) }()
	docs := []any{bson.D{{Key: "_id", Value: 1}, {Key: "sku", Value: "kept"}}, bson.D{{Key: "_id", Value: 2}, {Key: "sku", Value: "also kept"}}}
	if _, err := mc.Database(byName["cache"].Database).Collection("items").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	s3c := env.s3.Client(t)
	for _, k := range []string{"a.txt", "dir/b.txt"} {
		body := "object " + k
		if _, err := s3c.PutObject(ctx, byName["files"].Database, k, strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var kinds []client.Backup
	if err := json.Unmarshal(cli("backup", "create", "default/assets", "-o", "json", "--idempotency-key", "assets"), &kinds); err != nil || len(kinds) != 2 {
		t.Fatalf("backup create assets: %v %v", kinds, err)
	}
	for _, k := range kinds {
		b := waitBackupOf("default/assets", k.ID, k.Binding+" backup settled", func(b client.Backup) bool { return b.State == "succeeded" || b.State == "failed" })
		if b.State != "succeeded" || len(b.Figures.Items) == 0 {
			t.Fatalf("%s backup: %+v", k.Kind, b)
		}
		cli("backup", "drill", k.ID, "--idempotency-key", "d-"+k.Binding)
	}
	for _, k := range kinds {
		b := waitBackupOf("default/assets", k.ID, k.Binding+" backup drilled", func(b client.Backup) bool { return b.Drill != nil })
		if b.Drill.Result != "passed" {
			t.Fatalf("drill of the %s backup: %+v", b.Kind, b.Drill)
		}
	}
	table = string(cli("backup", "ls"))
	for _, kind := range []string{"postgres", "mongodb", "s3"} {
		passed := false
		for _, line := range strings.Split(table, "\n") {
			passed = passed || (slices.Contains(strings.Fields(line), kind) && strings.Contains(line, "passed"))
		}
		if !passed {
			t.Errorf("berth backup ls shows no passed drill of a %s backup:\n%s", kind, table)
		}
	}
}

// corruptArchive flips one byte in the middle of backup id's archive file(s) under berthd's
// data directory (the filesystem blob store), keeping the size.
func corruptArchive(t *testing.T, data, id string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(data, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.Contains(path, id) || !strings.HasSuffix(path, ".archive") {
			return err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || st.Size() < 2 {
			return fmt.Errorf("archive %s: %v", path, err)
		}
		b := make([]byte, 1)
		off := st.Size() / 2
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		n++
		return f.Sync()
	})
	if err != nil || n == 0 {
		t.Fatalf("alter the archive of %s: %d files, %v", id, n, err)
	}
}
