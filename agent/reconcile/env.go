package reconcile

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/abi/node"
)

// DefaultPath is the PATH a workload gets when its service sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// VolumeDir is where the agent keeps volume name of service in project under dataDir
// (docs/node-protocol.md section 6.7): DATA/volumes/<project>/<service>/<name>. It outlives
// every workload of the service and the agent itself.
func VolumeDir(dataDir, project, service, name string) string {
	return filepath.Join(dataDir, "volumes", project, service, name)
}

// purgeVolumes removes the volume directories DATA/volumes/<project>/<service> of every service
// spec.PurgeVolumes names that has no workload left in spec (docs/node-protocol.md section 6.7).
// The caller calls it only after a pass whose actions all succeeded, so no workload outside spec
// remains on the node either. It is idempotent (a directory already gone is no error), so a
// pass repeated after an agent restart purges again before acknowledging.
func (l *Loop) purgeVolumes(spec node.Spec) error {
	if len(spec.PurgeVolumes) == 0 {
		return nil
	}
	held := map[string]bool{}
	for _, w := range spec.Workloads {
		held[w.ServiceID] = true
	}
	var errs []error
	for _, p := range spec.PurgeVolumes {
		if held[p.ServiceID] {
			continue // its workload is still stopping here; a later revision leaves it out
		}
		if !safeName(p.Project) || !safeName(p.Service) {
			errs = append(errs, fmt.Errorf("purge volumes of %q/%q: not a valid project and service name", p.Project, p.Service))
			continue
		}
		dir := filepath.Join(l.cfg.DataDir, "volumes", p.Project, p.Service)
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("purge volumes of %s/%s: %w", p.Project, p.Service, err))
			continue
		}
		l.log.Info("volumes purged: the service was deleted with --purge-volumes", "project", p.Project, "service", p.Service, "service_id", p.ServiceID)
	}
	return errors.Join(errs...)
}

// safeName reports whether s can be one element of a path under the data directory.
func safeName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\\x00")
}

// AppDirEnv names the stable path of a process workload's app directory ([AppLink]).
const AppDirEnv = "BERTH_APP_DIR"

// AppLink is the stable path of the app directory of service in project on this node
// (docs/node-protocol.md section 6.7): DATA/apps/<project>/<service>, a symbolic link the agent
// points at the app directory of the service's workload it started last. A workload's own app
// directory changes with every rollout and restart; this path does not, so an app that records
// absolute paths to its own files (a git hook calling the app's binary, say) records them here.
func AppLink(dataDir, project, service string) string {
	return filepath.Join(dataDir, "apps", project, service)
}

// linkAppDir points [AppLink] of spec's service at appDir, atomically (a new link renamed over
// the old one), so a reader sees the old directory or the new one, never none. The directory
// holding the links is 0755: a workload running as its own user follows its link.
func (l *Loop) linkAppDir(spec *node.WorkloadSpec, appDir string) (string, error) {
	if !safeName(spec.Project) || !safeName(spec.Service) {
		return "", fmt.Errorf("the app link of %q/%q: not a valid project and service name", spec.Project, spec.Service)
	}
	link := AppLink(l.cfg.DataDir, spec.Project, spec.Service)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return "", fmt.Errorf("create the app link of %s/%s: %w", spec.Project, spec.Service, err)
	}
	tmp := link + ".new-" + spec.WorkloadID
	_ = os.Remove(tmp) // left by a start that died between the two steps
	if err := os.Symlink(appDir, tmp); err != nil {
		return "", fmt.Errorf("create the app link of %s/%s: %w", spec.Project, spec.Service, err)
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("install the app link of %s/%s: %w", spec.Project, spec.Service, err)
	}
	return link, nil
}

// VolumeEnv is the variable that names volume name's directory: BERTH_VOLUME_<NAME>, the name
// upper-cased with '-' as '_'.
func VolumeEnv(name string) string {
	return "BERTH_VOLUME_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// workloadEnv returns the environment of spec's workload beside the variables the start adds
// (PORT, HOST, BERTH_*): the service's own, then, where it sets none, PATH ([DefaultPath]),
// HOME (the first volume's directory, else the app directory) and TMPDIR (dir/tmp, emptied by
// the workload's removal). It creates the volume directories (0700) and TMPDIR, sets
// BERTH_VOLUME_<NAME> for each volume, and for a workload run from a bundle (no image) of a
// named project and service points the service's [AppLink] at appDir and names it in
// BERTH_APP_DIR.
func (l *Loop) workloadEnv(spec *node.WorkloadSpec, dir, appDir string) (map[string]string, error) {
	env := make(map[string]string, len(spec.Env)+8)
	home := appDir
	for i, v := range spec.Volumes {
		vd := VolumeDir(l.cfg.DataDir, spec.Project, spec.Service, v.Name)
		if !node.ValidVolumeName(v.Name) || spec.Project == "" || spec.Service == "" || strings.Contains(spec.Project+spec.Service, "/") {
			return nil, fmt.Errorf("volume %q of %s/%s: not a valid volume", v.Name, spec.Project, spec.Service)
		}
		if err := os.MkdirAll(vd, 0o700); err != nil {
			return nil, fmt.Errorf("create volume %s of %s/%s: %w", v.Name, spec.Project, spec.Service, err)
		}
		env[VolumeEnv(v.Name)] = vd
		if i == 0 {
			home = vd
		}
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("create TMPDIR of %s: %w", spec.WorkloadID, err)
	}
	env["PATH"], env["HOME"], env["TMPDIR"] = DefaultPath, home, tmp
	if spec.Image == "" && spec.Project != "" && spec.Service != "" {
		link, err := l.linkAppDir(spec, appDir)
		if err != nil {
			return nil, err
		}
		env[AppDirEnv] = link
	}
	maps.Copy(env, spec.Env)
	return env, nil
}
