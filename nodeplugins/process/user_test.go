package process

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/sdk/runtime"
)

// procIDs returns the real uid and gid lines of pid's /proc status ("Uid:\t<r>\t<e>\t...").
func procIDs(t *testing.T, pid int) (uid, gid string) {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			uid = f[1]
		} else if len(f) > 1 && f[0] == "Gid:" {
			gid = f[1]
		}
	}
	return uid, gid
}

// TestStartAsUser: a StartRequest's User runs the workload's process under that uid and gid
// (numbers, or a user name of the host), and a malformed or unknown user is refused before
// anything starts.
func TestStartAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test switches users and must run as root (the test environment does)")
	}
	t.Parallel()
	f := newFixture(t)
	d := f.driver()
	start := func(id, user string) (*runtime.StartResponse, error) {
		r, err := d.Start(context.Background(), &runtime.StartRequest{WorkloadID: id, Command: []string{"/bin/sleep", "600"},
			Env: map[string]string{"PATH": "/usr/bin:/bin"}, WorkDir: "/", LogPath: f.logPath(id), User: user})
		if err == nil {
			pid := r.State.PID
			t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
		}
		return r, err
	}
	for _, tc := range []struct{ id, user, uid, gid string }{
		{"wl_num", "65534:65534", "65534", "65534"},
		{"wl_uid", "4242", "4242", "4242"},
		{"wl_name", "nobody", "65534", "65534"},
		{"wl_self", "", "0", "0"},
	} {
		r, err := start(tc.id, tc.user)
		if err != nil {
			t.Fatalf("start as %q: %v", tc.user, err)
		}
		if uid, gid := procIDs(t, r.State.PID); uid != tc.uid || gid != tc.gid {
			t.Errorf("user %q: process runs as uid %s gid %s, want %s:%s", tc.user, uid, gid, tc.uid, tc.gid)
		}
	}
	for _, bad := range []string{"no-such-user-berth", "x:1", "1:x"} {
		if _, err := start("wl_bad", bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("user %q: %v, want ErrInvalidRequest", bad, err)
		}
	}
}
