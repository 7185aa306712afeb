package reconcile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/berthhq/berth/abi/node"
)

// DefaultWorkloadUser is the system user process workloads run as when the agent runs as root
// and their service names no user (docs/node-protocol.md section 6.7); `berth-agent install`
// and `berth-agent run` create it when it is missing.
const DefaultWorkloadUser = "berth-workload"

// owner is a resolved host identity.
type owner struct{ uid, gid int }

// runAs returns the user a process workload of spec runs as: its service's user, else
// [Config.WorkloadUser]; ok=false for none (the agent's own user) and for workloads of other
// drivers, whose user the driver resolves inside the image. name is "uid" or "uid:gid" or a
// host user name; an unknown name is an error.
func (l *Loop) runAs(spec *node.WorkloadSpec) (owner, bool, error) {
	if spec.Driver != "" && spec.Driver != "process" {
		return owner{}, false, nil
	}
	name := spec.User
	if name == "" {
		name = l.cfg.WorkloadUser
	}
	if name == "" {
		return owner{}, false, nil
	}
	o, err := lookupOwner(name)
	if err != nil {
		return owner{}, false, fmt.Errorf("user %q of %s/%s: %w", name, spec.Project, spec.Service, err)
	}
	return o, true, nil
}

// lookupOwner resolves "uid", "uid:gid" or a user name of this host.
func lookupOwner(name string) (owner, error) {
	u, g, hasGroup := strings.Cut(name, ":")
	uid, err := strconv.Atoi(u)
	switch {
	case err == nil && hasGroup:
		gid, err := strconv.Atoi(g)
		if err != nil || uid < 0 || gid < 0 {
			return owner{}, errors.New("want uid, uid:gid or a user name")
		}
		return owner{uid, gid}, nil
	case err == nil:
		if pw, err := user.LookupId(u); err == nil {
			gid, _ := strconv.Atoi(pw.Gid)
			return owner{uid, gid}, nil
		}
		return owner{uid, uid}, nil
	case hasGroup:
		return owner{}, errors.New("want uid, uid:gid or a user name")
	}
	pw, err := user.Lookup(name)
	if err != nil {
		return owner{}, err
	}
	uid, err1 := strconv.Atoi(pw.Uid)
	gid, err2 := strconv.Atoi(pw.Gid)
	if err1 != nil || err2 != nil {
		return owner{}, fmt.Errorf("user %q has no numeric ids", name)
	}
	return owner{uid, gid}, nil
}

// handOver gives o the workload directory dir (everything in it, the app and TMPDIR included)
// and the volume directories vols, and lets o reach them: the data directory, its parents,
// workloads/ and the volumes' parents gain search permission for others (never read: every file
// the agent keeps there is 0600 and every other directory 0700). A volume is handed over with its
// contents only when it is not o's yet (the first start under o), so later starts cost one
// chown each.
func (l *Loop) handOver(o owner, dir string, vols []string) error {
	var paths []string
	for p := l.cfg.DataDir; ; p = filepath.Dir(p) { // the data directory and every parent
		paths = append(paths, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	paths = append(paths, filepath.Dir(dir))
	for _, v := range vols {
		for p := filepath.Dir(v); len(p) > len(l.cfg.DataDir); p = filepath.Dir(p) {
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("hand over %s: %w", p, err)
		}
		if perm := fi.Mode().Perm(); perm&0o001 == 0 {
			if err := os.Chmod(p, perm|0o011); err != nil {
				return fmt.Errorf("hand over %s: %w", p, err)
			}
			l.log.Info("directory made searchable for the workload user", "path", p, "mode", fmt.Sprintf("%04o", perm|0o011))
		}
	}
	if err := chownTree(dir, o); err != nil {
		return err
	}
	for _, v := range vols {
		fi, err := os.Lstat(v)
		if err != nil {
			return fmt.Errorf("hand over volume %s: %w", v, err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == o.uid && int(st.Gid) == o.gid {
			continue
		}
		if err := chownTree(v, o); err != nil {
			return err
		}
	}
	return nil
}

// chownTree changes the owner of root and everything under it, links themselves not followed.
func chownTree(root string, o owner) error {
	return filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("hand over %s: %w", p, err)
		}
		if err := os.Lchown(p, o.uid, o.gid); err != nil {
			return fmt.Errorf("hand over %s: %w", p, err)
		}
		return nil
	})
}
