package deploy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/slots"
	"github.com/berthhq/berth/sdk/client"
)

// This file holds the shape rules of a declared service (an api.put): each field alone and the
// fields together, before anything is read from the store. The messages are the API's
// (docs/api.md section 4), answered as 422 validation_failed.

var (
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
	// Label keys become document field names in the store, where "." and "$"
	// are not allowed, so they are refused here rather than by the store.
	labelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9_/-]{0,61}[a-z0-9])?$`)
)

// Limits on a service spec.
const (
	maxReplicas = 100
	maxDomains  = 32
	maxEnv      = 256
	maxCommand  = 64
)

// maxProgressDeadlineS bounds a service's progress_deadline_s: one day.
const maxProgressDeadlineS = 86400

// maxVolumes bounds a service's volumes.
const maxVolumes = 16

// ValidateSpec checks the shape of service name's declaration alone, before anything is read from the
// store, and normalises its domains (lower case, no trailing dot) and dns ("none" is empty).
// Errors are 422 validation_failed naming the field.
func ValidateSpec(name string, spec *client.ServiceSpec) error {
	fail := func(format string, a ...any) error {
		return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf(format, a...))
	}
	container := spec.Runtime == "containerd"
	if err := checkNoNUL(spec); err != nil {
		return fail("%s", err.Error())
	}
	if err := validateContainer(spec); err != nil {
		return fail("%s", err.Error())
	}
	if spec.Bundle == "" && !container {
		return fail("bundle is required: a digest (sha256:...) or the name of a pushed bundle")
	}
	if (len(spec.Command) == 0 && !container) || (len(spec.Command) > 0 && spec.Command[0] == "") {
		return fail("command is required, e.g. [\"./hello\"]")
	}
	if len(spec.Command) > maxCommand {
		return fail("command has more than %d arguments", maxCommand)
	}
	argv := 0
	for i, a := range spec.Command {
		n := len(a) + 1
		if n > services.MaxArgBytes {
			return fail("command argument %d is %d bytes with its NUL; one argument is at most %d bytes (Linux refuses longer ones at exec)", i, n, services.MaxArgBytes)
		}
		if argv += n; argv > services.MaxArgsBytes {
			return fail("command argument %d brings the arguments to more than %d bytes (the sum of each with a NUL)", i, services.MaxArgsBytes)
		}
	}
	if err := validateJob(spec); err != nil {
		return fail("%s", err.Error())
	}
	if spec.Replicas != nil && (*spec.Replicas < 0 || *spec.Replicas > maxReplicas) {
		return fail("replicas must be between 0 and %d", maxReplicas)
	}
	if len(spec.Volumes) > maxVolumes {
		return fail("a service has at most %d volumes", maxVolumes)
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		switch {
		case !node.ValidVolumeName(v.Name):
			return fail("volume name %q must be 1 to 63 of a-z, 0-9 and '-', starting with a letter", v.Name)
		case volumes[v.Name]:
			return fail("volume %q is named twice", v.Name)
		case v.Path != "" && (!strings.HasPrefix(v.Path, "/") || strings.Contains(v.Path, "..") || len(v.Path) > 256):
			return fail("volume %q: path %q must be an absolute path without '..'", v.Name, v.Path)
		}
		volumes[v.Name] = true
	}
	var res services.Resources
	if spec.Resources != nil {
		res = replicaResources(spec.Resources)
	}
	if err := services.ValidatePlacement(name, res, services.Scheduling(spec.Scheduling)); err != nil {
		return fail("%s", err.Error())
	}
	if err := slots.ValidateRollout(rolloutSpec(spec.Rollout), spec.PlacementMode == services.PlacementStateful); err != nil {
		var r *slots.Refusal
		if errors.As(err, &r) {
			return fail("%s", r.Detail)
		}
		return err
	}
	if d := spec.ProgressDeadlineS; d < 0 || d > maxProgressDeadlineS {
		return fail("progress_deadline_s must be between 1 and %d seconds (0 or absent: %d)", maxProgressDeadlineS, int(slots.DefaultProgressDeadline/time.Second))
	}
	switch spec.PlacementMode {
	case "", services.PlacementPortable:
		if spec.Lease != nil {
			return fail("lease is only for placement_mode %q", services.PlacementStateful)
		}
	case services.PlacementStateful:
		if spec.Replicas != nil && *spec.Replicas > 1 {
			return fail("a stateful service runs at most 1 replica (it holds one lease)")
		}
		if spec.Lease != nil {
			switch node.LeaseMode(spec.Lease.Mode) {
			case "", node.LeaseLocal:
				if spec.Lease.DurationMS != 0 {
					return fail("lease.duration_ms is only for mode %q", node.LeaseExpiring)
				}
			case node.LeaseExpiring:
				if spec.Lease.DurationMS != 0 && spec.Lease.DurationMS < node.MinLeaseDuration.Milliseconds() {
					return fail("lease.duration_ms must be at least %d", node.MinLeaseDuration.Milliseconds())
				}
			default:
				return fail("lease.mode must be %q or %q", node.LeaseLocal, node.LeaseExpiring)
			}
		}
	default:
		return fail("placement_mode must be %q or %q", services.PlacementPortable, services.PlacementStateful)
	}
	if spec.CapacityUnits < 0 || spec.CapacityUnits > 1<<20 {
		return fail("capacity_units must be between 0 and %d", 1<<20)
	}
	if len(spec.Labels) > maxEnv {
		return fail("labels has more than %d entries", maxEnv)
	}
	for k, v := range spec.Labels {
		if !labelKeyRE.MatchString(k) || len(v) > 63 {
			return fail("label %q=%q: keys are lower-case [a-z0-9_/-] (no dots), values at most 63 characters", k, v)
		}
	}
	if spec.Port < 0 || spec.Port > 65535 {
		return fail("port must be between 1 and 65535")
	}
	if len(spec.Env) > maxEnv {
		return fail("env has more than %d variables", maxEnv)
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if !envNameRE.MatchString(k) {
			return fail("env name %q is not a valid variable name", k)
		}
		if k == "PORT" || k == "HOST" || strings.HasPrefix(k, "BERTH_") {
			return fail("env name %q is reserved: the node agent sets PORT, HOST and BERTH_*", k)
		}
		n := services.EnvEntryBytes(k, spec.Env[k])
		if n > services.MaxEnvEntryBytes {
			return fail("env %q is %d bytes as KEY=VALUE with its NUL; one variable is at most %d bytes (Linux refuses longer ones at exec)", k, n, services.MaxEnvEntryBytes)
		}
		if total += n; total > services.MaxEnvBytes {
			return fail("env %q brings the environment to more than %d bytes (the sum of KEY=VALUE with a NUL for each variable)", k, services.MaxEnvBytes)
		}
	}
	if len(spec.Domains) > maxDomains {
		return fail("at most %d domains", maxDomains)
	}
	seen := map[string]bool{}
	for i, d := range spec.Domains {
		d = strings.ToLower(strings.TrimSuffix(d, "."))
		if ipLiteral(d) {
			return fail("domain %q is an IP address; a domain must be a hostname", spec.Domains[i])
		}
		if base, wild := strings.CutPrefix(d, "*."); wild {
			// A wildcard is its own name (its own route, claim and certificate) covering the
			// names one label below base; base needs two labels, as no CA signs "*.tld".
			if len(d) > 253 || !hostnameRE.MatchString(base) || !strings.Contains(base, ".") {
				return fail("domain %q is not a valid wildcard: \"*.\" then a hostname of at least two labels", spec.Domains[i])
			}
		} else if len(d) > 253 || !hostnameRE.MatchString(d) {
			return fail("domain %q is not a valid hostname (a wildcard is \"*.\" before a hostname)", spec.Domains[i])
		}
		if seen[d] {
			return fail("domain %q is listed twice", d)
		}
		seen[d] = true
		spec.Domains[i] = d
	}
	switch spec.DNS {
	case "", "none":
		spec.DNS = ""
	case services.DNSManaged:
	default:
		return fail("dns %q is not \"managed\" or \"none\"", spec.DNS)
	}
	if err := spec.Timeouts.Validate(); err != nil {
		return fail("%s", err.Error())
	}
	h := spec.HealthCheck
	if h.Path != "" && !strings.HasPrefix(h.Path, "/") {
		return fail("health_check.path must start with '/'")
	}
	if h.IntervalS < 0 || h.IntervalS > 3600 || h.TimeoutS < 0 || h.TimeoutS > 300 || h.Failures < 0 || h.Failures > 100 {
		return fail("health_check: interval_s 0..3600, timeout_s 0..300, failures 0..100")
	}
	return nil
}

// checkNoNUL refuses a NUL byte in the strings of spec the node passes to exec or to the kernel
// as C strings (command arguments, env names and values, the image reference, volume paths, the
// health-check path): exec cannot carry one, so the workload would never start. It names the
// field.
func checkNoNUL(spec *client.ServiceSpec) error {
	const nul = "\x00"
	for i, a := range spec.Command {
		if strings.Contains(a, nul) {
			return fmt.Errorf("command argument %d holds a NUL byte, which no program argument can carry", i)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if strings.Contains(k, nul) {
			return fmt.Errorf("env name %q holds a NUL byte, which no environment variable can carry", k)
		}
		if strings.Contains(spec.Env[k], nul) {
			return fmt.Errorf("env %q: the value holds a NUL byte, which no environment variable can carry", k)
		}
	}
	for _, v := range spec.Volumes {
		if strings.Contains(v.Path, nul) {
			return fmt.Errorf("volume %q: the path holds a NUL byte, which no path can carry", v.Name)
		}
	}
	if strings.Contains(spec.HealthCheck.Path, nul) {
		return errors.New("health_check.path holds a NUL byte")
	}
	for _, f := range []struct{ name, v string }{{"image", spec.Image}, {"bundle", spec.Bundle}, {"user", spec.User}} {
		if strings.Contains(f.v, nul) {
			return fmt.Errorf("%s holds a NUL byte", f.name)
		}
	}
	return nil
}

// ipLiteral reports whether d (lower case, no trailing dot) is an IP address rather than a
// hostname: an IPv4 or IPv6 literal, bracketed or not, or a name whose last label is all
// digits, which resolvers read as a shortened IPv4 address ("127.1") and which no top-level
// domain is.
func ipLiteral(d string) bool {
	bare := strings.TrimSuffix(strings.TrimPrefix(d, "["), "]")
	if _, err := netip.ParseAddr(bare); err == nil {
		return true
	}
	last := d[strings.LastIndexByte(d, '.')+1:]
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// imageDigestRE is a bare image digest.
var imageDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// tagRefRE is the OCI tag grammar.
var tagRefRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)

// splitTagRef splits "[host/]repo/name:tag" (no digest) into "[host/]repo/name" and tag; ok is
// false for anything else.
func splitTagRef(image string) (name, tag string, ok bool) {
	if strings.Contains(image, "@") || len(image) > 512 {
		return "", "", false
	}
	i, j := strings.LastIndex(image, ":"), strings.LastIndex(image, "/")
	if j <= 0 || i < j || !tagRefRE.MatchString(image[i+1:]) {
		return "", "", false
	}
	return image[:i], image[i+1:], true
}

// validateContainer checks the container fields of spec (docs/plugins.md
// section 3, "The containerd driver").
func validateContainer(spec *client.ServiceSpec) error {
	switch spec.Runtime {
	case "", "process":
		if spec.Image != "" || spec.MemoryMB != 0 || spec.CPUMillis != 0 || spec.DeployOnPush {
			return errors.New(`image, deploy_on_push, memory_mb and cpu_millis are for runtime "containerd"`)
		}
		return validateUser(spec.User)
	case "containerd":
	default:
		return errors.New(`runtime must be "process" or "containerd"`)
	}
	switch {
	case spec.DeployOnPush:
		if _, _, ok := splitTagRef(spec.Image); !ok {
			return errors.New("deploy_on_push follows a tag: image must be <project>/<repository>:<tag> (optionally after the registry host), without a digest")
		}
	case spec.Image == "":
		return errors.New(`runtime "containerd" needs an image pinned by digest: "host/repo@sha256:<hex>", or "sha256:<hex>" with the bundle holding its OCI image layout`)
	case strings.HasPrefix(spec.Image, "sha256:"):
		if !imageDigestRE.MatchString(spec.Image) {
			return errors.New("image: a digest is sha256:<64 lower-case hex>")
		}
		if spec.Bundle == "" {
			return errors.New("image is a bare digest: set bundle to the OCI image layout pushed with 'berth image push'")
		}
	default:
		_, dg, ok := strings.Cut(spec.Image, "@")
		if !ok || !imageDigestRE.MatchString(dg) || len(spec.Image) > 512 {
			return errors.New("image must be pinned by digest: host/repo@sha256:<hex>")
		}
	}
	if spec.MemoryMB < 0 || spec.MemoryMB > 1<<30 || spec.CPUMillis < 0 || spec.CPUMillis > 1<<20 {
		return errors.New("memory_mb and cpu_millis must be positive (or zero for no limit)")
	}
	return validateUser(spec.User)
}

// validateUser checks a service's user (docs/node-protocol.md section 6.7): empty, or "uid",
// "uid:gid" or a name, at most 64 characters of letters, digits, '.', '_', '-' and one ':'.
func validateUser(u string) error {
	if len(u) > 64 {
		return errors.New("user is at most 64 characters")
	}
	if u != "" && (!userRE.MatchString(u) || strings.HasPrefix(u, "-")) {
		return errors.New(`user must be "uid", "uid:gid" or a user name`)
	}
	return nil
}

var userRE = regexp.MustCompile(`^[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)?$`)

// Bounds of a job's run policy (docs/jobs.md section 7).
const (
	maxJobRetries     = 10
	maxJobKeepHistory = 1000
)

// validateJob checks the kind of spec and, for a job, its schedule and run policy
// (docs/jobs.md section 7): a job states no replicas, domains, health check path or stateful
// placement, and its job block takes a valid schedule, a known concurrency and bounded numbers.
func validateJob(spec *client.ServiceSpec) error {
	switch spec.Kind {
	case "", "service":
		if spec.Job != nil {
			return errors.New("a job block needs kind: job")
		}
		return nil
	case services.KindJob:
	default:
		return fmt.Errorf("kind %q is not service or job", spec.Kind)
	}
	switch {
	case spec.Replicas != nil:
		return errors.New("a job has no replicas: each run is placed on its own (leave replicas out)")
	case len(spec.Domains) > 0:
		return errors.New("a job serves no domains")
	case spec.HealthCheck.Path != "":
		return errors.New("a job has no health check: it runs to completion")
	case spec.PlacementMode == services.PlacementStateful:
		return errors.New("a job cannot be stateful")
	}
	j := spec.Job
	if j == nil {
		return nil
	}
	if j.Schedule != "" {
		if err := (jobs.Schedule{Cron: j.Schedule, TimeZone: j.TimeZone}).Validate(); err != nil {
			return err
		}
	} else if j.TimeZone != "" {
		return errors.New("time_zone needs a schedule")
	}
	switch j.Concurrency {
	case "", services.ConcurrencyForbid, services.ConcurrencyReplace, services.ConcurrencyAllow:
	default:
		return fmt.Errorf("concurrency %q is not forbid, replace or allow", j.Concurrency)
	}
	switch {
	case j.TimeoutS < 0:
		return errors.New("timeout_s must not be negative (0: no timeout)")
	case j.Retries < 0 || j.Retries > maxJobRetries:
		return fmt.Errorf("retries must be between 0 and %d", maxJobRetries)
	case j.StartingDeadlineS < 0:
		return errors.New("starting_deadline_s must not be negative (0: the default, 300)")
	case j.KeepHistory < 0 || j.KeepHistory > maxJobKeepHistory:
		return fmt.Errorf("keep_history must be between 0 and %d (0: the default, 20)", maxJobKeepHistory)
	}
	return nil
}

// jobSettings returns the stored run policy of a job declared with spec, defaults written out,
// keeping cur's suspension (an apply does not resume a suspended job); nil for a service.
func jobSettings(spec *client.ServiceSpec, cur *services.Service) *services.JobSettings {
	if spec.Kind != services.KindJob {
		return nil
	}
	j := spec.Job
	if j == nil {
		j = &client.JobSpec{}
	}
	out := &services.JobSettings{Schedule: j.Schedule, TimeZone: j.TimeZone, Concurrency: j.Concurrency, TimeoutS: j.TimeoutS,
		Retries: j.Retries, StartingDeadlineS: j.StartingDeadlineS, KeepHistory: j.KeepHistory}
	if out.Concurrency == "" {
		out.Concurrency = services.ConcurrencyForbid
	}
	if out.StartingDeadlineS == 0 {
		out.StartingDeadlineS = DefaultStartingDeadlineS
	}
	if out.KeepHistory == 0 {
		out.KeepHistory = DefaultKeepHistory
	}
	if cur != nil && cur.Job != nil {
		out.Suspended = cur.Job.Suspended
	}
	return out
}

// Defaults of a job's run policy (docs/jobs.md section 7).
const (
	DefaultStartingDeadlineS = 300
	DefaultKeepHistory       = 20
)
