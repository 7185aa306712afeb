package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/berthhq/berth/sdk/client"
)

// tlsFile is a service's tls block: {mode: acme} or {mode: manual, secret: NAME}
// (docs/certificates.md section 1).
type tlsFile struct {
	Mode   string `json:"mode,omitempty" yaml:"mode"`
	Secret string `json:"secret,omitempty" yaml:"secret"`
}

// serviceFile is one service in a file given to "berth apply".
type serviceFile struct {
	Name    string            `json:"name" yaml:"name"`
	Project string            `json:"project,omitempty" yaml:"project"`
	Bundle  string            `json:"bundle" yaml:"bundle"`
	Command []string          `json:"command" yaml:"command"`
	Env     map[string]string `json:"env,omitempty" yaml:"env"`
	// Secrets and SecretSets reference the project's secrets (docs/api.md section 10.2).
	Secrets          map[string]secretRefFile `json:"secrets,omitempty" yaml:"secrets"`
	SecretSets       []string                 `json:"secret_sets,omitempty" yaml:"secret_sets"`
	Port             int                      `json:"port,omitempty" yaml:"port"`
	Domains          []string                 `json:"domains,omitempty" yaml:"domains"`
	DNS              string                   `json:"dns,omitempty" yaml:"dns"`
	Replicas         *int                     `json:"replicas,omitempty" yaml:"replicas"`
	HealthCheck      healthCheckFile          `json:"health_check" yaml:"health_check"`
	Timeouts         timeoutsFile             `json:"timeouts,omitzero" yaml:"timeouts"`
	TLS              tlsFile                  `json:"tls,omitzero" yaml:"tls"`
	Stream           bool                     `json:"stream,omitempty" yaml:"stream"`
	ExpectedRevision *int64                   `json:"expected_revision,omitempty" yaml:"expected_revision"`

	// The rollout fields (docs/reconciliation.md section 7.2).
	ProgressDeadlineS int  `json:"progress_deadline_s,omitempty" yaml:"progress_deadline_s"`
	AutoRollback      bool `json:"auto_rollback,omitempty" yaml:"auto_rollback"`
	// Rollout bounds how many replicas a rollout moves at once.
	Rollout *rolloutFile `json:"rollout,omitempty" yaml:"rollout"`

	// Bindings are the service's databases and buckets (docs/bindings.md); Backup schedules,
	// keeps and drills their backups (docs/backups.md section 4.3).
	Bindings []client.BindingSpec `json:"bindings,omitempty" yaml:"bindings"`
	Backup   *client.BackupSpec   `json:"backup,omitempty" yaml:"backup"`

	// DeployOnPush makes an image service follow its tag (docs/registry.md).
	DeployOnPush bool `json:"deploy_on_push,omitempty" yaml:"deploy_on_push"`

	// Volumes are the service's persistent directories (docs/node-protocol.md section 6.7).
	Volumes []client.Volume `json:"volumes,omitempty" yaml:"volumes"`

	// The stateful fields (docs/api.md "Leases").
	PlacementMode string     `json:"placement_mode,omitempty" yaml:"placement_mode"`
	Lease         *leaseFile `json:"lease,omitempty" yaml:"lease"`

	// The placement fields (docs/placement.md): what one replica reserves, where the replicas
	// may run and how they spread. CapacityUnits sizes a replica when Resources is absent.
	Resources     *resourcesFile    `json:"resources,omitempty" yaml:"resources"`
	CapacityUnits int               `json:"capacity_units,omitempty" yaml:"capacity_units"`
	NodeSelector  map[string]string `json:"node_selector,omitempty" yaml:"node_selector"`
	Region        string            `json:"region,omitempty" yaml:"region"`
	SpreadBy      string            `json:"spread_by,omitempty" yaml:"spread_by"`
	MaxPerNode    int               `json:"max_per_node,omitempty" yaml:"max_per_node"`
	AntiAffinity  []string          `json:"anti_affinity,omitempty" yaml:"anti_affinity"`
	Preferences   map[string]string `json:"preferences,omitempty" yaml:"preferences"`

	// The job fields (docs/jobs.md section 7): kind job runs to completion, once per fire time
	// of schedule or when asked.
	Kind              string `json:"kind,omitempty" yaml:"kind"`
	Schedule          string `json:"schedule,omitempty" yaml:"schedule"`
	TimeZone          string `json:"time_zone,omitempty" yaml:"time_zone"`
	Concurrency       string `json:"concurrency,omitempty" yaml:"concurrency"`
	TimeoutS          int    `json:"timeout_s,omitempty" yaml:"timeout_s"`
	Retries           int    `json:"retries,omitempty" yaml:"retries"`
	StartingDeadlineS int    `json:"starting_deadline_s,omitempty" yaml:"starting_deadline_s"`
	KeepHistory       int    `json:"keep_history,omitempty" yaml:"keep_history"`

	// The container fields (docs/plugins.md section 3).
	Runtime   string `json:"runtime,omitempty" yaml:"runtime"`
	Image     string `json:"image,omitempty" yaml:"image"`
	User      string `json:"user,omitempty" yaml:"user"`
	MemoryMB  int64  `json:"memory_mb,omitempty" yaml:"memory_mb"`
	CPUMillis int64  `json:"cpu_millis,omitempty" yaml:"cpu_millis"`
}

// secretRefFile is one entry of a serviceFile's secrets: a secret's name, or
// {secret, version, as}.
type secretRefFile struct{ client.SecretRef }

// UnmarshalYAML accepts a scalar (the name) or a mapping with only secret, version and as.
func (r *secretRefFile) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		r.SecretRef = client.SecretRef{Secret: n.Value}
		return nil
	}
	var m struct {
		Secret  string `yaml:"secret"`
		Version int    `yaml:"version"`
		As      string `yaml:"as"`
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a secret reference is a name or {secret, version, as}", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch k := n.Content[i].Value; k {
		case "secret", "version", "as":
		default:
			return fmt.Errorf("line %d: unknown field %q in a secret reference (want secret, version, as)", n.Content[i].Line, k)
		}
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	r.SecretRef = client.SecretRef{Secret: m.Secret, Version: m.Version, As: m.As}
	return nil
}

// rolloutFile is the rollout block of a serviceFile (docs/reconciliation.md section 5.2).
type rolloutFile struct {
	MaxSurge       *boundFile `json:"max_surge,omitempty" yaml:"max_surge"`
	MaxUnavailable *boundFile `json:"max_unavailable,omitempty" yaml:"max_unavailable"`
}

// boundFile is one rollout bound: a number of replicas (3) or a percentage ("25%"), in YAML
// and JSON alike.
type boundFile struct{ client.IntOrPercent }

// UnmarshalYAML reads 3, "3" or "25%".
func (b *boundFile) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a rollout bound is a number of replicas or a percentage such as 25%%", n.Line)
	}
	v, err := client.ParseIntOrPercent(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	b.IntOrPercent = v
	return nil
}

// spec returns the API's rollout block; nil for none.
func (r *rolloutFile) spec() *client.RolloutSpec {
	if r == nil {
		return nil
	}
	bound := func(b *boundFile) *client.IntOrPercent {
		if b == nil {
			return nil
		}
		v := b.IntOrPercent
		return &v
	}
	return &client.RolloutSpec{MaxSurge: bound(r.MaxSurge), MaxUnavailable: bound(r.MaxUnavailable)}
}

// resourcesFile is the resources block of a serviceFile (docs/placement.md section 4).
type resourcesFile struct {
	CPUMilli  int64            `json:"cpu_m,omitempty" yaml:"cpu_m"`
	MemoryMiB int64            `json:"memory_mib,omitempty" yaml:"memory_mib"`
	Extended  map[string]int64 `json:"extended,omitempty" yaml:"extended"`
}

// leaseFile is the lease block of a stateful serviceFile.
type leaseFile struct {
	Mode       string `json:"mode,omitempty" yaml:"mode"`
	DurationMS int64  `json:"duration_ms,omitempty" yaml:"duration_ms"`
}

// timeoutsFile is the timeouts block of a serviceFile (docs/plugins.md section 5.4).
type timeoutsFile struct {
	ConnectMS        int64 `json:"connect_ms,omitempty" yaml:"connect_ms"`
	ResponseHeaderMS int64 `json:"response_header_ms,omitempty" yaml:"response_header_ms"`
	IdleMS           int64 `json:"idle_ms,omitempty" yaml:"idle_ms"`
}

// healthCheckFile is the health_check block of a serviceFile.
type healthCheckFile struct {
	Path      string `json:"path,omitempty" yaml:"path"`
	IntervalS int    `json:"interval_s,omitempty" yaml:"interval_s"`
	TimeoutS  int    `json:"timeout_s,omitempty" yaml:"timeout_s"`
	Failures  int    `json:"failures,omitempty" yaml:"failures"`
}

func (f serviceFile) spec() client.ServiceSpec {
	var lease *client.LeaseSpec
	if f.Lease != nil {
		lease = &client.LeaseSpec{Mode: f.Lease.Mode, DurationMS: f.Lease.DurationMS}
	}
	var refs map[string]client.SecretRef
	if len(f.Secrets) > 0 {
		refs = map[string]client.SecretRef{}
		for k, r := range f.Secrets {
			refs[k] = r.SecretRef
		}
	}
	var res *client.Resources
	if f.Resources != nil {
		res = &client.Resources{CPUMilli: f.Resources.CPUMilli, MemoryMiB: f.Resources.MemoryMiB, Extended: f.Resources.Extended}
	}
	var job *client.JobSpec
	if f.Kind == "job" || f.Schedule != "" || f.TimeZone != "" || f.Concurrency != "" || f.TimeoutS != 0 || f.Retries != 0 ||
		f.StartingDeadlineS != 0 || f.KeepHistory != 0 {
		// A job field without kind: job reaches the server, which says what is wrong.
		job = &client.JobSpec{Schedule: f.Schedule, TimeZone: f.TimeZone, Concurrency: f.Concurrency, TimeoutS: f.TimeoutS,
			Retries: f.Retries, StartingDeadlineS: f.StartingDeadlineS, KeepHistory: f.KeepHistory}
	}
	return client.ServiceSpec{
		Kind:          f.Kind,
		Job:           job,
		Resources:     res,
		CapacityUnits: f.CapacityUnits,
		Scheduling: client.Scheduling{NodeSelector: f.NodeSelector, Region: f.Region, SpreadBy: f.SpreadBy,
			MaxPerNode: f.MaxPerNode, AntiAffinity: f.AntiAffinity, Preferences: f.Preferences},
		Secrets:    refs,
		SecretSets: f.SecretSets,
		Lease:      lease,
		Bundle:     f.Bundle,
		Command:    f.Command,
		Env:        f.Env,
		Port:       f.Port,
		Domains:    f.Domains,
		DNS:        f.DNS,
		Replicas:   f.Replicas,
		HealthCheck: client.HealthCheck{
			Path:      f.HealthCheck.Path,
			IntervalS: f.HealthCheck.IntervalS,
			TimeoutS:  f.HealthCheck.TimeoutS,
			Failures:  f.HealthCheck.Failures,
		},
		Timeouts: client.Timeouts{ConnectMS: f.Timeouts.ConnectMS, ResponseHeaderMS: f.Timeouts.ResponseHeaderMS,
			IdleMS: f.Timeouts.IdleMS},
		TLS:               client.TLS{Mode: f.TLS.Mode, Secret: f.TLS.Secret},
		Stream:            f.Stream,
		Bindings:          f.Bindings,
		Backup:            f.Backup,
		ExpectedRevision:  f.ExpectedRevision,
		PlacementMode:     f.PlacementMode,
		ProgressDeadlineS: f.ProgressDeadlineS,
		AutoRollback:      f.AutoRollback,
		Rollout:           f.Rollout.spec(),
		Volumes:           f.Volumes,
		Container: client.Container{Runtime: f.Runtime, Image: f.Image, User: f.User, DeployOnPush: f.DeployOnPush,
			MemoryMB: f.MemoryMB, CPUMillis: f.CPUMillis},
	}
}

func newApplyCmd(a *app) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update services from a YAML or JSON file",
		Long: `apply creates or replaces each service described in FILE ("-" reads stdin).
FILE is YAML (several documents separated by "---" are several services) or
JSON (one object, several objects in a row, or an array). Fields:

  name               service name (required)
  project            project; default --project / BERTH_PROJECT / config
  bundle             bundle digest ("sha256:...") or the name it was pushed with
  command            argument list, e.g. ["./server", "--port", "8080"]
  env                map of environment variables
  secrets            map of environment variables to secrets of the project:
                     NAME: secret, or NAME: {secret, version, as: env|file};
                     values never appear in the file (berth secret set)
  secret_sets        list of secret sets whose entries the service receives
  port               the app's port in runtimes with their own network (default
                     8080); process workloads always get a free port in $PORT
  domains            list of domains routed to the service
  replicas           number of replicas
  health_check       {path, interval_s, timeout_s, failures}
  timeouts           gateway timeouts in ms {connect_ms, response_header_ms,
                     idle_ms}; defaults 5000, 60000, 90000
  stream             true: the gateway sends each write of a response on at once
                     (server-sent events, long polls) instead of buffering
  expected_revision  apply only if the stored revision is this (0: must not exist)
  progress_deadline_s
                     seconds a rollout may go without progress before it is
                     failed as refused(progress-deadline) (default 600)
  auto_rollback      true: a failed rollout restores the previous release
  rollout            {max_surge, max_unavailable}: how many replicas a rollout
                     may run above replicas (default 1) and leave not ready
                     (default 0); each a number or a percentage such as "25%"
  volumes            [{name: data, path: /data}]: persistent directories kept
                     across rollouts and agent restarts on the node that runs
                     the service; a process workload finds each in
                     $BERTH_VOLUME_<NAME> (HOME is the first one)
  placement_mode     "portable" (default) or "stateful": at most one replica, run
                     on one node at a time under a lease with a fencing token
  lease              stateful: {mode: local|expiring, duration_ms: >= 3000}
  runtime            "process" (default) or "containerd"
  image              containerd: an image pinned by digest, "host/repo@sha256:..."
                     or "sha256:..." of the OCI image layout in bundle
                     ('berth image push'); command may then be left out
  user               who each replica runs as: "uid", "uid:gid" or a user name
                     (of the node for process workloads, default berth-workload
                     when the agent runs as root; of the image for containerd)
  memory_mb, cpu_millis
                     containerd: the memory limit (MiB) and CPU limit
                     (thousandths of a CPU) of each replica

A job (kind: job) runs to completion instead of being kept running
(docs/jobs.md); it takes the fields above but replicas, domains and
health_check, plus:
  kind               "service" (default) or "job"
  schedule           cron ("30 2 * * *"), a descriptor ("@daily") or
                     "@every 2s"; absent: the job runs only when asked
                     ('berth job run')
  time_zone          IANA zone the schedule is read in (default UTC)
  concurrency        forbid (default: a fire time while a run is live is
                     recorded missed), replace (the live run is stopped
                     first) or allow
  timeout_s          seconds an attempt may run before it is stopped and
                     recorded timed_out (default: no bound)
  retries            attempts after a failed one, with the slot backoff (0-10)
  starting_deadline_s
                     how late a fire time may still start (default 300)
  keep_history       ended runs kept (default 20)

An unknown field is an error.`,
		Example: `  berth apply -f hello.yaml

  # hello.yaml
  name: hello
  bundle: hello
  command: ["./server"]         # must listen on $HOST:$PORT
  domains: [hello.example.com]
  replicas: 2
  health_check: {path: /healthz}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, done, err := a.openInput("apply", file)
			if err != nil {
				return err
			}
			defer done()
			docs, err := parseServiceFiles(r, file)
			if err != nil {
				return err
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			explicit := cmd.Flags().Changed("project")
			var applied []client.Service
			for _, d := range docs {
				project := s.Project
				if d.Project != "" {
					if explicit && d.Project != s.Project {
						return fmt.Errorf("apply %s: the file names project %q but --project is %q", d.Name, d.Project, s.Project)
					}
					project = d.Project
				}
				svc, err := c.ApplyService(cmd.Context(), project, d.Name, d.spec())
				if err != nil {
					return fmt.Errorf("apply service %s/%s: %w", project, d.Name, err)
				}
				for _, w := range svc.PolicyWarnings {
					fmt.Fprintf(a.stderr, "warning: %s/%s: %s\n", project, d.Name, w)
				}
				applied = append(applied, *svc)
				if a.output == outputTable {
					verb := "applied"
					if svc.Changed != nil && !*svc.Changed {
						verb = "unchanged" // the server already held exactly this; nothing was written
					}
					kind := "service"
					if svc.Kind == "job" {
						kind = "job"
					}
					fmt.Fprintf(a.stdout, "%s %s/%s %s (revision %d)\n", kind, project, d.Name, verb, svc.Revision)
				}
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, applied)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", `file to apply, YAML or JSON ("-" for stdin)`)
	return cmd
}

// parseServiceFiles reads every service of a YAML or JSON file. name is the
// file name, used to choose the format (".json") and in errors.
// openInput opens the -f FILE of command cmd: standard input for "-", and an error naming the
// flag when file is empty. done closes what was opened.
func (a *app) openInput(cmd, file string) (r io.Reader, done func(), err error) {
	if file == "" {
		return nil, nil, fmt.Errorf("%s: -f FILE is required", cmd)
	}
	if file == "-" {
		return a.stdin, func() {}, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return f, func() { _ = f.Close() }, nil
}

func parseServiceFiles(r io.Reader, name string) ([]serviceFile, error) {
	br := bufio.NewReader(r)
	isJSON := strings.HasSuffix(name, ".json")
	if !isJSON && !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") {
		isJSON = startsJSON(br)
	}
	var docs []serviceFile
	var err error
	if isJSON {
		docs, err = parseJSON(br)
	} else {
		docs, err = parseYAML(br)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("parse %s: no service in the file", name)
	}
	for i, d := range docs {
		if d.Name == "" {
			return nil, fmt.Errorf("parse %s: service %d: name is required", name, i+1)
		}
	}
	return docs, nil
}

// startsJSON reports whether the first non-space byte of br opens a JSON
// object or array.
func startsJSON(br *bufio.Reader) bool {
	for n := 1; ; n++ {
		b, err := br.Peek(n)
		if err != nil || len(b) < n {
			return false
		}
		switch c := b[n-1]; c {
		case ' ', '\t', '\r', '\n':
			continue
		default:
			return c == '{' || c == '['
		}
	}
}

func parseJSON(r *bufio.Reader) ([]serviceFile, error) {
	var docs []serviceFile
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return nil, err
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && raw[0] == '[' {
			var list []serviceFile
			if err := strictJSON(raw, &list); err != nil {
				return nil, err
			}
			docs = append(docs, list...)
			continue
		}
		var d serviceFile
		if err := strictJSON(raw, &d); err != nil {
			return nil, fmt.Errorf("service %d: %w", len(docs)+1, err)
		}
		docs = append(docs, d)
	}
}

func strictJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func parseYAML(r io.Reader) ([]serviceFile, error) {
	// yaml.v3 names an unknown field "field x not found in type main.serviceFile".
	unknownField := regexp.MustCompile(`field (\S+) not found in type \S+`)
	var docs []serviceFile
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	for n := 1; ; n++ {
		var d serviceFile
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			msg := unknownField.ReplaceAllString(fixParserLine(err.Error()), `unknown field "$1"`)
			msg = strings.Join(strings.Fields(strings.TrimPrefix(msg, "yaml: unmarshal errors:")), " ")
			return nil, &docError{msg: fmt.Sprintf("document %d: %s", n, msg), err: err}
		}
		if reflect.ValueOf(d).IsZero() {
			continue // an empty document, as a leading or trailing "---" makes
		}
		docs = append(docs, d)
	}
}

// yamlParserProblems are the problems yaml.v3's parser (not its scanner) reports. For these it
// names the 0-based line of the mark (scanner errors it counts from 1), so "line 4" is the fifth
// line of the file: [fixParserLine] adds the one.
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'": true, "did not find expected ',' or '}'": true,
	"did not find expected '-' indicator": true, "did not find expected <document start>": true,
	"did not find expected <stream-start>": true, "did not find expected key": true,
	"did not find expected node content": true, "found duplicate %TAG directive": true,
	"found duplicate %YAML directive": true, "found incompatible YAML document": true,
	"found undefined tag handle": true,
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// fixParserLine returns msg with the line of a yaml.v3 parser error counted from 1, as every
// other line in the CLI's messages is; any other message is returned as it is.
func fixParserLine(msg string) string {
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil || !yamlParserProblems[m[2]] {
		return msg
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return msg
	}
	return "yaml: line " + strconv.Itoa(n+1) + ": " + m[2]
}

// docError rewords a decoder's error for people and keeps it for errors.Is.
type docError struct {
	msg string
	err error
}

func (e *docError) Error() string { return e.msg }
func (e *docError) Unwrap() error { return e.err }
