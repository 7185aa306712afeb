package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Job is one job as GET /api/v1/projects/{p}/jobs lists it (docs/jobs.md section 7).
type Job struct {
	Name        string  `json:"name"`
	Revision    int64   `json:"revision"`
	Schedule    string  `json:"schedule,omitempty"`
	TimeZone    string  `json:"time_zone,omitempty"`
	Concurrency string  `json:"concurrency"`
	TimeoutS    int     `json:"timeout_s,omitempty"`
	Retries     int     `json:"retries,omitempty"`
	Suspended   bool    `json:"suspended,omitempty"`
	LastRun     *JobRun `json:"last_run,omitempty"`
}

// JobRun is one run of a job (docs/jobs.md sections 4 to 7). ID is "<project>/<job>@<instant>";
// State is pending, running, succeeded, failed, timed_out, missed or cancelled.
type JobRun struct {
	ID         string    `json:"id"`
	Job        string    `json:"job"`
	FireTime   time.Time `json:"fire_time"`
	State      string    `json:"state"`
	Trigger    string    `json:"trigger,omitempty"`
	WorkloadID string    `json:"workload_id,omitempty"`
	NodeID     string    `json:"node_id,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	EndedAt    time.Time `json:"ended_at,omitzero"`
	DurationS  float64   `json:"duration_s,omitempty"`
	Attempts   int       `json:"attempts,omitempty"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Signal     int       `json:"signal,omitempty"`
	OutputTail string    `json:"output_tail,omitempty"`
	Message    string    `json:"message,omitempty"`
	// Command and TimeoutS are a one-off run's (trigger "command", berth run); RequestedBy
	// names who started a manual or one-off run.
	Command     []string `json:"command,omitempty"`
	TimeoutS    int      `json:"timeout_s,omitempty"`
	RequestedBy string   `json:"requested_by,omitempty"`
}

// Name is the run's id without its project: "<job>@<instant>", what the run routes take.
func (r JobRun) Name() string {
	for i := range len(r.ID) {
		if r.ID[i] == '/' {
			return r.ID[i+1:]
		}
	}
	return r.ID
}

// Final reports whether the run ended (it never changes again).
func (r JobRun) Final() bool { return r.State != "pending" && r.State != "running" }

func jobPath(project, name string) string {
	return "/projects/" + pathEscape(project) + "/jobs/" + pathEscape(name)
}

func runPath(project, run string) string {
	return "/projects/" + pathEscape(project) + "/job-runs/" + pathEscape(run)
}

// Jobs lists the jobs of project.
func (c *Client) Jobs(ctx context.Context, project string) ([]Job, error) {
	var out struct {
		Jobs []Job `json:"jobs"`
	}
	err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/jobs", nil, nil, "", true, &out)
	return out.Jobs, err
}

// PlatformPass is one pass of a platform task (docs/jobs.md section 10).
type PlatformPass struct {
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	Result    string    `json:"result"` // succeeded | failed
	Message   string    `json:"message,omitempty"`
}

// PlatformJob is berthd's own periodic work (registry.gc, idempotency.expiry,
// backups.schedule) with its last pass and the passes kept before it, newest last.
type PlatformJob struct {
	Name     string         `json:"name"`
	EveryS   int64          `json:"every_s"` // its usual period, seconds
	Passes   int64          `json:"passes"`
	Failures int64          `json:"failures"`
	Last     *PlatformPass  `json:"last,omitempty"`
	History  []PlatformPass `json:"history"`
}

// PlatformJobs lists the platform tasks (GET /api/v1/platform-jobs, scope nodes:read).
func (c *Client) PlatformJobs(ctx context.Context) ([]PlatformJob, error) {
	var out struct {
		Jobs []PlatformJob `json:"platform_jobs"`
	}
	err := c.do(ctx, http.MethodGet, "/platform-jobs", nil, nil, "", true, &out)
	return out.Jobs, err
}

// JobRuns lists the runs of job name, oldest first.
func (c *Client) JobRuns(ctx context.Context, project, name string) ([]JobRun, error) {
	var out struct {
		Runs []JobRun `json:"runs"`
	}
	err := c.do(ctx, http.MethodGet, jobPath(project, name)+"/runs", nil, nil, "", true, &out)
	return out.Runs, err
}

// RunJob starts a manual run of job name now and returns it.
func (c *Client) RunJob(ctx context.Context, project, name string) (*JobRun, error) {
	var out JobRun
	if err := c.do(ctx, http.MethodPost, jobPath(project, name)+"/run", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SuspendJob holds (suspend true) or continues job name's schedule.
func (c *Client) SuspendJob(ctx context.Context, project, name string, suspend bool) error {
	action := "/resume"
	if suspend {
		action = "/suspend"
	}
	return c.do(ctx, http.MethodPost, jobPath(project, name)+action, nil, nil, "", true, nil)
}

// GetJobRun reads run ("<job>@<instant>") of project.
func (c *Client) GetJobRun(ctx context.Context, project, run string) (*JobRun, error) {
	var out JobRun
	if err := c.do(ctx, http.MethodGet, runPath(project, run), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelJobRun stops a live run and records it cancelled; an ended run is returned as it is.
func (c *Client) CancelJobRun(ctx context.Context, project, run string) (*JobRun, error) {
	var out JobRun
	if err := c.do(ctx, http.MethodPost, runPath(project, run)+"/cancel", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RunCommand starts a one-off run of command in the environment of service (or job) name:
// its release, env, secrets, bindings and node constraints (docs/jobs.md section 9). timeoutS
// bounds it (0: no bound). It returns the run, placed when a node fits; its output is read
// with [Client.JobRunLogs] and [Client.FollowJobRunLogs]. Errors carry the API's code:
// policy_denied, secret_use_forbidden, validation_failed.
func (c *Client) RunCommand(ctx context.Context, project, name string, command []string, timeoutS int) (*JobRun, error) {
	body := map[string]any{"command": command, "timeout_s": timeoutS}
	var out JobRun
	if err := c.doJSON(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/services/"+pathEscape(name)+"/run", body, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// JobRunLogs reads the output of run ("<job>@<instant>") from its node: the newest lines, at
// most tail (0: as many as fit one answer), with their sequence numbers. Errors carry the
// API's code: unavailable while the run is not placed or its node is away, not_found for a run
// that never ran.
func (c *Client) JobRunLogs(ctx context.Context, project, run string, tail int) (*WorkloadLogs, error) {
	q := url.Values{}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	var out WorkloadLogs
	if err := c.do(ctx, http.MethodGet, runPath(project, run)+"/logs", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FollowJobRunLogs streams the output of run as [Client.FollowWorkloadLogs] does: the newest
// tail lines (0: 100), then new lines as they come, until ctx ends or the stream ends.
func (c *Client) FollowJobRunLogs(ctx context.Context, project, run string, tail int, fn func(node.LogLine) error) error {
	return c.followLogs(ctx, runPath(project, run)+"/logs", url.Values{}, tail, fn)
}
