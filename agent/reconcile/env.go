package reconcile

import (
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

// VolumeEnv is the variable that names volume name's directory: BERTH_VOLUME_<NAME>, the name
// upper-cased with '-' as '_'.
func VolumeEnv(name string) string {
	return "BERTH_VOLUME_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// workloadEnv returns the environment of spec's workload beside the variables the start adds
// (PORT, HOST, BERTH_*): the service's own, then, where it sets none, PATH ([DefaultPath]),
// HOME (the first volume's directory, else the app directory) and TMPDIR (dir/tmp, emptied by
// the workload's removal). It creates the volume directories (0700) and TMPDIR, and sets
// BERTH_VOLUME_<NAME> for each volume of a process workload.
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
	maps.Copy(env, spec.Env)
	return env, nil
}
