package reconcile

import (
	"os"
	"path/filepath"
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
		"BERTH_VOLUME_DATA": vol, "BERTH_VOLUME_WAL_LOGS": filepath.Join(data, "volumes", "shop", "db", "wal-logs")}
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
