package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/abi/node"
)

// TestWorkloadEnv gives a workload PATH, HOME and TMPDIR unless its service sets them, creates its
// volumes under DATA/volumes/<project>/<service>/<name> and names them in BERTH_VOLUME_<NAME>.
func TestWorkloadEnv(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	l := &Loop{cfg: Config{DataDir: data}}
	dir := filepath.Join(data, "workloads", "wl_a")
	app := filepath.Join(dir, "app")
	spec := &node.WorkloadSpec{WorkloadID: "wl_a", Project: "shop", Service: "db",
		Volumes: []node.Volume{{Name: "data"}, {Name: "wal-logs"}}, Env: map[string]string{"GREETING": "hi"}}
	env, err := l.workloadEnv(spec, dir, app)
	if err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(data, "volumes", "shop", "db", "data")
	want := map[string]string{"PATH": DefaultPath, "HOME": vol, "TMPDIR": filepath.Join(dir, "tmp"), "GREETING": "hi",
		"BERTH_VOLUME_DATA": vol, "BERTH_VOLUME_WAL_LOGS": filepath.Join(data, "volumes", "shop", "db", "wal-logs"),
		"BERTH_APP_DIR": filepath.Join(data, "apps", "shop", "db")}
	if len(env) != len(want) {
		t.Fatalf("env %v, want %v", env, want)
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for _, d := range []string{vol, want["BERTH_VOLUME_WAL_LOGS"], want["TMPDIR"]} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v", d, st, err)
		}
	}
	// BERTH_APP_DIR is a stable path: a link to the app directory of the workload started last.
	if got, err := os.Readlink(want["BERTH_APP_DIR"]); err != nil || got != app {
		t.Fatalf("app link -> %q, %v; want %q", got, err, app)
	}
	app2 := filepath.Join(data, "workloads", "wl_a2", "app")
	spec2 := &node.WorkloadSpec{WorkloadID: "wl_a2", Project: "shop", Service: "db"}
	if env, err := l.workloadEnv(spec2, filepath.Dir(app2), app2); err != nil || env["BERTH_APP_DIR"] != want["BERTH_APP_DIR"] {
		t.Fatalf("second workload: env %v, err %v", env, err)
	}
	if got, err := os.Readlink(want["BERTH_APP_DIR"]); err != nil || got != app2 {
		t.Fatalf("after the second start the app link -> %q, %v; want %q", got, err, app2)
	}
	if st, err := os.Stat(filepath.Join(data, "apps", "shop")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("apps directory: %v %v", st, err)
	}
	// A container workload has no app directory of ours: no link, no variable.
	spec2 = &node.WorkloadSpec{WorkloadID: "wl_img", Project: "shop", Service: "img", Image: "registry.test/shop/img@sha256:aa"}
	if env, err := l.workloadEnv(spec2, dir, app); err != nil || env["BERTH_APP_DIR"] != "" {
		t.Fatalf("container workload: env %v, err %v", env, err)
	}
	if _, err := os.Lstat(AppLink(data, "shop", "img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("container workload got an app link: %v", err)
	}
	// A service's own PATH and HOME win; without volumes HOME is the app directory.
	spec = &node.WorkloadSpec{WorkloadID: "wl_b", Project: "shop", Service: "web", Env: map[string]string{"PATH": "/opt/bin"}}
	if env, err = l.workloadEnv(spec, dir, app); err != nil || env["PATH"] != "/opt/bin" || env["HOME"] != app {
		t.Fatalf("env %v, err %v", env, err)
	}
	// A volume name that could leave the volumes directory is refused.
	spec = &node.WorkloadSpec{WorkloadID: "wl_c", Project: "shop", Service: "web", Volumes: []node.Volume{{Name: "../x"}}}
	if _, err := l.workloadEnv(spec, dir, app); err == nil {
		t.Fatal("a volume named ../x was accepted")
	}
}

// TestPurgeVolumesBeforeAcknowledging: a service named in purge_volumes keeps its volumes while
// a workload of it is still in the desired state; once none is, the pass removes
// DATA/volumes/<project>/<service> before it records the revision as applied, leaves other
// services' volumes alone, withholds the acknowledgement when a purge fails, and purges again
// after an agent restart that found the directory back (docs/node-protocol.md section 6.7).
func TestPurgeVolumesBeforeAcknowledging(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t)
	l := h.loop(nil)
	db := spec("wl_db", func(s *node.WorkloadSpec) {
		s.Project, s.Service, s.ServiceID, s.Volumes = "shop", "db", "svc_db", []node.Volume{{Name: "data"}}
	})
	web := spec("wl_web", func(s *node.WorkloadSpec) {
		s.Project, s.Service, s.ServiceID, s.Volumes = "shop", "web", "svc_web", []node.Volume{{Name: "cache"}}
	})
	desire := func(purge []node.VolumePurge, specs ...node.WorkloadSpec) {
		t.Helper()
		h.rev++
		raw, err := json.Marshal(node.DesiredState{Rev: h.rev, Spec: node.Spec{Workloads: specs, PurgeVolumes: purge}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := h.store.StoreSnapshot(ctx, h.rev, raw, h.clk.Now()); err != nil || !ok {
			t.Fatalf("store snapshot: %v %v", ok, err)
		}
	}
	applied := func() int64 {
		t.Helper()
		rev, err := h.store.AppliedRev(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	dbVol := filepath.Join(h.dir, "volumes", "shop", "db")
	webVol := filepath.Join(h.dir, "volumes", "shop", "web", "cache")
	desire(nil, db, web)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dbVol, "data", "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	purge := []node.VolumePurge{{ProjectID: "prj_1", Project: "shop", ServiceID: "svc_db", Service: "db"}}

	// Stopping, still in the desired state: the volume stays, the revision is acknowledged.
	stopped := db
	stopped.DesiredStatus = node.DesiredStopped
	desire(purge, stopped, web)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dbVol, "data", "kept")); err != nil || applied() != h.rev {
		t.Fatalf("while its workload stops: volume %v, applied %d of %d", err, applied(), h.rev)
	}

	// Left out: removed, then purged, then acknowledged.
	desire(purge, web)
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dbVol); !errors.Is(err, os.ErrNotExist) || applied() != h.rev {
		t.Fatalf("after the removal: volume dir %v, applied %d of %d", err, applied(), h.rev)
	}
	if _, err := os.Stat(webVol); err != nil {
		t.Fatalf("another service's volume went too: %v", err)
	}

	// An agent that restarts finds the directory back (it died before purging): purged again.
	if err := os.MkdirAll(filepath.Join(dbVol, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.pass(h.loop(nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dbVol); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after the restart: %v", err)
	}

	// A purge that fails withholds the acknowledgement.
	before := applied()
	desire([]node.VolumePurge{{Project: "..", Service: "db", ServiceID: "svc_x"}}, web)
	if err := h.pass(l); err == nil || applied() != before {
		t.Fatalf("a purge of ../db: err %v, applied %d (was %d)", err, applied(), before)
	}
}

// TestProcessWorkloadHandedToItsUser: with a workload user, a process workload's start names that
// user's uid:gid, its work directory and volumes are owned by it and its data directory path is
// searchable; a service's own user wins; a container workload's user goes to its driver as
// written.
func TestProcessWorkloadHandedToItsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test hands directories to another user and must run as root (the test environment does)")
	}
	t.Parallel()
	h := newHarness(t)
	if err := os.Chmod(h.dir, 0o700); err != nil { // as enrollment leaves it
		t.Fatal(err)
	}
	l, err := New(Config{Store: h.store, Driver: h.drv, DataDir: h.dir, Now: h.clk.Now, WorkloadUser: "65534:65534"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cfg.Prober.Close)
	owned := func(p string, uid int) {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
			t.Errorf("%s owned by uid %d, want %d", p, st.Uid, uid)
		}
	}
	db := spec("wl_db", func(s *node.WorkloadSpec) {
		s.Project, s.Service, s.ServiceID, s.Volumes = "shop", "db", "svc_db", []node.Volume{{Name: "data"}}
	})
	own := spec("wl_own", func(s *node.WorkloadSpec) {
		s.Project, s.Service, s.ServiceID, s.User = "shop", "own", "svc_own", "4242:4242"
	})
	ctr := spec("wl_ctr", func(s *node.WorkloadSpec) {
		s.Project, s.Service, s.ServiceID, s.Driver, s.Image, s.User = "shop", "ctr", "svc_ctr", "containerd", "sha256:"+strings.Repeat("a", 64), "1000"
	})
	h.desire(db, own, ctr)
	_ = h.pass(l) // the container workload cannot be prepared here; the others start
	users := map[string]string{}
	h.mem.mu.Lock()
	for _, s := range h.mem.starts {
		users[s.WorkloadID] = s.User
	}
	h.mem.mu.Unlock()
	if users["wl_db"] != "65534:65534" || users["wl_own"] != "4242:4242" {
		t.Fatalf("start users %v", users)
	}
	owned(filepath.Join(h.dir, "workloads", "wl_db"), 65534)
	owned(filepath.Join(h.dir, "workloads", "wl_db", "tmp"), 65534)
	owned(filepath.Join(h.dir, "volumes", "shop", "db", "data"), 65534)
	owned(filepath.Join(h.dir, "workloads", "wl_own"), 4242)
	for _, p := range []string{h.dir, filepath.Join(h.dir, "workloads"), filepath.Join(h.dir, "volumes"), filepath.Join(h.dir, "volumes", "shop"),
		filepath.Join(h.dir, "volumes", "shop", "db")} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o001 == 0 || fi.Mode().Perm()&0o004 != 0 {
			t.Errorf("%s: mode %v %v, want searchable and not readable by others", p, fi.Mode().Perm(), err)
		}
	}
	if u, ok := users["wl_ctr"]; ok && u != "1000" {
		t.Errorf("container workload's user %q, want 1000 as written", u)
	}
}
